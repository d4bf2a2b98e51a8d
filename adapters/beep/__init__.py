"""Sans-I/O BEEP (RFC 3080 core, RFC 3081 TCP mapping): bytes in -> events out, commands -> bytes.

No socket, no event loop: `BeepConnection.receive_data()` takes the bytes a transport read and
returns events; commands (`send_greeting`, `start_channel`, `send_msg`, ...) queue bytes that
`data_to_send()` hands back for the transport to write. Layers, bottom up: `_frames` (bytes <->
frames), `_window` (SEQ flow control), `_mime` (entity headers), `_management` (channel-zero XML),
`_channel` and `_session` (state machines), `_connection` (the facade). Everything in `__all__`
is public; the modules themselves are private.
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
    ProtocolViolation,
    ReplyReceived,
    SessionClosed,
)
from ._frames import Frame, FrameDecoder, FrameType, SeqFrame, encode_frame, encode_seq
from ._management import Profile, ProfileEncoding
from ._mime import BEEP_XML, DEFAULT_CONTENT_TYPE, DEFAULT_TRANSFER_ENCODING
from ._session import SessionState

__all__ = [
    "BEEP_XML",
    "DEFAULT_CONTENT_TYPE",
    "DEFAULT_MAX_ANSWERS_IN_PROGRESS",
    "DEFAULT_MAX_CHANNELS",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_MANAGEMENT_MESSAGE_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_PENDING_MESSAGES",
    "DEFAULT_TRANSFER_ENCODING",
    "DEFAULT_WINDOW_SIZE",
    "AnswerReceived",
    "AnswersComplete",
    "BeepConfig",
    "BeepConnection",
    "BeepProtocolError",
    "ChannelClosed",
    "ChannelStartRefused",
    "ChannelStartRequested",
    "ChannelStarted",
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
    "Profile",
    "ProfileEncoding",
    "ProtocolViolation",
    "RemoteProtocolError",
    "ReplyReceived",
    "Role",
    "SeqFrame",
    "SessionClosed",
    "SessionState",
    "encode_frame",
    "encode_seq",
]
