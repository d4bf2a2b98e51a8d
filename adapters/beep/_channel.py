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

One limit is not a poorly-formed frame: a MSG whose frames add up to more than
`max_message_size`. Every frame of it is well formed, and the peer is owed an answer, not a
dead session (DESIGN invariant 7). So the channel stops keeping its payload the moment it would
outgrow the cap -- what was held is let go, later frames are counted and dropped -- while every
frame still goes through the same checks (window, seqno, continuation, msgno). Its last frame
completes it as `Refused` instead of `Completed`, and the connection answers it with ERR. The
channel therefore never holds more than the cap for a MSG. A reply that outgrows the cap still
terminates: a reply cannot be answered, and the MSG it answers would wait for ever.

`receive_whole()` is the fast path for what almost every frame is: a whole MSG, RPY or ERR in one
frame, arriving when no message is half-received and, for a reply, answering the oldest MSG that
has had no reply frame yet. It checks the same rules with the state such a frame leaves nothing
else to check, and keeps the payload as it is instead of copying it through a reassembly buffer.
When any check would fail, or the state is not that simple, it returns False without touching
anything and `receive()` judges the frame (and raises): the errors are written once, there.

Sending: whole messages are queued FIFO and cut into frames by `next_frame_bytes()` as the peer's
window and the maximum frame size allow (RFC 3081 §3.1.2). FIFO keeps a message's frames contiguous
on the channel, as RFC 3080 §2.2.1.1 requires. When the caller passes `out` -- saying that it would
write out whatever the channel can send right after queuing -- a message that would be the only
one in the queue and fits the window and the frame size whole is written to `out` as its one frame
at once instead, the frame `next_frame_bytes()` would have made of it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from common.errors import ReplyCode

from ._config import MAX_NUMBER, BeepConfig
from ._errors import LocalProtocolError, RemoteProtocolError
from ._frames import Frame, FrameType, frame_bytes, whole_frame_bytes
from ._window import SEQNO_MODULUS, ReceiveWindow, SendWindow

__all__ = ["REPLY_TRANSITIONS", "Channel", "Completed", "Refused", "ReplyState"]


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

    # Members are singletons compared by identity, so identity hashing is consistent, and it is
    # done in C: Enum's own __hash__ is a Python call on every REPLY_TRANSITIONS lookup.
    __hash__ = object.__hash__


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


class Refused(NamedTuple):
    """A MSG that outgrew `max_message_size`: all its frames arrived, its payload was dropped."""

    msgno: int
    #: Octets the whole message carried (the sum of its frames' sizes).
    size: int


@dataclass(slots=True)
class _Outgoing:
    type: FrameType
    msgno: int
    payload: bytes
    ansno: int | None = None
    offset: int = 0


# _Outbound and _Inbound are plain classes: one of each is made per MSG sent or received, and a
# dataclass's __init__ (default factories, keyword defaults) costs more.


class _Outbound:
    __slots__ = ("answers", "buffer", "reply")

    def __init__(self) -> None:
        self.reply = ReplyState.AWAITING
        self.buffer = bytearray()
        self.answers: dict[int, bytearray] = {}


class _Inbound:
    __slots__ = ("done", "next_ansno", "reply", "staged")

    def __init__(self) -> None:
        self.reply = ReplyState.AWAITING
        self.done = False
        self.next_ansno = 0
        self.staged: list[_Outgoing] = []


def _violation(text: str, code: ReplyCode = ReplyCode.SYNTAX_ERROR) -> RemoteProtocolError:
    return RemoteProtocolError(f"poorly-formed frame: {text}", code=code)


_MSG, _ANS, _NUL = FrameType.MSG, FrameType.ANS, FrameType.NUL
_AWAITING = ReplyState.AWAITING


class Channel:
    """State of one open channel (channel zero included)."""

    __slots__ = ("_config", "_inbound", "_last_intermediate", "_msg_dropped", "_msg_partial",
                 "_next_msgno", "_outbound", "backlog", "closing", "number", "profile", "queue",
                 "recv", "send")

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
        #: Octets so far of the MSG in progress once it outgrew the cap (None: it is kept).
        self._msg_dropped: int | None = None
        self._last_intermediate: tuple[FrameType, int] | None = None
        #: Messages to send, whole, in order; not empty: the channel has frames to write.
        self.queue: deque[_Outgoing] = deque()
        #: Octets of `queue` not yet cut into frames: what a peer that withholds its window
        #: (never sends SEQ) makes us keep; the shell bounds it (ApexServer's `max_outbound`).
        self.backlog = 0
        # Channel zero's msgno 0 is the greeting (RFC 3080 §2.3.1.1), so its MSGs start at 1.
        self._next_msgno = 1 if number == 0 else 0

    # --- receiving ------------------------------------------------------------------------

    def expect_reply(self, msgno: int) -> None:
        """Treat `msgno` as a MSG we sent (channel zero's msgno 0 awaits the greeting)."""
        self._outbound[msgno] = _Outbound()

    def receive(self, frame: Frame) -> Completed | Refused | None:
        """Account for one data frame; return the message it completes, if any (`Refused`: a
        MSG that outgrew `max_message_size`, to be answered with ERR; see the module docstring).

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

    def receive_whole(self, ftype: FrameType, msgno: int, seqno: int, payload: bytes) -> bool:
        """Accept a whole MSG, RPY or ERR in one "." frame if it is the simple case (see the
        module docstring) and every check passes; else return False having changed nothing.

        Raises:
            RemoteProtocolError: as `receive()`, only from `_preempted()` (a reply to a MSG of
                ours not one frame of which went out), at the same point as `receive()`.
        """
        recv = self.recv
        size = len(payload)
        if self._last_intermediate is not None or seqno != recv.expected or size > recv.remaining:
            return False
        config = self._config
        if size > config.max_message_size:
            return False  # `receive()` refuses a MSG (Refused) and terminates on a reply
        if ftype is _MSG:
            inbound = self._inbound
            if (self._msg_partial is not None or msgno in inbound
                    or len(inbound) >= config.max_pending_messages):
                return False
            recv.expected = (seqno + size) % SEQNO_MODULUS
            recv.remaining -= size
            inbound[msgno] = _Inbound()
            return True
        outbound = self._outbound
        out = outbound.get(msgno)
        # AWAITING: no frame of this reply yet, so nothing reassembled and no answers; RPY and
        # ERR then complete it ("." frame). The head test is RFC 3080 §2.6.1's order.
        if out is None or out.reply is not _AWAITING or next(iter(outbound)) != msgno:
            return False
        recv.expected = (seqno + size) % SEQNO_MODULUS
        recv.remaining -= size
        if self.queue:
            self._preempted(msgno)
        del outbound[msgno]
        return True

    def _check_size(self, held: int, frame: Frame) -> None:
        # Replies only: a MSG over the cap is refused, not a violation (module docstring).
        if held + frame.size > self._config.max_message_size:
            raise _violation(
                f"message exceeds {self._config.max_message_size} octets",
                ReplyCode.TRANSACTION_FAILED,
            )

    def _receive_msg(self, frame: Frame) -> Completed | Refused | None:
        partial = self._msg_partial
        if partial is None:
            if frame.msgno in self._inbound:
                raise _violation(f"MSG {frame.msgno} reuses a message number still awaiting"
                                 " our reply")
            if len(self._inbound) >= self._config.max_pending_messages:
                raise _violation(
                    f"more than {self._config.max_pending_messages} MSGs pending on channel"
                    f" {self.number}", ReplyCode.TRANSACTION_FAILED)
            partial = self._msg_partial = (frame.msgno, bytearray())
        buffer = partial[1]
        dropped = self._msg_dropped
        if dropped is None and len(buffer) + frame.size > self._config.max_message_size:
            # Let go of what was kept (a fresh buffer, so the old one is freed, not emptied in
            # place) and from now on only count (module docstring).
            dropped = len(buffer)
            self._msg_partial = (frame.msgno, bytearray())
        if dropped is None:
            buffer += frame.payload
        else:
            dropped += frame.size
        if frame.more:
            self._msg_dropped = dropped
            return None
        self._msg_partial = None
        self._msg_dropped = None
        self._inbound[frame.msgno] = _Inbound()
        if dropped is not None:
            return Refused(frame.msgno, dropped)
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
        for item in self.queue:
            if item.type is not FrameType.MSG:
                continue
            if item.msgno != msgno:
                return  # ours went out whole
            if item.offset == 0:
                raise _violation(f"reply to message {msgno}, which was never sent")
            self.backlog -= len(item.payload) - item.offset
            item.payload = item.payload[: item.offset]
            return

    # --- sending --------------------------------------------------------------------------

    def queue_msg(self, payload: bytes, out: list[bytes] | None = None) -> int:
        """Queue a MSG (or write it to `out`, see the module docstring); return its msgno."""
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
        if out is None or self.queue or not self._frame_now(_MSG, msgno, payload, out):
            self.queue.append(_Outgoing(_MSG, msgno, payload))
            self.backlog += len(payload)
        return msgno

    def queue_greeting(self, ftype: FrameType, payload: bytes) -> None:
        """Queue our greeting or its refusal: the reply to a MSG 0 nobody sends (§2.3.1.1).

        It goes first, ahead of error replies queued to MSGs that arrived before it.
        """
        self.queue.appendleft(_Outgoing(ftype, 0, payload))
        self.backlog += len(payload)

    def queue_reply(self, ftype: FrameType, msgno: int, payload: bytes,
                    out: list[bytes] | None = None) -> int | None:
        """Queue a reply message to the peer's MSG `msgno` (or write it to `out`, see the module
        docstring); return the ansno of an ANS.

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
        if ftype is _ANS:
            ansno = inbound.next_ansno
            inbound.next_ansno = (ansno + 1) % (MAX_NUMBER + 1)
        elif ftype is _NUL:
            payload = b""
        pending = self._inbound
        if step[1] is None and next(iter(pending)) == msgno:
            # The whole reply to the oldest MSG (so nothing is staged for it): straight to the
            # queue, as `_release_replies` would move it, then on to the MSGs after it -- if the
            # next one has anything staged (else `_release_replies` would stop at once).
            # (An ANS never gets here: it does not complete the reply.)
            if out is None or self.queue or not self._frame_now(ftype, msgno, payload, out):
                self.queue.append(_Outgoing(ftype, msgno, payload, ansno))
                self.backlog += len(payload)
            del pending[msgno]
            if pending and next(iter(pending.values())).staged:
                self._release_replies()
            return ansno
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
            if not head.staged:
                return  # nothing staged means not done: a done reply is released as it stages
            self.queue.extend(head.staged)
            self.backlog += sum(len(o.payload) for o in head.staged)
            head.staged.clear()
            if not head.done:
                return
            del self._inbound[msgno]

    def _frame_now(self, ftype: FrameType, msgno: int, payload: bytes, out: list[bytes]) -> bool:
        # Only for a message that nothing is queued ahead of, and not an ANS:
        # `next_frame_bytes()` for it, if it makes one "." frame.
        seqno = self.send.take_whole(len(payload), self._config.max_frame_size)
        if seqno is None:
            return False
        out.append(whole_frame_bytes(ftype, self.number, msgno, seqno, payload))
        return True

    def next_frame_bytes(self) -> bytes | None:
        """The next frame the peer's window allows, encoded, or None.

        Its numbers are valid by construction (our msgnos and ansnos, the peer's validated
        msgnos, the window's seqnos, sizes within `max_frame_size`), so it is encoded without
        building a checked `Frame`.
        """
        if not self.queue:
            return None
        head = self.queue[0]
        payload, offset = head.payload, head.offset
        grant = self.send.take(len(payload) - offset, self._config.max_frame_size)
        if grant is None:
            return None
        seqno, size = grant
        end = offset + size
        # A whole payload slices to itself (no copy) when it goes out in one frame.
        chunk = payload[offset:end]
        head.offset = end
        self.backlog -= size
        more = end < len(payload)
        if not more:
            self.queue.popleft()
        return frame_bytes(head.type, self.number, head.msgno, seqno, chunk, more=more,
                           ansno=head.ansno)

    # --- questions ------------------------------------------------------------------------

    def all_acknowledged(self) -> bool:
        """Has every MSG we sent had at least one reply frame (RFC 3080 §2.3.1.3)?"""
        return all(o.reply is not ReplyState.AWAITING for o in self._outbound.values())

    @property
    def msg_held(self) -> int:
        """Octets of the peer's unfinished MSG kept for reassembly (never above the cap)."""
        return len(self._msg_partial[1]) if self._msg_partial is not None else 0

    def is_quiescent(self) -> bool:
        """No MSG in flight either way and nothing queued: the channel may be closed."""
        return not (self._outbound or self._inbound or self.queue or self._msg_partial)

    def unfinished_replies(self) -> list[int]:
        """The peer's MSGs whose reply is not completely written: not (fully) answered yet, or
        answered but still queued behind the peer's window."""
        queued = [o.msgno for o in self.queue if o.type is not FrameType.MSG]
        return list(dict.fromkeys([*self._inbound, *queued]))

    def awaiting_reply(self, msgno: int) -> bool:
        """Is the peer's MSG `msgno` still waiting for (the end of) our reply?"""
        inbound = self._inbound.get(msgno)
        return inbound is not None and not inbound.done

    def first_pending_inbound(self) -> int | None:
        """The oldest of the peer's MSGs we have not completely answered."""
        return next(iter(self._inbound), None)
