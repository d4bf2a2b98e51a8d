"""Sans-I/O BEEP (RFC 3080 core, RFC 3081 TCP mapping): bytes in -> events out, commands -> bytes.

No socket, no event loop: `BeepConnection.receive_data()` takes the bytes a transport read and
returns events; commands (`send_greeting`, `start_channel`, `send_msg`, ...) queue bytes that
`data_to_send()` hands back for the transport to write. Layers, bottom up: `_frames` (bytes <->
frames), `_window` (SEQ flow control), `_mime` (entity headers), `_management` (channel-zero XML),
`_channel` and `_session` (state machines), `_connection` (the facade). Beside them, the tuning
profiles (RFC 3080 §3, §4): `_tuning_xml` (ready/proceed/blob), `_sasl` and `_scram` (SASL
mechanisms as pure objects), `_tuning_state` (the TLS and authentication tables) and `_tuning`
(`Tuning`, composed over a connection). Everything in `__all__` is public; the modules themselves
are private.
"""

from __future__ import annotations

from ._config import (
    DEFAULT_MAX_ANSWERS_IN_PROGRESS,
    DEFAULT_MAX_CHANNELS,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MANAGEMENT_MESSAGE_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_PENDING_MESSAGES,
    DEFAULT_WINDOW_SIZE,
    BeepConfig,
    Role,
)
from ._connection import BeepConnection
from ._errors import BeepProtocolError, LocalProtocolError, RemoteProtocolError
from ._events import (
    AnswerReceived,
    AnswersComplete,
    ChannelClosed,
    ChannelStarted,
    ChannelStartRefused,
    ChannelStartRequested,
    CloseRefused,
    CloseRequested,
    ErrorReplyReceived,
    Event,
    GreetingReceived,
    GreetingRefused,
    MessageReceived,
    MessageRefused,
    ProtocolViolation,
    ReplyReceived,
    SaslAuthenticated,
    SaslFailed,
    SessionClosed,
    TlsProceed,
    TlsRefused,
    TlsRequested,
)
from ._frames import Frame, FrameDecoder, FrameType, SeqFrame, encode_frame, encode_seq
from ._management import Profile, ProfileEncoding
from ._mime import BEEP_XML, DEFAULT_CONTENT_TYPE, DEFAULT_TRANSFER_ENCODING
from ._sasl import (
    AnonymousClient,
    AnonymousServer,
    Challenge,
    ClientMechanism,
    PasswordVerifier,
    PlainClient,
    PlainServer,
    ServerMechanism,
    Success,
    parse_plain,
    saslprep,
)
from ._scram import (
    DEFAULT_ITERATIONS,
    ScramClient,
    ScramCredentials,
    ScramServer,
    ScramUsers,
    Users,
    Verifier,
    password_verifier,
)
from ._session import SessionState
from ._tuning import DEFAULT_MAX_AUTH_FAILURES, MECHANISMS, Tuning, TuningPolicy
from ._tuning_state import AuthState, TlsState
from ._tuning_xml import (
    SASL_PROFILE_PREFIX,
    TLS_PROFILE,
    Blob,
    BlobStatus,
    Proceed,
    Ready,
    parse_tuning,
    serialize_tuning,
)

__all__ = [
    "BEEP_XML",
    "DEFAULT_CONTENT_TYPE",
    "DEFAULT_ITERATIONS",
    "DEFAULT_MAX_ANSWERS_IN_PROGRESS",
    "DEFAULT_MAX_AUTH_FAILURES",
    "DEFAULT_MAX_CHANNELS",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_MANAGEMENT_MESSAGE_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_PENDING_MESSAGES",
    "DEFAULT_TRANSFER_ENCODING",
    "DEFAULT_WINDOW_SIZE",
    "MECHANISMS",
    "SASL_PROFILE_PREFIX",
    "TLS_PROFILE",
    "AnonymousClient",
    "AnonymousServer",
    "AnswerReceived",
    "AnswersComplete",
    "AuthState",
    "BeepConfig",
    "BeepConnection",
    "BeepProtocolError",
    "Blob",
    "BlobStatus",
    "Challenge",
    "ChannelClosed",
    "ChannelStartRefused",
    "ChannelStartRequested",
    "ChannelStarted",
    "ClientMechanism",
    "CloseRefused",
    "CloseRequested",
    "ErrorReplyReceived",
    "Event",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "GreetingReceived",
    "GreetingRefused",
    "LocalProtocolError",
    "MessageReceived",
    "MessageRefused",
    "PasswordVerifier",
    "PlainClient",
    "PlainServer",
    "Proceed",
    "Profile",
    "ProfileEncoding",
    "ProtocolViolation",
    "Ready",
    "RemoteProtocolError",
    "ReplyReceived",
    "Role",
    "SaslAuthenticated",
    "SaslFailed",
    "ScramClient",
    "ScramCredentials",
    "ScramServer",
    "ScramUsers",
    "SeqFrame",
    "ServerMechanism",
    "SessionClosed",
    "SessionState",
    "Success",
    "TlsProceed",
    "TlsRefused",
    "TlsRequested",
    "TlsState",
    "Tuning",
    "TuningPolicy",
    "Users",
    "Verifier",
    "encode_frame",
    "encode_seq",
    "parse_plain",
    "parse_tuning",
    "password_verifier",
    "saslprep",
    "serialize_tuning",
]
