"""One channel: message numbering, reply rules, reassembly, ordering and its two windows.

Theory of operation
-------------------
A channel tracks the two directions of RFC 3080 §2.7's unidirectional message numbers apart:

* `_outbound`: MSGs we sent whose reply has not been completely received. A reply moves through
  `REPLY_TRANSITIONS` -- the per-channel state machine, one table used both to judge the peer's
  reply frames and our own reply messages. RPY and ERR may span frames of the same keyword; ANS
  may repeat, interleaved by answer number; NUL ends a one-to-many reply. A keyword the table
  lacks is one of the poorly-formed frames of RFC 3080 §2.2.1.1.
* `_inbound`: MSGs we received whose reply we have not completely sent. RFC 3080 §2.6.1: replies
  go out "in the same order as the corresponding MSG messages are received", so a reply to a later
  MSG is staged until every earlier one is complete, then released in order. The application may
  therefore answer in any order without breaking the rule.

Receiving checks, in order: the seqno and window (`ReceiveWindow`), the continuation rule (after
a "*" frame the next frame on the channel must continue the same message: same keyword and
msgno), then the msgno rules, then size limits. Any failure is a `RemoteProtocolError` with
`terminate=True`, because RFC 3080 §2.2.1.1 terminates the session for every poorly-formed frame.

Sending: whole messages are queued FIFO and cut into frames by `next_frame()` as the peer's window
and the maximum frame size allow (RFC 3081 §3.1.2). FIFO keeps a message's frames contiguous on
the channel, as RFC 3080 §2.2.1.1 requires.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from adapters.beep._config import MAX_NUMBER, BeepConfig
from adapters.beep._errors import LocalProtocolError, RemoteProtocolError
from broker.errors import ReplyCode

from ._frames import Frame, FrameType
from ._window import ReceiveWindow, SendWindow

__all__ = ["REPLY_TRANSITIONS", "Channel", "Completed", "ReplyState"]


class ReplyState(Enum):
    """How far the reply to one MSG has got."""

    #: No frame of the reply yet.
    AWAITING = "awaiting"
    #: An RPY has started ("*") and not finished.
    IN_RPY = "in RPY"
    #: An ERR has started and not finished.
    IN_ERR = "in ERR"
    #: At least one ANS has been seen; more ANS or the final NUL may follow.
    ANSWERING = "answering"


_R, _F = ReplyState, FrameType
#: `(state, keyword) -> (state after a "*" frame, state after a "." frame)`; None means the
#: reply is complete. NUL is always "." (the decoder refuses "NUL ... *").
REPLY_TRANSITIONS: dict[tuple[ReplyState, FrameType], tuple[ReplyState, ReplyState | None]] = {
    (_R.AWAITING, _F.RPY): (_R.IN_RPY, None),
    (_R.IN_RPY, _F.RPY): (_R.IN_RPY, None),
    (_R.AWAITING, _F.ERR): (_R.IN_ERR, None),
    (_R.IN_ERR, _F.ERR): (_R.IN_ERR, None),
    (_R.AWAITING, _F.ANS): (_R.ANSWERING, _R.ANSWERING),
    (_R.ANSWERING, _F.ANS): (_R.ANSWERING, _R.ANSWERING),
    (_R.AWAITING, _F.NUL): (_R.AWAITING, None),
    (_R.ANSWERING, _F.NUL): (_R.ANSWERING, None),
}


class Completed(NamedTuple):
    """A whole message that arrived on the channel."""

    type: FrameType
    msgno: int
    payload: bytes
    ansno: int | None = None


@dataclass(slots=True)
class _Outgoing:
    type: FrameType
    msgno: int
    payload: bytes
    ansno: int | None = None
    offset: int = 0


@dataclass(slots=True)
class _Outbound:
    reply: ReplyState = ReplyState.AWAITING
    buffer: bytearray = field(default_factory=bytearray)
    answers: dict[int, bytearray] = field(default_factory=dict)


@dataclass(slots=True)
class _Inbound:
    reply: ReplyState = ReplyState.AWAITING
    done: bool = False
    next_ansno: int = 0
    staged: list[_Outgoing] = field(default_factory=list)


def _violation(text: str, code: ReplyCode = ReplyCode.SYNTAX_ERROR) -> RemoteProtocolError:
    return RemoteProtocolError(f"poorly-formed frame: {text}", code=code)


class Channel:
    """State of one open channel (channel zero included)."""

    def __init__(self, number: int, profile: str, config: BeepConfig) -> None:
        self.number = number
        #: URI of the profile bound to the channel ("" for channel zero).
        self.profile = profile
        #: True once we sent a `close` for it: no more MSGs from us (RFC 3080 §2.3.1.3).
        self.closing = False
        self.recv = ReceiveWindow(config.window_size)
        self.send = SendWindow()
        self._config = config
        self._outbound: dict[int, _Outbound] = {}
        self._inbound: dict[int, _Inbound] = {}
        self._msg_partial: tuple[int, bytearray] | None = None
        self._last_intermediate: tuple[FrameType, int] | None = None
        self._queue: deque[_Outgoing] = deque()
        # Channel zero's msgno 0 is the greeting (RFC 3080 §2.3.1.1), so its MSGs start at 1.
        self._next_msgno = 1 if number == 0 else 0

    # --- receiving ------------------------------------------------------------------------

    def expect_reply(self, msgno: int) -> None:
        """Treat `msgno` as a MSG we sent (channel zero's msgno 0 awaits the greeting)."""
        self._outbound[msgno] = _Outbound()

    def receive(self, frame: Frame) -> Completed | None:
        """Account for one data frame; return the message it completes, if any.

        Raises:
            RemoteProtocolError: the frame is poorly formed for this channel (terminate).
        """
        self.recv.receive(frame.seqno, frame.size)
        last = self._last_intermediate
        if last is not None and last != (frame.type, frame.msgno):
            raise _violation(
                f"{frame.type} {frame.msgno} interrupts the unfinished {last[0]} {last[1]}"
            )
        self._last_intermediate = (frame.type, frame.msgno) if frame.more else None
        if frame.type is FrameType.MSG:
            return self._receive_msg(frame)
        return self._receive_reply(frame)

    def _check_size(self, held: int, frame: Frame) -> None:
        if held + frame.size > self._config.max_message_size:
            raise _violation(
                f"message exceeds {self._config.max_message_size} octets",
                ReplyCode.TRANSACTION_FAILED,
            )

    def _receive_msg(self, frame: Frame) -> Completed | None:
        if self._msg_partial is None:
            if frame.msgno in self._inbound:
                raise _violation(f"MSG {frame.msgno} reuses a message number still awaiting"
                                 " our reply")
            if len(self._inbound) >= self._config.max_pending_messages:
                raise _violation(
                    f"more than {self._config.max_pending_messages} MSGs pending on channel"
                    f" {self.number}", ReplyCode.TRANSACTION_FAILED)
            self._msg_partial = (frame.msgno, bytearray())
        buffer = self._msg_partial[1]
        self._check_size(len(buffer), frame)
        buffer += frame.payload
        if frame.more:
            return None
        self._msg_partial = None
        self._inbound[frame.msgno] = _Inbound()
        return Completed(FrameType.MSG, frame.msgno, bytes(buffer))

    def _receive_reply(self, frame: Frame) -> Completed | None:
        out = self._outbound.get(frame.msgno)
        if out is None:
            raise _violation(f"{frame.type} to message {frame.msgno}, which was never sent"
                             " or is already answered")
        if next(iter(self._outbound)) != frame.msgno:
            raise _violation(f"{frame.type} {frame.msgno} overtakes the reply to an earlier MSG"
                             " (RFC 3080 §2.6.1)")
        if out.reply is ReplyState.AWAITING:
            self._preempted(frame.msgno)
        step = REPLY_TRANSITIONS.get((out.reply, frame.type))
        if step is None:
            raise _violation(f"{frame.type} for message {frame.msgno} while {out.reply.value}")
        after = step[0] if frame.more else step[1]
        if frame.type is FrameType.ANS:
            assert frame.ansno is not None  # guaranteed by Frame
            buffer = out.answers.get(frame.ansno)
            if buffer is None:
                if len(out.answers) >= self._config.max_answers_in_progress:
                    raise _violation("too many answers in progress", ReplyCode.TRANSACTION_FAILED)
                buffer = out.answers[frame.ansno] = bytearray()
            self._check_size(len(buffer), frame)
            buffer += frame.payload
            out.reply = ReplyState.ANSWERING
            if frame.more:
                return None
            del out.answers[frame.ansno]
            return Completed(FrameType.ANS, frame.msgno, bytes(buffer), frame.ansno)
        if frame.type is FrameType.NUL and out.answers:
            raise _violation(f"NUL for message {frame.msgno} while an ANS is unfinished")
        self._check_size(len(out.buffer), frame)
        out.buffer += frame.payload
        if after is not None:
            out.reply = after
            return None
        del self._outbound[frame.msgno]
        return Completed(frame.type, frame.msgno, bytes(out.buffer))

    def _preempted(self, msgno: int) -> None:
        # First frame of a reply. If our MSG is still being sent, RFC 3080 §2.6.3 obliges us to
        # finish it with an empty "." frame; if not one frame of it went out, the peer is
        # answering a message it never saw.
        # Our MSGs leave in msgno order and `msgno` is the oldest unanswered one, so only the
        # first MSG in the queue can be it (replies may sit ahead of it): looking further would
        # make every reply cost the length of a long queue.
        for item in self._queue:
            if item.type is not FrameType.MSG:
                continue
            if item.msgno != msgno:
                return  # ours went out whole
            if item.offset == 0:
                raise _violation(f"reply to message {msgno}, which was never sent")
            item.payload = item.payload[: item.offset]
            return

    # --- sending --------------------------------------------------------------------------

    def queue_msg(self, payload: bytes) -> int:
        """Queue a MSG; return its message number."""
        if self.closing:
            raise LocalProtocolError(f"channel {self.number} is being closed: no more MSGs"
                                     " (RFC 3080 §2.3.1.3)")
        if len(self._outbound) > MAX_NUMBER:  # pragma: no cover - 2**31 outstanding MSGs
            raise LocalProtocolError("message numbers exhausted")
        msgno = self._next_msgno
        while msgno in self._outbound:
            msgno = (msgno + 1) % (MAX_NUMBER + 1)
        self._next_msgno = (msgno + 1) % (MAX_NUMBER + 1)
        self._outbound[msgno] = _Outbound()
        self._queue.append(_Outgoing(FrameType.MSG, msgno, payload))
        return msgno

    def queue_greeting(self, ftype: FrameType, payload: bytes) -> None:
        """Queue our greeting or its refusal: the reply to a MSG 0 nobody sends (§2.3.1.1).

        It goes first, ahead of error replies queued to MSGs that arrived before it.
        """
        self._queue.appendleft(_Outgoing(ftype, 0, payload))

    def queue_reply(self, ftype: FrameType, msgno: int, payload: bytes) -> int | None:
        """Queue a reply message to the peer's MSG `msgno`; return the ansno of an ANS.

        Raises:
            LocalProtocolError: no such MSG awaits a reply, or the keyword is not allowed now.
        """
        inbound = self._inbound.get(msgno)
        if inbound is None or inbound.done:
            raise LocalProtocolError(f"no MSG {msgno} awaits a reply on channel {self.number}")
        step = REPLY_TRANSITIONS.get((inbound.reply, ftype))
        if step is None:
            raise LocalProtocolError(f"can't send {ftype} to MSG {msgno}: it is"
                                     f" {inbound.reply.value}")
        ansno = None
        if ftype is FrameType.ANS:
            ansno = inbound.next_ansno
            inbound.next_ansno = (ansno + 1) % (MAX_NUMBER + 1)
        elif ftype is FrameType.NUL:
            payload = b""
        inbound.staged.append(_Outgoing(ftype, msgno, payload, ansno))
        if step[1] is None:
            inbound.done = True
        else:
            inbound.reply = step[1]
        self._release_replies()
        return ansno

    def _release_replies(self) -> None:
        while self._inbound:
            msgno, head = next(iter(self._inbound.items()))
            self._queue.extend(head.staged)
            head.staged.clear()
            if not head.done:
                return
            del self._inbound[msgno]

    def next_frame(self) -> Frame | None:
        """The next frame the peer's window allows, or None."""
        if not self._queue:
            return None
        head = self._queue[0]
        grant = self.send.take(len(head.payload) - head.offset, self._config.max_frame_size)
        if grant is None:
            return None
        seqno, size = grant
        chunk = head.payload[head.offset : head.offset + size]
        head.offset += size
        more = head.offset < len(head.payload)
        if not more:
            self._queue.popleft()
        return Frame(head.type, self.number, head.msgno, more, seqno, chunk, head.ansno)

    # --- questions ------------------------------------------------------------------------

    @property
    def has_queued(self) -> bool:
        return bool(self._queue)

    def all_acknowledged(self) -> bool:
        """Has every MSG we sent had at least one reply frame (RFC 3080 §2.3.1.3)?"""
        return all(o.reply is not ReplyState.AWAITING for o in self._outbound.values())

    def is_quiescent(self) -> bool:
        """No MSG in flight either way and nothing queued: the channel may be closed."""
        return not (self._outbound or self._inbound or self._queue or self._msg_partial)

    def unfinished_replies(self) -> list[int]:
        """The peer's MSGs whose reply is not completely written: not (fully) answered yet, or
        answered but still queued behind the peer's window."""
        queued = [o.msgno for o in self._queue if o.type is not FrameType.MSG]
        return list(dict.fromkeys([*self._inbound, *queued]))

    def awaiting_reply(self, msgno: int) -> bool:
        """Is the peer's MSG `msgno` still waiting for (the end of) our reply?"""
        inbound = self._inbound.get(msgno)
        return inbound is not None and not inbound.done

    def first_pending_inbound(self) -> int | None:
        """The oldest of the peer's MSGs we have not completely answered."""
        return next(iter(self._inbound), None)
