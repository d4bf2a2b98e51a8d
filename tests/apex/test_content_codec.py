"""The content-based draft's additions to the pubsub documents (selector, subscription-id) and
the InRe option, in apexps's binding (docs/apexps-robust.dtd)."""

from __future__ import annotations

import pytest

from adapters.apex import Endpoint
from adapters.apex.batch_codec import batch_items
from adapters.apex.codec import Option
from adapters.apex.inre import IN_RE_OPTION, decode_in_re, find_in_re, in_re_option
from adapters.apex.pubsub_codec import Cancel, Reply, Subscribe, decode_pubsub, encode_pubsub
from adapters.apex.robust_stamp import Stamp, data_stamp_xml, encode_stamp, stamp_element
from common.errors import ApexpsError, ParameterSyntaxError
from common.xml_safe import parse_hardened

JADE = Endpoint.parse("jade@example.com")
SELECTOR = "symbol IN ('XMPL', 'TEST') AND (net-change-pct > 5.0 OR net-change-pct < -5.0)"


@pytest.mark.parametrize("op", [
    Subscribe(JADE, "equity.quote.service", 700, 86400, selector_class="JMS",
              selector=SELECTOR),
    Subscribe(JADE, "q", 1, 60, selector_class="RFC-2254", selector="(&(a=<)(b>=5))"),
    Subscribe(JADE, "q", 1, 60, selector_class="JMS", selector=""),
    Cancel("equity.quote.service", 102, None, "100"),
    Cancel(None, 102, JADE, "100"),
    Cancel(None, 103),
    Reply(250, 700, subscription_id="100"),
    Reply(250, 700, "subscribed", "100"),
])
def test_round_trip(op: object) -> None:
    assert decode_pubsub(encode_pubsub(op)) == op  # type: ignore[arg-type]


def test_the_drafts_selector_element_and_its_select_alias() -> None:
    for tag in ("selector", "select"):
        doc = (f"<subscribe subscriber='jade@example.com' topic='equity.quote.service'"
               f" duration='86400' transID='700'><{tag} Name='Select' class='JMS'>\n"
               "  symbol IN ('XMPL', 'TEST', 'SMPL') AND (net-change-pct &gt; 5.0\n"
               f"  OR net-change-pct &lt; -5.0)\n</{tag}></subscribe>").encode()
        op = decode_pubsub(doc)
        assert isinstance(op, Subscribe) and op.selector_class == "JMS"
        assert op.selector is not None and "net-change-pct > 5.0" in op.selector


def test_the_drafts_reply_with_a_subscription_id() -> None:
    op = decode_pubsub(b"<reply code='250' transID='700'>"
                       b"<subscription-id>100</subscription-id></reply>")
    assert op == Reply(250, 700, "", "100")


@pytest.mark.parametrize("doc", [
    b"<subscribe subscriber='a@b' topic='q' duration='1' transID='1'><selector>x</selector>"
    b"</subscribe>",  # no class
    b"<subscribe subscriber='a@b' topic='q' duration='1' transID='1'><selector class='JMS'>"
    b"<b/></selector></subscribe>",  # markup in the selector
    b"<subscribe subscriber='a@b' topic='q' duration='1' transID='1'><selector class='JMS'/>"
    b"<selector class='JMS'/></subscribe>",  # two
    b"<subscribe subscriber='a@b' topic='q' duration='1' transID='1'>text</subscribe>",
    b"<cancel transID='1'><subscription-id>a b</subscription-id></cancel>",
    b"<cancel transID='1'><subscription-id>1</subscription-id><subscription-id>2"
    b"</subscription-id></cancel>",
    b"<cancel transID='1'><topic/></cancel>",
    b"<reply code='250'><subscription-id><x/></subscription-id></reply>",
])
def test_documents_that_do_not_fit_are_501(doc: bytes) -> None:
    with pytest.raises(ParameterSyntaxError):
        decode_pubsub(doc)


def test_inre_option_round_trip_and_the_drafts_layout() -> None:
    option = in_re_option(("100", "101"))
    assert (option.name, option.must_understand, str(option.target_hop)) == \
        (IN_RE_OPTION, False, "final")
    assert decode_in_re(option) == ("100", "101")
    drafts = Option(IN_RE_OPTION, 105, content="\n  <subscription-id>100</subscription-id>\n"
                    "  <subscription-id>101</subscription-id>\n")
    assert find_in_re((drafts,)) == ("100", "101")
    assert find_in_re(()) is None


@pytest.mark.parametrize("content", ["text", "<subscription-id/>", "<other>1</other>",
                                     "<subscription-id>1<x/></subscription-id>",
                                     "<!DOCTYPE x><subscription-id>1</subscription-id>"])
def test_a_bad_inre_is_refused(content: str) -> None:
    with pytest.raises(ApexpsError):
        decode_in_re(Option(IN_RE_OPTION, content=content))


def test_stamp_inre_round_trips_and_rides_in_a_batch_item() -> None:
    stamp = Stamp("jade-l", 3, source="pub@example.com", source_seq=9,
                  publish_type="update", topic="q", in_re=("1", "2"))  # type: ignore[arg-type]
    assert stamp_element(parse_hardened(encode_stamp(stamp).encode(), max_bytes=4096)) == stamp
    seq = data_stamp_xml("jade-l", 3, epoch=0, source="pub@example.com", source_seq=9,
                         publish_type="update", topic="q", in_re=("1", "2"))
    batch = (f"<batch link='jade-l'><item>{seq}<content type='text/plain'>aGk=</content>"
             "</item></batch>").encode()
    _, items = batch_items(batch)
    [(got, content, _, _)] = list(items)
    assert (got.in_re, content) == (("1", "2"), b"hi")


def test_a_stamp_without_message_cannot_carry_inre() -> None:
    with pytest.raises(ApexpsError):
        Stamp("jade-l", 4, kind="heartbeat", in_re=("1",))  # type: ignore[arg-type]
