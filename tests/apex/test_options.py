"""RFC 3342's option contents (dataHopping, dataTiming): parsing, hostile values, the hop helpers
services use, and how the relay treats them (mustUnderstand, 501 before any state changes)."""

from __future__ import annotations

from xml.sax.saxutils import quoteattr

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.apex.codec import Attach, Data, Error, Ok, Option, TargetHop, decode, encode
from adapters.apex.endpoint import Endpoint
from adapters.apex.options import (
    MAX_HOPS,
    MAX_MILLISECS,
    DataHopping,
    DataTiming,
    data_hopping,
    data_timing,
    hop_limit,
    spend_hop,
    validate_options,
    with_hops,
)
from adapters.apex.relay import ChannelRef, Outcome, Relay
from common.errors import ParameterSyntaxError

FRED, BARNEY = Endpoint.parse("fred@example.com"), Endpoint.parse("barney@example.com")
A, B = ChannelRef(1, 1), ChannelRef(2, 1)


def hopping(content: str, **kw: object) -> Option:
    return Option("dataHopping", 86, target_hop=TargetHop.ALL, must_understand=True,
                  content=content, **kw)  # type: ignore[arg-type]


def timing(content: str) -> Option:
    return Option("dataTiming", 86, target_hop=TargetHop.ALL, must_understand=True,
                  content=content)


class TestParsing:
    def test_rfc_examples(self) -> None:
        """The RFC's own option contents read as written; omitted attributes take the DTD
        defaults (0, false)."""
        assert data_hopping(hopping("<dataHopping noMoreThan='2' reportErrors='true' />")) == \
            DataHopping(2, True)
        assert data_hopping(hopping("<dataHopping />")) == DataHopping(0, False)
        assert data_timing(timing("<dataTiming noLaterThan='10000' returnTrip='20000' />")) == \
            DataTiming(10000, 20000, 0, False)
        assert data_timing(timing("<dataTiming reportAfter='60000' />")) == DataTiming(0, 0, 60000)

    @pytest.mark.parametrize("value", ["-1", "256", "99999999999", "1e3", "+5", " 5", "0x10",
                                       "", "two", "5.0", "\u0665"])
    def test_hostile_hop_counts_are_501(self, value: str) -> None:
        """Negative, too large, signed, spaced, non-numeric or non-ASCII digits: 501."""
        with pytest.raises(ParameterSyntaxError):
            data_hopping(hopping(f"<dataHopping noMoreThan={quoteattr(value)} />"))

    @pytest.mark.parametrize("content", [
        "<dataTiming noLaterThan='-5' />",
        f"<dataTiming returnTrip='{MAX_MILLISECS + 1}' />",
        "<dataTiming reportAfter='soon' />",
        "<dataTiming reportErrors='yes' />",
        "<dataTiming noLaterThan='5' frob='1' />",
        "<dataHopping noMoreThan='5' />",
        "<dataTiming>late</dataTiming>",
        "<dataTiming><x /></dataTiming>",
        "<dataTiming /><dataTiming />",
        "",
        "not xml",
        "<!DOCTYPE x [<!ENTITY a 'b'>]><dataTiming />",
        "<dataTiming noLaterThan='1'" + " " * 2000 + "/>",
    ])
    def test_malformed_timing_is_501(self, content: str) -> None:
        """Wrong element, unknown attribute, content, junk, declarations, oversize: 501."""
        with pytest.raises(ParameterSyntaxError):
            data_timing(timing(content))

    @given(st.text(max_size=12))
    def test_any_hop_value_is_a_number_in_range_or_501(self, value: str) -> None:
        """Whatever the attribute holds, the result is 0..255 or ParameterSyntaxError."""
        option = hopping(f"<dataHopping noMoreThan={quoteattr(value)} />")
        try:
            hops = data_hopping(option).no_more_than
        except ParameterSyntaxError:
            return
        assert 0 <= hops <= MAX_HOPS and str(hops) == value.lstrip("0").rjust(1, "0")

    @given(st.integers(0, MAX_MILLISECS), st.integers(0, MAX_MILLISECS),
           st.integers(0, MAX_MILLISECS), st.booleans())
    def test_timing_round_trips_through_xml(self, nlt: int, rt: int, ra: int,
                                            errors: bool) -> None:
        """to_xml() reads back as the same value."""
        value = DataTiming(nlt, rt, ra, errors)
        assert data_timing(timing(value.to_xml())) == value

    def test_external_options_are_not_ours(self) -> None:
        """An external option named like ours is not parsed."""
        validate_options([Option("dataHopping", external=True, content="junk")])


class TestHopHelpers:
    def test_hop_limit_and_with_hops(self) -> None:
        """hop_limit reads noMoreThan (None when absent or 0); with_hops rewrites only it."""
        opts = (Option("statusRequest", 1), hopping("<dataHopping noMoreThan='3' "
                                                   "reportErrors='true' />"))
        assert hop_limit(opts) == 3
        assert hop_limit(opts[:1]) is None
        assert hop_limit((hopping("<dataHopping />"),)) is None
        two = with_hops(opts, 2)
        assert hop_limit(two) == 2 and two[0] is opts[0]
        assert two[1].trans_id == 86 and two[1].must_understand and "reportErrors='true'" in \
            two[1].content
        assert with_hops(opts[:1], 7) == opts[:1]
        with pytest.raises(ParameterSyntaxError):
            with_hops(opts, 256)

    def test_spend_hop_follows_section_4(self) -> None:
        """noMoreThan 2 -> 1; 1 -> stop (None); no limit -> unchanged."""
        opts = (hopping("<dataHopping noMoreThan='2' />"),)
        once = spend_hop(opts)
        assert once is not None and hop_limit(once) == 1
        assert spend_hop(once) is None
        assert spend_hop(()) == ()

    def test_rewritten_option_survives_the_wire(self) -> None:
        """A data carrying a rewritten option encodes and decodes to the same option."""
        data = Data(FRED, (BARNEY,), b"x", options=with_hops(
            (hopping("<dataHopping noMoreThan='9' />"),), 4))
        decoded = decode(*encode(data))
        assert isinstance(decoded, Data) and hop_limit(decoded.options) == 4


class TestRelayTreatment:
    def _relay(self) -> Relay:
        relay = Relay("example.com")
        assert relay.handle(A, Attach(FRED, 1)).reply == Ok()
        assert relay.handle(B, Attach(BARNEY, 1)).reply == Ok()
        return relay

    def test_must_understand_party_options_are_understood(self) -> None:
        """dataHopping and dataTiming with mustUnderstand pass; an external namesake is 504;
        hold4Endpoint is 504 only while no hold store is configured."""
        relay = self._relay()
        for option in (hopping("<dataHopping noMoreThan='3' />"),
                       timing("<dataTiming noLaterThan='5000' />")):
            outcome = relay.handle(A, Data(FRED, (BARNEY,), b"x", options=(option,)))
            assert outcome.reply == Ok() and len(outcome.deliveries) == 1
        external = Option("dataHopping", external=True, must_understand=True,
                          content="<dataHopping />")
        reply = relay.handle(A, Data(FRED, (BARNEY,), b"x", options=(external,))).reply
        assert isinstance(reply, Error) and reply.code == 504
        hold = Option("hold4Endpoint", must_understand=True)
        reply = relay.handle(A, Data(FRED, (BARNEY,), b"x", options=(hold,))).reply
        assert isinstance(reply, Error) and reply.code == 504

    @pytest.mark.parametrize("option", [
        hopping("<dataHopping noMoreThan='-1' />"),
        timing("<dataTiming noLaterThan='99999999999' />"),
        Option("dataTiming", content="<dataTiming noLaterThan='x' />"),
    ])
    def test_bad_option_content_is_501_and_delivers_nothing(self, option: Option) -> None:
        """Per-data or per-recipient, mustUnderstand or not: 501, no delivery."""
        relay = self._relay()
        for data in (Data(FRED, (BARNEY,), b"x", options=(option,)),
                     Data(FRED, (BARNEY,), b"x", recipient_options=((option,),))):
            outcome = relay.handle(A, data)
            assert outcome == Outcome(Error(501, str(outcome.reply.text)))  # type: ignore[union-attr]
