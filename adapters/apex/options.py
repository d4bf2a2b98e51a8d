"""RFC 3342's data options -- dataHopping, dataTiming, hold4Endpoint -- as values, without I/O.

Theory of operation
-------------------
An `Option` keeps its content as the inner XML it arrived with (`_codec`), so an option this
relay does not interpret travels on untouched. The two options with content are read here into
frozen values, checked against RFC 3342 §6's DTD (which types them only as CDATA: the ranges
come from its comments, HOPS 0..255 and MILLISECS 0..2147483647), and written back when a relay
changes them on the way to the next hop. Anything else -- a missing or foreign element, an
unknown attribute, a value out of range, a sign, an exponent, spaces -- is 501, before the data
has changed any state.

The helpers for services that forward data themselves (the pubsub service republishing a
publication) are `hop_limit(options)` and `with_hops(options, n)`; `spend_hop(options)` applies
RFC 3342 §4's rule once, the way the relay does before it sends data to the next relay.

Only `internal` options count: an `external` URI that happens to end in "dataHopping" is
somebody else's option.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from common.errors import ParameterSyntaxError
from common.xml_safe import UnsafeXml, parse_hardened

from .codec import Data, Option

__all__ = [
    "DATA_HOPPING",
    "DATA_TIMING",
    "HOLD_FOR_ENDPOINT",
    "MAX_HOPS",
    "MAX_MILLISECS",
    "DataHopping",
    "DataTiming",
    "data_hopping",
    "data_timing",
    "find_option",
    "hop_limit",
    "replace_option",
    "spend_hop",
    "validate_options",
    "with_hops",
]

#: RFC 3342 §4: the hop limit, akin to IP's TTL.
DATA_HOPPING = "dataHopping"
#: RFC 3342 §2: delivery deadlines and delay reports.
DATA_TIMING = "dataTiming"
#: RFC 3342 §3: queue data for an endpoint that is not attached.
HOLD_FOR_ENDPOINT = "hold4Endpoint"
#: RFC 3342 §6, the HOPS data type.
MAX_HOPS = 255
#: RFC 3342 §6, the MILLISECS data type.
MAX_MILLISECS = 2**31 - 1
#: An option's content is one empty element; anything longer is not one.
_MAX_CONTENT = 1024

_DIGITS = re.compile(r"[0-9]{1,10}")


@dataclass(frozen=True, slots=True)
class DataHopping:
    """`<dataHopping noMoreThan reportErrors />`: 0 hops means "no limit" (§4 acts only on a
    non-zero value)."""

    no_more_than: int = 0
    report_errors: bool = False

    def to_xml(self) -> str:
        errors = " reportErrors='true'" if self.report_errors else ""
        return f"<dataHopping noMoreThan='{self.no_more_than}'{errors} />"


@dataclass(frozen=True, slots=True)
class DataTiming:
    """`<dataTiming noLaterThan returnTrip reportAfter reportErrors />`, in milliseconds; 0
    switches the respective rule off."""

    no_later_than: int = 0
    return_trip: int = 0
    report_after: int = 0
    report_errors: bool = False

    def to_xml(self) -> str:
        # §2.1.1's final-hop report carries "no other attributes": write only what is set.
        attrs = "".join(f" {name}='{value}'" for name, value in (
            ("noLaterThan", self.no_later_than), ("returnTrip", self.return_trip),
            ("reportAfter", self.report_after)) if value)
        if self.report_errors:
            attrs += " reportErrors='true'"
        return f"<dataTiming{attrs} />"


def _element(option: Option, tag: str, allowed: set[str]) -> dict[str, str]:
    try:
        root = parse_hardened(option.content.encode("utf-8"), max_bytes=_MAX_CONTENT,
                              max_depth=1, what=f"{tag} option")
    except UnsafeXml as exc:
        raise ParameterSyntaxError(f"the {tag} option must contain one <{tag} /> element"
                                   f" ({exc})") from None
    if root.tag != tag:
        raise ParameterSyntaxError(f"the {tag} option must contain <{tag} />,"
                                   f" not <{str(root.tag)[:40]}>")
    if (root.text or "").strip():
        raise ParameterSyntaxError(f"<{tag}> is empty (RFC 3342 §6)")
    attrs = {str(k): str(v) for k, v in root.attrib.items()}
    unknown = set(attrs) - allowed
    if unknown:
        raise ParameterSyntaxError(f"unexpected attribute {sorted(unknown)[0][:40]!r}"
                                   f" in <{tag}>")
    return attrs


def _bounded(attrs: dict[str, str], name: str, limit: int, tag: str) -> int:
    value = attrs.get(name, "0")
    if not _DIGITS.fullmatch(value) or int(value) > limit:
        raise ParameterSyntaxError(f"{tag} {name} {value[:20]!r} is not a number in 0..{limit}")
    return int(value)


def _flag(attrs: dict[str, str], name: str, tag: str) -> bool:
    value = attrs.get(name, "false")
    if value not in ("true", "false"):
        raise ParameterSyntaxError(f"{tag} {name} must be true or false")
    return value == "true"


def data_hopping(option: Option) -> DataHopping:
    """Read a dataHopping option's content; `ParameterSyntaxError` (501) if it is not valid."""
    attrs = _element(option, DATA_HOPPING, {"noMoreThan", "reportErrors"})
    return DataHopping(_bounded(attrs, "noMoreThan", MAX_HOPS, DATA_HOPPING),
                       _flag(attrs, "reportErrors", DATA_HOPPING))


def data_timing(option: Option) -> DataTiming:
    """Read a dataTiming option's content; `ParameterSyntaxError` (501) if it is not valid."""
    attrs = _element(option, DATA_TIMING,
                     {"noLaterThan", "returnTrip", "reportAfter", "reportErrors"})
    def millis(name: str) -> int:
        return _bounded(attrs, name, MAX_MILLISECS, DATA_TIMING)
    return DataTiming(millis("noLaterThan"), millis("returnTrip"), millis("reportAfter"),
                      _flag(attrs, "reportErrors", DATA_TIMING))


def find_option(options: Iterable[Option], name: str) -> Option | None:
    """The first internal option called `name`, if any."""
    return next((o for o in options if o.name == name and not o.external), None)


def validate_options(options: Iterable[Option]) -> None:
    """Check the content of every option here that has content (501 at the first bad one)."""
    for option in options:
        if option.external:
            continue
        if option.name == DATA_HOPPING:
            data_hopping(option)
        elif option.name == DATA_TIMING:
            data_timing(option)


def hop_limit(options: Iterable[Option]) -> int | None:
    """How many more relays the data may visit (dataHopping's noMoreThan), or None when no
    dataHopping option limits it (absent, or noMoreThan='0')."""
    option = find_option(options, DATA_HOPPING)
    if option is None:
        return None
    hops = data_hopping(option).no_more_than
    return hops or None


def with_hops(options: Iterable[Option], hops: int) -> tuple[Option, ...]:
    """`options` with the dataHopping option's noMoreThan set to `hops` (0..255), everything
    else about it (targetHop, mustUnderstand, transID, reportErrors) kept. Options without a
    dataHopping option come back unchanged."""
    if not 0 <= hops <= MAX_HOPS:
        raise ParameterSyntaxError(f"noMoreThan {hops} is not in 0..{MAX_HOPS}")
    out = tuple(options)
    option = find_option(out, DATA_HOPPING)
    if option is None:
        return out
    content = replace(data_hopping(option), no_more_than=hops).to_xml()
    return tuple(replace(o, content=content) if o is option else o for o in out)


def spend_hop(options: Iterable[Option]) -> tuple[Option, ...] | None:
    """RFC 3342 §4 for one hop: the options to send on (noMoreThan less one), or None when the
    limit is reached and the data must not be sent (the caller reports if reportErrors)."""
    out = tuple(options)
    hops = hop_limit(out)
    if hops is None:
        return out
    if hops - 1 <= 0:
        return None
    return with_hops(out, hops - 1)


def replace_option(data: Data, old: Option, new: Option) -> Data:
    """`data` with `old` (per-data or per-recipient, matched by identity) replaced by `new`."""
    def swap(group: tuple[Option, ...]) -> tuple[Option, ...]:
        return tuple(new if o is old else o for o in group)
    return replace(data, options=swap(data.options),
                   recipient_options=tuple(swap(g) for g in data.recipient_options))
