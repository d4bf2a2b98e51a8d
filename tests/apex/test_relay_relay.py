"""Relay-relay mode in the pure core: bind (RFC 3340 §4.4.2), data accepted from a bound relay
(§4.4.4.1 step 1, §4.5.2), routes to other domains, and what ends them."""

from __future__ import annotations

import pytest

from adapters.apex.codec import Attach, Bind, Data, Ok, Option, TargetHop, Terminate
from adapters.apex.endpoint import Endpoint
from adapters.apex.relay import ChannelRef, Delivery, Outcome, Relay
from common.errors import InvalidParameter

FRED, BARNEY = Endpoint.parse("fred@a.example"), Endpoint.parse("barney@b.example")
WILMA = Endpoint.parse("wilma@a.example")
APP, PEER, OTHER = ChannelRef(1, 1), ChannelRef(2, 1), ChannelRef(3, 1)


def _code(outcome: Outcome) -> int:
    return 250 if isinstance(outcome.reply, Ok) else outcome.reply.code


def _relay_b() -> Relay:
    """b.example's relay, which lets a.example bind; barney is attached on APP."""
    relay = Relay("b.example", may_bind=lambda _ref, domain: domain == "a.example")
    assert relay.handle(APP, Attach(BARNEY, 1)).reply == Ok()
    return relay


class TestBind:
    def test_bind_is_refused_by_default(self) -> None:
        """Without a policy saying otherwise, nobody binds (537) and no route appears."""
        relay = Relay("b.example")
        assert _code(relay.handle(PEER, Bind("a.example", 1))) == 537
        assert relay.routes() == {} and relay.bindings(PEER) == {}

    def test_allowed_bind_makes_the_channel_a_route(self) -> None:
        """ok, and the channel is listed as a route to the bound domain."""
        relay = _relay_b()
        assert relay.handle(PEER, Bind("A.Example", 1)) == Outcome(Ok())
        assert relay.bindings(PEER) == {1: "a.example"}
        assert relay.routes() == {"a.example": (PEER,)}

    def test_bind_rules_in_rfc_order(self) -> None:
        """555 for a transID in force (attachments share them), 537 for a domain the policy
        refuses or our own, 504 for an option we must but do not understand."""
        relay = _relay_b()
        assert _code(relay.handle(APP, Bind("a.example", 1))) == 555  # barney's transID
        assert _code(relay.handle(PEER, Bind("a.example", 1))) == 250
        assert _code(relay.handle(PEER, Bind("a.example", 1))) == 555
        assert _code(relay.handle(PEER, Bind("c.example", 2))) == 537
        assert _code(relay.handle(PEER, Bind("b.example", 2))) == 537
        assert _code(relay.handle(OTHER, Bind("a.example", 1, (
            Option("frob", must_understand=True),)))) == 504
        assert relay.bindings(OTHER) == {}

    def test_terminate_releases_the_binding(self) -> None:
        """terminate of the bind's transID (or 0) ends the route; an attach may reuse it."""
        relay = _relay_b()
        relay.handle(PEER, Bind("a.example", 7))
        assert relay.handle(PEER, Terminate(7)) == Outcome(Ok())
        assert relay.routes() == {}
        relay.handle(PEER, Bind("a.example", 7))
        assert relay.handle(PEER, Terminate(0)) == Outcome(Ok())
        assert relay.routes() == {} and relay.bindings(PEER) == {}

    def test_channel_closed_drops_bindings_and_routes(self) -> None:
        """A gone channel routes nowhere, whether bound or added by the shell."""
        relay = _relay_b()
        relay.handle(PEER, Bind("a.example", 1))
        relay.add_route("c.example", OTHER)
        relay.channel_closed(PEER)
        assert relay.routes() == {"c.example": (OTHER,)}
        relay.channel_closed(OTHER)
        assert relay.routes() == {}


class TestDataFromARelay:
    def test_data_from_the_bound_domain_is_delivered_locally(self) -> None:
        """fred@a.example's data arriving on a.example's bound channel reaches barney."""
        relay = _relay_b()
        relay.handle(PEER, Bind("a.example", 1))
        data = Data(FRED, (BARNEY,), b"hi")
        assert relay.handle(PEER, data) == Outcome(Ok(), (Delivery(APP, data),))

    def test_originator_outside_the_bound_domains_is_refused(self) -> None:
        """Spoofing: an originator in another domain, or in ours, is 537 (§4.4.4.1 step 1)."""
        relay = _relay_b()
        relay.handle(PEER, Bind("a.example", 1))
        for who in ("mallory@c.example", "barney@b.example"):
            assert _code(relay.handle(PEER, Data(Endpoint.parse(who), (BARNEY,), b"x"))) == 537
        assert _code(relay.handle(OTHER, Data(FRED, (BARNEY,), b"x"))) == 537  # not bound there

    def test_data_is_not_sent_back_where_it_came_from(self) -> None:
        """A peer sending us data for its own domain gets 550, not a ping-pong."""
        relay = _relay_b()
        relay.handle(PEER, Bind("a.example", 1))
        assert _code(relay.handle(PEER, Data(FRED, (WILMA,), b"x"))) == 550

    def test_transit_to_a_third_domain_with_a_route(self) -> None:
        """Data from a.example for c.example goes on when a route to c.example exists."""
        relay = _relay_b()
        relay.handle(PEER, Bind("a.example", 1))
        carol = Endpoint.parse("carol@c.example")
        assert _code(relay.handle(PEER, Data(FRED, (carol,), b"x"))) == 550
        relay.add_route("c.example", OTHER)
        outcome = relay.handle(PEER, Data(FRED, (carol,), b"x"))
        assert [d.target for d in outcome.deliveries] == [OTHER]


class TestOutbound:
    def test_remote_recipient_goes_over_the_newest_route(self) -> None:
        """With two routes to a domain the newest carries the data; without any, 550."""
        relay = _relay_b()
        data = Data(BARNEY, (FRED,), b"yo")
        assert _code(relay.handle(APP, data)) == 550
        relay.add_route("a.example", PEER)
        relay.add_route("a.example", OTHER)
        assert relay.handle(APP, data) == Outcome(Ok(), (Delivery(OTHER, data),))
        relay.remove_route("a.example", OTHER)
        assert relay.handle(APP, data) == Outcome(Ok(), (Delivery(PEER, data),))

    def test_this_hop_options_stay_here(self) -> None:
        """targetHop='this' options are removed before the data goes to the next relay."""
        relay = _relay_b()
        relay.add_route("a.example", PEER)
        mine, kept = Option("frob", target_hop=TargetHop.THIS), Option("keep",
                                                                        target_hop=TargetHop.ALL)
        outcome = relay.handle(APP, Data(BARNEY, (FRED,), b"x", options=(mine, kept)))
        (delivery,) = outcome.deliveries
        assert isinstance(delivery.operation, Data) and delivery.operation.options == (kept,)

    def test_final_status_request_is_left_to_the_final_relay(self) -> None:
        """A forwarded recipient's 'final' statusRequest is answered by the next relay; a
        local one and one that failed here are reported by us."""
        relay = _relay_b()
        relay.add_route("a.example", PEER)
        request = Option("statusRequest", 86, target_hop=TargetHop.FINAL, must_understand=True)
        forwarded = relay.handle(APP, Data(BARNEY, (FRED,), b"x", options=(request,)))
        assert forwarded.reply == Ok() and [d.target for d in forwarded.deliveries] == [PEER]
        mixed = relay.handle(APP, Data(BARNEY, (FRED, Endpoint.parse("x@c.example")), b"x",
                                       options=(request,)))
        report = mixed.deliveries[-1].operation
        assert isinstance(report, Data) and report.recipients == (BARNEY,)
        assert b"x@c.example" in report.content and b"fred@a.example" not in report.content

    def test_add_route_refuses_our_own_domain(self) -> None:
        """Our own endpoints are never somebody else's to deliver."""
        relay = _relay_b()
        with pytest.raises(InvalidParameter):
            relay.add_route("B.example", PEER)
        assert relay.routes() == {}
