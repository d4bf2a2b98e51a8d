"""The "InRe" APEX option (draft-content §5.10.1, §7.7): which subscriptions a data satisfies.

The service sends one copy of a message per recipient endpoint however many of its
subscriptions the message satisfies, and says which in the recipient's InRe option:

    <option internal='InRe' targetHop='final' mustUnderstand='false'>
      <subscription-id>100</subscription-id><subscription-id>101</subscription-id>
    </option>

`mustUnderstand='false'`: a recipient that does not know InRe takes the data as before. In a
`<batch>` (robust-binding §5.4) an item has no options of its own; its stamp's `inre`
attribute carries the same ids (adapters/apex/robust_stamp.py). Decoding uses the one hardened
parser; an InRe that does not fit is 501, as any option's content would be.
"""

from __future__ import annotations

from adapters.apex.codec import Option, TargetHop
from common.errors import ParameterSyntaxError, SyntaxError_
from common.xml_safe import UnsafeXml, parse_hardened

__all__ = ["IN_RE_OPTION", "MAX_IN_RE_XML", "decode_in_re", "find_in_re", "in_re_option"]

IN_RE_OPTION = "InRe"
#: An InRe of a thousand ids is ~40 KiB; more is not an InRe.
MAX_IN_RE_XML = 64 * 1024


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def in_re_option(ids: tuple[str, ...]) -> Option:
    """The InRe option naming `ids`, for a recipient's options."""
    body = "".join(f"<subscription-id>{_esc(i)}</subscription-id>" for i in ids)
    return Option(IN_RE_OPTION, target_hop=TargetHop.FINAL, must_understand=False,
                  content=body)


def decode_in_re(option: Option) -> tuple[str, ...]:
    """The subscription ids an InRe option names, in order."""
    text = f"<inre>{option.content}</inre>".encode()
    try:
        root = parse_hardened(text, max_bytes=MAX_IN_RE_XML, max_depth=2, what="InRe option")
    except UnsafeXml as exc:
        raise SyntaxError_(str(exc)) from None
    if (root.text or "").strip():
        raise ParameterSyntaxError("InRe holds <subscription-id> elements only")
    ids: list[str] = []
    for child in root:
        if child.tag != "subscription-id" or len(child) or (child.tail or "").strip():
            raise ParameterSyntaxError("InRe holds <subscription-id> elements only")
        value = (child.text or "").strip()
        if not value:
            raise ParameterSyntaxError("an empty <subscription-id>")
        ids.append(value)
    return tuple(ids)


def find_in_re(options: tuple[Option, ...]) -> tuple[str, ...] | None:
    """The ids of the InRe among `options`, if there is one."""
    for option in options:
        if option.name == IN_RE_OPTION and not option.external:
            return decode_in_re(option)
    return None
