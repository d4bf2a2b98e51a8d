"""Roles and the one frozen configuration object of a BEEP connection, with its documented limits.

Every limit below exists to bound the memory a misbehaving or hostile peer can make us hold (the
h11/h2 practice: `DEFAULT_MAX_INCOMPLETE_EVENT_SIZE`, `CONTINUATION_BACKLOG`). Each `DEFAULT_*`
constant says why it has the value it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from common.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_ANSWERS_IN_PROGRESS",
    "DEFAULT_MAX_CHANNELS",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_MANAGEMENT_MESSAGE_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_PENDING_MESSAGES",
    "DEFAULT_WINDOW_SIZE",
    "MAX_NUMBER",
    "BeepConfig",
    "Role",
]

#: Largest channel number, message number, answer number and frame size (RFC 3080 §2.2.1).
MAX_NUMBER = 2**31 - 1

#: RFC 3081 §3.1.1: "the initial window size for that channel is 4096 octets", and a peer that
#: cannot allocate 4096 octets for a channel must decline to create it; so this is also the floor.
DEFAULT_WINDOW_SIZE = 4096

#: Largest frame payload accepted (and sent). With the default 4096-octet windows no honest peer
#: comes near it; it is what stops a header declaring "size 100000000" from making us buffer.
DEFAULT_MAX_FRAME_SIZE = 64 * 1024

#: Largest reassembled message ("*" frames joined). Frames are bounded by the window, but a
#: message may span any number of frames; this caps what one message can pin in memory.
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024

#: Largest channel-zero (application/beep+xml) message: a greeting listing a few hundred profiles
#: or a start carrying several 4K initialization elements fits; an XML bomb does not get parsed.
DEFAULT_MAX_MANAGEMENT_MESSAGE_SIZE = 64 * 1024

#: RFC 3080 §2.3: "A BEEP peer should support at least 257 concurrent channels" (not counting
#: channel zero here). Each channel costs windows, queues and reassembly buffers, so no more.
DEFAULT_MAX_CHANNELS = 257

#: MSGs a peer may pipeline on one channel before we have replied (RFC 3080 §2.6.1 allows
#: pipelining but sets no bound; each pending MSG pins its body until the application answers).
DEFAULT_MAX_PENDING_MESSAGES = 64

#: ANS messages of one reply that may be in progress ("*") at once (RFC 3080 §2.2.1.1 lets them
#: interleave); each pins a reassembly buffer.
DEFAULT_MAX_ANSWERS_IN_PROGRESS = 64


class Role(Enum):
    """Which end of the transport connection we are (RFC 3080 §2.1)."""

    #: Opened the connection. Starts odd-numbered channels (RFC 3080 §2.3.1.2).
    INITIATOR = "initiator"
    #: Accepted the connection. Starts even-numbered channels.
    LISTENER = "listener"

    @property
    def channel_parity(self) -> int:
        """`number % 2` of the channels this role may start."""
        return 1 if self is Role.INITIATOR else 0

    @property
    def peer(self) -> Role:
        return Role.LISTENER if self is Role.INITIATOR else Role.INITIATOR


@dataclass(frozen=True, slots=True)
class BeepConfig:
    """Limits and tuning of one BEEP session; every field has a `DEFAULT_*` constant.

    Attributes:
        window_size: receive buffer per channel; advertised with SEQ frames (RFC 3081 §3.1).
        max_frame_size: largest frame payload accepted or sent.
        max_message_size: largest message after joining its frames.
        max_management_message_size: largest channel-zero XML message.
        max_channels: channels (besides zero) open or being started at once.
        max_pending_messages: MSGs received on one channel and not yet completely answered.
        max_answers_in_progress: ANS messages of one reply in progress at once.
    """

    window_size: int = DEFAULT_WINDOW_SIZE
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_management_message_size: int = DEFAULT_MAX_MANAGEMENT_MESSAGE_SIZE
    max_channels: int = DEFAULT_MAX_CHANNELS
    max_pending_messages: int = DEFAULT_MAX_PENDING_MESSAGES
    max_answers_in_progress: int = DEFAULT_MAX_ANSWERS_IN_PROGRESS

    def __post_init__(self) -> None:
        if not DEFAULT_WINDOW_SIZE <= self.window_size <= MAX_NUMBER:
            raise ConfigError(f"window_size must be in 4096..{MAX_NUMBER} (RFC 3081 §3.1.1)")
        if not 1 <= self.max_frame_size <= MAX_NUMBER:
            raise ConfigError(f"max_frame_size must be in 1..{MAX_NUMBER}")
        if self.max_message_size < 1:
            raise ConfigError("max_message_size must be positive")
        if self.max_management_message_size < 512:
            raise ConfigError("max_management_message_size must be at least 512")
        for name in ("max_channels", "max_pending_messages", "max_answers_in_progress"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive")
