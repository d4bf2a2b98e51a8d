"""The relay core: attach, terminate, data routing, services, options (RFC 3340 §4.4, §5)."""

from __future__ import annotations

from collections.abc import Iterable

from adapters.apex.codec import BEEP_XML, Attach, Bind, Data, Error, Ok, Option, Terminate
from adapters.apex.endpoint import Endpoint
from adapters.apex.relay import ChannelRef, Delivery, Outcome, Relay
from common.errors import ReplyCode

FRED, BARNEY = Endpoint.parse("fred@example.com"), Endpoint.parse("barney@example.com")
A, B = ChannelRef(1, 1), ChannelRef(2, 1)


def _code(outcome: Outcome) -> int:
    return 250 if isinstance(outcome.reply, Ok) else outcome.reply.code


def _pair() -> Relay:
    relay = Relay("Example.COM")
    assert relay.handle(A, Attach(FRED, 1)) == Outcome(Ok())
    assert relay.handle(B, Attach(BARNEY, 1)) == Outcome(Ok())
    return relay


def test_attach_rules_in_rfc_order() -> None:
    """Duplicate transID 555, foreign domain 553, well-known 537, mustUnderstand 504, taken 554."""
    relay = _pair()
    assert _code(relay.handle(A, Attach(Endpoint.parse("wilma@example.com"), 1))) == 555
    assert _code(relay.handle(A, Attach(Endpoint.parse("wilma@rubble.com"), 2))) == 553
    assert _code(relay.handle(A, Attach(Endpoint.parse("apex=pubsub@example.com"), 2))) == 537
    assert _code(relay.handle(A, Attach(Endpoint.parse("wilma@example.com"), 2,
                                        (Option("frob", must_understand=True),)))) == 504
    assert _code(relay.handle(A, Attach(BARNEY, 2))) == ReplyCode.TRANSACTION_FAILED
    assert _code(relay.handle(A, Attach(Endpoint.parse("wilma@example.com"), 2,
                                        (Option("frob"),)))) == 250
    assert relay.attachments(A) == {1: FRED, 2: Endpoint.parse("wilma@example.com")}


def test_attach_override_terminates_the_older_attachment() -> None:
    """attachOverride moves the endpoint and tells the old channel with terminate code 556."""
    relay = _pair()
    outcome = relay.handle(A, Attach(BARNEY, 2, (Option("attachOverride"),)))
    assert outcome == Outcome(Ok(), (Delivery(B, Terminate(1, 556, outcome.deliveries[0]
                                                           .operation.text)),))  # type: ignore[union-attr]
    assert relay.attachments(B) == {} and relay.attachments(A)[2] == BARNEY


def test_terminate() -> None:
    """Unknown transID 550; a known one detaches; transID 0 detaches everything on the channel."""
    relay = _pair()
    relay.handle(A, Attach(Endpoint.parse("wilma@example.com"), 2))
    assert relay.handle(A, Terminate(13)) == Outcome(Error(550, "unknown transaction-identifier"))
    assert relay.handle(A, Terminate(2)) == Outcome(Ok())
    assert relay.attachments(A) == {1: FRED}
    assert relay.handle(A, Terminate(0)) == Outcome(Ok())
    assert relay.attachments(A) == {}
    assert _code(relay.handle(B, Attach(FRED, 2))) == 250  # fred is free again


def test_data_goes_to_each_attached_recipient() -> None:
    """Each recipient gets a data element naming only itself, on its own channel."""
    relay = _pair()
    data = Data(FRED, (BARNEY, FRED), b"hi")
    outcome = relay.handle(A, data)
    assert outcome.reply == Ok()
    assert outcome.deliveries == (Delivery(B, data.for_recipients([0])),
                                  Delivery(A, data.for_recipients([1])))


def test_data_rules() -> None:
    """Unattached originator 537; all recipients unknown 550; unknown mustUnderstand 504."""
    relay = _pair()
    assert _code(relay.handle(B, Data(FRED, (BARNEY,), b"x"))) == 537
    wilma = Endpoint.parse("wilma@example.com")
    assert _code(relay.handle(A, Data(FRED, (wilma,), b"x"))) == 550
    assert _code(relay.handle(A, Data(FRED, (Endpoint.parse("b@rubble.com"),), b"x"))) == 550
    assert _code(relay.handle(A, Data(FRED, (BARNEY,), b"x", recipient_options=(
        (Option("frob", must_understand=True),),)))) == 504
    mixed = relay.handle(A, Data(FRED, (wilma, BARNEY), b"x"))
    assert mixed.reply == Ok() and [d.target for d in mixed.deliveries] == [B]
    assert _code(relay.handle(A, Bind("example.com", 5))) == 537
    assert _code(relay.handle(A, Ok())) == 550


def test_subaddress_reaches_the_base_attachment() -> None:
    """barney/appl=wb@example.com is delivered to barney's attachment."""
    relay = _pair()
    outcome = relay.handle(A, Data(FRED, (Endpoint.parse("barney/appl=wb@example.com"),), b"x"))
    assert [d.target for d in outcome.deliveries] == [B]


def test_status_request_reports_per_recipient() -> None:
    """statusRequest yields a statusResponse from apex=report to the originator (§5.1)."""
    relay = _pair()
    data = Data(FRED, (BARNEY, Endpoint.parse("wilma@example.com")), b"x",
                options=(Option("statusRequest", 86, must_understand=True),))
    outcome = relay.handle(A, data)
    assert outcome.reply == Ok()
    report = outcome.deliveries[-1]
    assert report.target == A and isinstance(report.operation, Data)
    assert str(report.operation.originator) == "apex=report@example.com"
    assert report.operation.content_type == BEEP_XML
    text = report.operation.content.decode()
    assert "transID='86'" in text and "<reply code='250'" in text and "code='550'" in text


class _Echo:
    """A well-known service that answers every data with the same content, back."""

    def __init__(self) -> None:
        self.seen: list[Endpoint] = []

    def on_data(self, data: Data, recipient: Endpoint) -> Iterable[Data]:
        self.seen.append(recipient)
        return [Data(recipient, (data.originator,), data.content[::-1])]


def test_well_known_service_gets_its_data_and_answers() -> None:
    """Data to apex=pubsub/topic goes to the registered handler; its answer is routed back."""
    relay = _pair()
    echo = _Echo()
    relay.register_service("apex=pubsub", echo)
    topic = Endpoint.parse("apex=pubsub/equity.quote@example.com")
    outcome = relay.handle(A, Data(FRED, (topic,), b"abc"))
    assert echo.seen == [topic] and outcome.reply == Ok()
    assert outcome.deliveries == (Delivery(A, Data(topic, (FRED,), b"cba")),)


def test_channel_closed_drops_its_attachments() -> None:
    """When a channel goes away, so do its endpoints."""
    relay = _pair()
    relay.channel_closed(B)
    assert _code(relay.handle(A, Data(FRED, (BARNEY,), b"x"))) == 550
