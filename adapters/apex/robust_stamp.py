"""Robust delivery's two APEX options (docs/robust-binding.md, docs/apexps-robust.dtd) <->
dataclasses: what every delivery and every publication carries, so the hot path of both.

- the publish option, `apexps.publish` on data a publisher sends to `apex=pubsub/TOPIC@D`,
  holding one `<publish … />` (`PublishMeta`; `publish_option`, `find_publish_meta`): publish
  type, message-id, permission token, publisher seq;
- the sequence stamp, `apexps.seq` in each recipient element of delivered data, holding one
  `<seq … />` (`Stamp`; `stamp_option`, `find_stamp`, `decode_stamp`; `stamp_element` for a
  `<batch>` item's).

The documents carried as data content are adapters/apex/robust_codec.py; the syntax both share
(limits, checkers, escaping) is `_robust_syntax`. Errors as there: 500 for XML that does not
parse or is hostile, 501 for what does not fit the DTD, 553 for a link id, endpoint or topic
that is not one and for a link seq that is negative or beyond 64 bits.

The dataclasses check their own invariants (which attributes go with which stamp kind, number
ranges), so what `encode_*` writes always decodes. The stamp is built per delivery on the
fan-out path, so its encoder is a plain f-string and its constructor checks only what is cheap;
`decode_stamp` checks everything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from lxml import etree

from broker.names import validate_topic
from broker.records import PublishType
from broker.robust.linkid import validate_link_id
from common.errors import (
    InvalidParameter,
    SyntaxError_,
)

from ._robust_syntax import (
    MAX_IN_RE,
    MAX_LINK_SEQ,
    MAX_LONG,
    MAX_MESSAGE_ID_LEN,
    MAX_STAMP_XML,
    MAX_TOKEN_LEN,
    MAX_TRANS_ID,
    SUBSCRIPTION_ID,
    attr,
    attributes,
    bad,
    check_int,
    check_text,
    decimal,
    empty_element,
    esc,
    linkseq,
    optional,
    parse,
    source_name,
)
from .codec import Option

__all__ = [
    "PUBLISH_OPTION",
    "STAMP_OPTION",
    "PublishMeta",
    "Stamp",
    "StampKind",
    "data_stamp_link",
    "data_stamp_message",
    "data_stamp_xml",
    "decode_stamp",
    "encode_stamp",
    "find_publish_meta",
    "find_stamp",
    "publish_element",
    "publish_meta_element",
    "publish_option",
    "stamp_element",
    "stamp_option",
    "varied_stamp",
]


#: The APEX option (internal name) that carries the stamp.
STAMP_OPTION = "apexps.seq"


#: The APEX option (internal name) a publisher puts on its data.
PUBLISH_OPTION = "apexps.publish"


class StampKind(StrEnum):
    """What a link seq carried (the stamp's `kind`)."""

    #: a published message
    DATA = "data"
    #: a heartbeat: advances the link seq on an idle link
    HEARTBEAT = "heartbeat"
    #: link seq 0: a new epoch of the link begins
    RESET = "reset"
    #: a gap fill's stand-in for a message the subscriber is no longer entitled to (its
    #: permission token was denied since): the seq is consumed, nothing is delivered
    WITHHELD = "withheld"


@dataclass(frozen=True, slots=True)
class Stamp:
    """The sequence stamp of one delivered data (docs/robust-binding.md §2).

    `link`, `epoch` and `link_seq` place it on the link; a DATA stamp also says which message
    it is (`source`, `source_seq`) and how to read it (`publish_type`, `topic`, `token`,
    `message_id`). `time` is the journal time (data) or a lower bound for what follows
    (heartbeat, reset); `refill` marks a gap-fill copy; `repair` is the transID of the source
    repair a reset answers; `snapshot` marks a data item's image or delta sent as state, not
    live traffic (§9).
    """

    link: str
    link_seq: int
    kind: StampKind = StampKind.DATA
    epoch: int = 0
    source: str | None = None
    source_seq: int | None = None
    publish_type: PublishType | None = None
    topic: str | None = None
    token: str | None = None
    message_id: str | None = None
    time: int | None = None
    refill: bool = False
    repair: int | None = None
    snapshot: bool = False
    #: a batch item's InRe (draft-content §5.10.1): the subscription ids the message
    #: satisfied; a single data carries them in its InRe option instead
    in_re: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate_link_id(self.link)
        check_int(self.link_seq, "linkseq", 0, MAX_LINK_SEQ)
        check_int(self.epoch, "epoch", 0, MAX_LONG)
        if self.time is not None:
            check_int(self.time, "time", 0, MAX_LONG)
        about = (self.source, self.source_seq, self.publish_type, self.topic, self.token,
                 self.message_id)
        if self.kind is StampKind.DATA:
            if self.source is None or self.source_seq is None or self.publish_type is None \
                    or self.topic is None:
                raise bad("a data stamp names its source, sourceseq, type and topic")
            check_int(self.source_seq, "sourceseq", 1, MAX_LONG)
            if self.token is not None:
                check_text(self.token, "a permission token", MAX_TOKEN_LEN)
            if self.message_id is not None:
                check_text(self.message_id, "a message-id", MAX_MESSAGE_ID_LEN)
            if self.link_seq == 0:
                raise bad("link seq 0 is a reset; data starts at 1")
            if any(not isinstance(i, str) or not SUBSCRIPTION_ID.fullmatch(i)
                   for i in self.in_re) or len(self.in_re) > MAX_IN_RE:
                raise bad(f"inre holds up to {MAX_IN_RE} subscription ids")
        else:
            if any(v is not None for v in about) or self.in_re:
                raise bad(f"a {self.kind} stamp carries no message attributes")
            if (self.kind is StampKind.RESET) != (self.link_seq == 0):
                raise bad("link seq 0 is sent exactly on a reset")
        if self.repair is not None:
            if self.kind is not StampKind.RESET:
                raise bad("only a reset answers a repair")
            check_int(self.repair, "repair", 1, MAX_TRANS_ID)
        if self.refill and self.kind is StampKind.RESET:
            raise bad("a reset is never refilled")
        if self.snapshot and self.kind is not StampKind.DATA:
            raise bad("only data is a snapshot copy")


@dataclass(frozen=True, slots=True)
class PublishMeta:
    """What a publisher says about one message (docs/robust-binding.md §2.3): its publish
    type, the data item it acts on (`message_id`, with the topic), its permission token and
    the publisher's own seq on its link to the broker. Every field is optional; a message
    without the option is an `update` with none of the rest.

    `snapshot` is a subscriber's request (XEP-0040 §3.1), never something published: 553.
    """

    publish_type: PublishType = PublishType.UPDATE
    message_id: str | None = None
    token: str | None = None
    publisher_seq: int | None = None
    #: the application event code this message means for its resource (event-binding.md §2)
    event: int | None = None
    #: False: publishing gives no implicit watch of the resource (event-binding.md §6)
    implicit: bool = True

    def __post_init__(self) -> None:
        if self.event is not None and not 0x8000 <= self.event <= 0xFFFF_FFFF:
            raise InvalidParameter(f"event {self.event} is not an application event code"
                                   " (32768..4294967295)")
        if not isinstance(self.publish_type, PublishType):
            raise bad(f"{self.publish_type!r} is not a publish type")
        if self.publish_type is PublishType.SNAPSHOT:
            raise InvalidParameter("snapshot is a subscriber's request, not a publish type")
        if self.message_id is not None:
            check_text(self.message_id, "a message-id", MAX_MESSAGE_ID_LEN)
        if self.token is not None:
            check_text(self.token, "a permission token", MAX_TOKEN_LEN)
        if self.publisher_seq is not None:
            check_int(self.publisher_seq, "pubseq", 1, MAX_LONG)


_STAMP_ATTRS = {"link", "epoch", "linkseq", "kind", "source", "sourceseq", "type", "topic",
                "token", "messageid", "time", "refill", "repair", "snapshot", "inre"}


def stamp_element(root: etree._Element) -> Stamp:
    """The stamp a `<seq>` element says (what `decode_stamp` and a batch item hold)."""
    if root.tag != "seq":
        raise bad(f"the {STAMP_OPTION} option holds <seq>, not <{str(root.tag)[:40]}>")
    empty_element(root)
    a = attributes(root, _STAMP_ATTRS, {"link", "linkseq"})
    try:
        kind = StampKind(a.get("kind", "data"))
    except ValueError:
        raise bad("a stamp's kind is data, heartbeat, reset or withheld") from None
    ptype = None
    if "type" in a:
        try:
            ptype = PublishType(a["type"])
        except ValueError:
            raise bad(f"{a['type'][:40]!r} is not a publish type") from None
    refill, snapshot = a.get("refill", "false"), a.get("snapshot", "false")
    if refill not in ("true", "false") or snapshot not in ("true", "false"):
        raise bad("refill and snapshot are true or false")
    return Stamp(
        link=validate_link_id(a["link"]),
        link_seq=linkseq(a["linkseq"], "linkseq"),
        kind=kind,
        epoch=decimal(a.get("epoch", "0"), "epoch"),
        source=source_name(a["source"]) if "source" in a else None,
        source_seq=optional(a, "sourceseq", low=1),
        publish_type=ptype,
        topic=validate_topic(a["topic"]) if "topic" in a else None,
        token=a.get("token"),
        message_id=a.get("messageid"),
        time=optional(a, "time"),
        refill=refill == "true",
        repair=optional(a, "repair", "repair", 1, MAX_TRANS_ID),
        snapshot=snapshot == "true",
        in_re=tuple(a["inre"].split(" ")) if "inre" in a else (),
    )


_SET_ORDER = ("link", "link_seq", "kind", "epoch", "source", "source_seq", "publish_type",
              "topic", "token", "message_id", "time", "refill", "repair", "snapshot", "in_re")


assert Stamp.__slots__ == _SET_ORDER, "a new Stamp field needs its setter in varied_stamp"


(_set_link, _set_link_seq, _set_kind, _set_epoch, _set_source, _set_source_seq, _set_type,
 _set_topic, _set_token, _set_message_id, _set_time, _set_refill, _set_repair,
 _set_snapshot, _set_in_re) = (getattr(Stamp, name).__set__ for name in _SET_ORDER)


def varied_stamp(proto: Stamp, link_seq: int, source_seq: int | None, time: int | None,
                 message_id: str | None) -> Stamp:
    """`proto` with the fields that vary from one data stamp of a link to the next replaced,
    without a check: for a reader that checked `proto` whole and checks these itself (the
    `<batch>` fast path, `batch_fast`).
    Spelled out setter by setter: a batch reader makes one per item, and a loop over the
    slots costs half as much again. With `Stamp(...)` (which checks everything) this is the
    one way a `Stamp` is made."""
    stamp = _new_object(Stamp)
    _set_link(stamp, proto.link)
    _set_link_seq(stamp, link_seq)
    _set_kind(stamp, proto.kind)
    _set_epoch(stamp, proto.epoch)
    _set_source(stamp, proto.source)
    _set_source_seq(stamp, source_seq)
    _set_type(stamp, proto.publish_type)
    _set_topic(stamp, proto.topic)
    _set_token(stamp, proto.token)
    _set_message_id(stamp, message_id)
    _set_time(stamp, time)
    _set_refill(stamp, proto.refill)
    _set_repair(stamp, proto.repair)
    _set_snapshot(stamp, proto.snapshot)
    _set_in_re(stamp, proto.in_re)
    return stamp


_new_object = object.__new__


def decode_stamp(option: Option) -> Stamp:
    """The stamp an `apexps.seq` option holds (500/501/553 as the module docstring says).

    The stamp's constructor runs its checks too; the text ones raise 553."""
    if option.external or option.name != STAMP_OPTION:
        raise bad(f"option {option.name[:40]!r} is not {STAMP_OPTION}")
    try:
        return stamp_element(parse(option.content.encode("utf-8"), MAX_STAMP_XML, 1, "stamp"))
    except (RecursionError, MemoryError, UnicodeError) as exc:
        raise SyntaxError_(f"undecodable stamp: {type(exc).__name__}") from None


_PUBLISH_ATTRS = {"type", "messageid", "token", "pubseq", "event", "implicit"}


def find_publish_meta(options: Iterable[Option]) -> PublishMeta | None:
    """The `apexps.publish` option among a data's `options`, None if it has none; 500/501/553
    as for stamps, two of them 501."""
    found = [o for o in options if o.name == PUBLISH_OPTION and not o.external]
    if not found:
        return None
    if len(found) > 1:
        raise bad(f"a data carries at most one {PUBLISH_OPTION} option")
    try:
        root = parse(found[0].content.encode("utf-8"), MAX_STAMP_XML, 1, "publish option")
    except (RecursionError, MemoryError, UnicodeError) as exc:
        raise SyntaxError_(f"undecodable publish option: {type(exc).__name__}") from None
    if root.tag != "publish":
        raise bad(f"the {PUBLISH_OPTION} option holds <publish>, not <{str(root.tag)[:40]}>")
    return publish_meta_element(root)


def publish_meta_element(root: etree._Element) -> PublishMeta:
    """What one `<publish>` element says (the option's, or a `<publication>`'s in a
    publications document: adapters/apex/publications_codec.py); 501/553."""
    empty_element(root)
    a = attributes(root, _PUBLISH_ATTRS, set())
    try:
        ptype = PublishType(a.get("type", "update"))
    except ValueError:
        raise bad(f"{a['type'][:40]!r} is not a publish type") from None
    if a.get("implicit", "true") not in ("true", "false"):
        raise bad("implicit is true or false")
    return PublishMeta(ptype, a.get("messageid"), a.get("token"),
                       optional(a, "pubseq", "pubseq", 1),
                       optional(a, "event", "event", 0, 2**32 - 1),
                       a.get("implicit", "true") == "true")


def find_stamp(options: Iterable[Option]) -> Stamp | None:
    """The stamp among a recipient's `options`, None if it has none; two stamps are 501."""
    found = [o for o in options if o.name == STAMP_OPTION and not o.external]
    if not found:
        return None
    if len(found) > 1:
        raise bad(f"a recipient carries at most one {STAMP_OPTION} option")
    return decode_stamp(found[0])


def encode_stamp(stamp: Stamp) -> str:
    """The `<seq … />` element of `stamp` (the option's content)."""
    s = stamp
    if s.kind is StampKind.DATA:
        return data_stamp_xml(s.link, s.link_seq, epoch=s.epoch, source=s.source or "",
                              source_seq=s.source_seq or 0, publish_type=str(s.publish_type),
                              topic=s.topic or "", token=s.token, message_id=s.message_id,
                              time=s.time, refill=s.refill, snapshot=s.snapshot,
                              in_re=s.in_re)
    text = f"<seq link='{esc(s.link)}'"
    if s.epoch:
        text += f" epoch='{s.epoch}'"
    refill = " refill='true'" if s.refill else ""
    return (f"{text} linkseq='{s.link_seq}' kind='{s.kind.value}'{attr('time', s.time)}{refill}"
            f"{attr('repair', s.repair)} />")


def data_stamp_xml(link: str, link_seq: int, *, epoch: int, source: str, source_seq: int,
                   publish_type: str, topic: str, token: str | None = None,
                   message_id: str | None = None, time: int | None = None,
                   refill: bool = False, snapshot: bool = False,
                   in_re: tuple[str, ...] = ()) -> str:
    """A data stamp's `<seq … />` straight from trusted values (a link record and its journal
    entry, both checked when they were written): the fan-out's per-delivery path, without
    building and checking a `Stamp` (which costs about as much again)."""
    message = data_stamp_message(source, source_seq, publish_type, topic, token=token,
                                 message_id=message_id, time=time)
    return data_stamp_link(link, link_seq, message, epoch=epoch, refill=refill,
                           snapshot=snapshot, in_re=in_re)


def data_stamp_message(source: str, source_seq: int, publish_type: str, topic: str, *,
                       token: str | None = None, message_id: str | None = None,
                       time: int | None = None) -> str:
    """The part of a data stamp that says which message it is (the same on every link the
    message goes to): the fan-out makes it once per message, `data_stamp_link` adds each
    link's part."""
    return (f" kind='data' source='{_esc_known(source)}' sourceseq='{source_seq}'"
            f" type='{publish_type}' topic='{_esc_known(topic)}'"
            f"{attr('token', token)}{attr('messageid', message_id)}{attr('time', time)}")


def data_stamp_link(link: str, link_seq: int, message: str, *, epoch: int, refill: bool,
                    snapshot: bool, in_re: tuple[str, ...] = ()) -> str:
    """A data stamp's `<seq … />` from its link's part and `data_stamp_message`'s."""
    head = f"<seq link='{_esc_known(link)}'"
    if epoch:
        head += f" epoch='{epoch}'"
    tail = " refill='true' />" if refill else " />"
    if in_re:  # after every attribute of the fast layout: a reader without it declines
        tail = f" inre='{' '.join(in_re)}'" + tail
    if snapshot:
        tail = " snapshot='true'" + tail
    return f"{head} linkseq='{link_seq}'{message}{tail}"


_ESCAPED: dict[str, str] = {}


def _esc_known(value: str) -> str:
    """`esc` for the links, sources and topics every stamp repeats: each escaped once."""
    done = _ESCAPED.get(value)
    if done is None:
        if len(_ESCAPED) >= 65_536:  # bounded whatever names come
            _ESCAPED.clear()
        done = _ESCAPED[value] = esc(value)
    return done


def publish_option(meta: PublishMeta) -> Option:
    """The `apexps.publish` option saying `meta`, for a publisher's data."""
    return Option(PUBLISH_OPTION, content=publish_element(meta))


def publish_element(meta: PublishMeta) -> str:
    """The `<publish>` element saying `meta` (the option's content, or a publication's in a
    publications document)."""
    return (f"<publish type='{meta.publish_type}'{attr('messageid', meta.message_id)}"
            f"{attr('token', meta.token)}{attr('pubseq', meta.publisher_seq)}"
            f"{attr('event', meta.event)}"
            f"{'' if meta.implicit else attr('implicit', 'false')} />")


def stamp_option(stamp: Stamp) -> Option:
    """The `apexps.seq` option carrying `stamp`, for a recipient's options."""
    return Option(STAMP_OPTION, content=encode_stamp(stamp))
