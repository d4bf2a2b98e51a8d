"""The delivery core's rules, one at a time, on fakes (no Kafka, no event loop): coalescing,
the fan-out mark, failed appends, holds during repair, heartbeats, snapshots, withheld items."""

from __future__ import annotations

from broker.delivery import APPENDS_IN_FLIGHT, GATHER_LIMIT, Durable, RepairJob, Send
from broker.robust.link_records import LinkKind
from common.errors import RebuildRefused
from tests.delivery.rig import HEARTBEAT_S, Rig, check_all, repair_resets

FRED, BARNEY = "fred@example.com", "barney@example.com"
T = "q.t"


def _rig(bits: int = 32) -> Rig:
    rig = Rig(bits=bits)
    rig.subscribe(FRED, T, "fred-l")
    rig.subscribe(BARNEY, T, "barney-l")
    return rig


class TestCoalescing:
    def test_an_idle_core_appends_at_once(self) -> None:
        """With nothing in flight, one forwarded entry is one append right away."""
        rig = _rig()
        rig.core.forward([rig.publish(T, "pub")])
        assert [len(a.records) for a in rig.links.appends] == [2]

    def test_what_comes_while_an_append_is_unsettled_is_gathered_in_order(self) -> None:
        """Entries forwarded in one turn while APPENDS_IN_FLIGHT appends are unsettled go as
        one append at the end of the turn, settled or not, and every link carries each once,
        in order."""
        rig = _rig()
        entries = [rig.publish(T, "pub") for _ in range(20)]
        for e in entries:
            rig.core.forward([e])
        assert len(rig.links.appends) == APPENDS_IN_FLIGHT
        rig.deferred.run_all()  # the end of the turn: nothing has settled
        assert [len(a.records) for a in rig.links.appends] == [2, 2 * 19]
        assert len(rig.links.unsettled()) == 2
        for link in ("fred-l", "barney-l"):
            assert [(seq, s) for _, seq, _, s in rig.data_on(link)] == \
                [(k + 1, k + 1) for k in range(20)]
        check_all(rig)

    def test_a_full_gathering_is_appended_without_waiting(self) -> None:
        """GATHER_LIMIT items waiting are appended even while an append is unsettled."""
        rig = Rig()
        rig.subscribe(FRED, T, "fred-l")
        rig.core.forward([rig.publish(T, "pub")])
        for _ in range(GATHER_LIMIT):
            rig.core.forward([rig.publish(T, "pub")])
        assert [len(a.records) for a in rig.links.appends] == [1, GATHER_LIMIT]

    def test_records_are_sent_at_once_in_assignment_order(self) -> None:
        """The link log is off the critical path: an append's records are sent as soon as
        they are assigned, in order, before Kafka holds them; `Durable` follows each settling,
        whichever settles first."""
        rig = _rig()
        rig.core.forward([rig.publish(T, "pub")])
        rig.core.forward([rig.publish(T, "pub")])
        rig.deferred.run_all()  # the end of the turn: a second append
        assert [seq for _, seq, _, _ in rig.data_on("fred-l")] == [1, 2]
        assert not [a for a in rig.wire.actions if isinstance(a, Durable)]
        first, second = rig.links.unsettled()
        rig.links.settle(second)
        rig.deferred.run_all()
        assert [[r.link_seq for r in a.records] for a in rig.wire.actions
                if isinstance(a, Durable)] == [[2, 2]]
        rig.links.settle(first)
        rig.deferred.run_all()
        assert [seq for _, seq, _, _ in rig.data_on("fred-l")] == [1, 2]
        check_all(rig)


class TestMark:
    def test_the_mark_never_passes_an_unsettled_append(self) -> None:
        """Until its link records are durable, a forwarded entry holds the mark below it."""
        rig = _rig()
        a, b = rig.publish(T, "pub"), rig.publish(T, "pub")
        rig.core.forward([a])
        rig.core.forward([b])  # gathered behind a
        part = a.position.partition
        assert rig.core.mark()[part] == a.position.offset
        rig.links.settle(rig.links.unsettled()[0])
        rig.deferred.run_all()  # a is durable, b now appended but unsettled
        assert rig.core.mark()[part] == b.position.offset
        rig.settle_all()
        assert rig.core.mark()[part] == b.position.offset + 1

    def test_entries_held_by_a_repair_hold_the_mark(self) -> None:
        """What a repair holds back is not on its link yet: the mark stays below it."""
        rig = _rig()
        rig.core.repair(RepairJob("fred-l", 7, FRED, (("pub", 0),)))
        e = rig.publish(T, "pub")
        rig.core.forward([e])
        rig.settle_all()  # barney's copy is durable; fred's is held
        assert rig.core.mark()[e.position.partition] == e.position.offset


class TestFailedAppends:
    def test_after_a_failed_record_the_link_begins_a_new_epoch(self) -> None:
        """A record sent but never durable: the link's next append starts with a reset (a new
        epoch), which is what tells the subscriber, and its (epoch, seq) is never given to
        another message; the mark passes it (its entry is on the link, under the reset)."""
        rig = _rig()
        first = rig.publish(T, "pub")
        rig.core.forward([first])
        append = rig.links.unsettled()[0]
        fred_index = next(i for i, r in enumerate(append.records) if r.link == "fred-l")
        rig.links.settle(append, frozenset({fred_index}))
        rig.deferred.run_all()
        assert [(e, seq) for e, seq, _, _ in rig.data_on("fred-l")] == [(0, 1)]
        rig.core.forward([rig.publish(T, "pub")])
        rig.settle_all()
        kinds = [(r.kind, r.epoch, r.link_seq) for r in rig.wire.on("fred-l")]
        assert kinds == [(LinkKind.RESET, 0, 0), (LinkKind.DATA, 0, 1), (LinkKind.RESET, 1, 0),
                         (LinkKind.DATA, 1, 1)]
        assert [seq for _, seq, _, _ in rig.data_on("barney-l")] == [1, 2]
        check_all(rig)


class TestRepair:
    def test_held_entries_follow_the_catch_up_none_lost_none_twice(self) -> None:
        """While the catch-up is read, live entries for the link wait; afterwards the link
        carries the reset, the catch-up, then the held entries the catch-up did not have."""
        rig = _rig()
        for _ in range(3):
            rig.core.forward([rig.publish(T, "pub")])
        rig.settle_all()
        rig.core.repair(RepairJob("fred-l", 9, FRED, (("pub", 1),)))
        live = [rig.publish(T, "pub") for _ in range(2)]
        rig.core.forward(live)
        rig.settle_all()
        assert [s for _, _, _, s in rig.data_on("barney-l")] == [1, 2, 3, 4, 5]
        assert [s for _, _, _, s in rig.data_on("fred-l")] == [1, 2, 3]  # 4, 5 held
        rig.answer_reads()
        rig.settle_all()
        fred = rig.data_on("fred-l")
        assert [(ep, s) for ep, _, _, s in fred] == \
            [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (1, 4), (1, 5)]
        [(reset, repair)] = list(repair_resets(rig))
        assert (reset.link, reset.epoch, repair.trans_id) == ("fred-l", 1, 9)
        [answer] = rig.wire.answers()
        assert answer.error is None and (answer.epoch, answer.link_seq) == (1, 2)
        check_all(rig)

    def test_the_catch_up_ends_where_forward_stood(self) -> None:
        """A message journaled but not yet handed over when the repair began is not in the
        catch-up: it comes live after it, once."""
        rig = _rig()
        rig.core.forward([rig.publish(T, "pub")])
        rig.settle_all()
        rig.core.repair(RepairJob("fred-l", 6, FRED, (("pub", 0),)))
        unread = rig.publish(T, "pub")  # the follower has not reached it
        rig.answer_reads()
        rig.settle_all()
        rig.core.forward([unread])
        rig.settle_all()
        assert [(ep, s) for ep, _, _, s in rig.data_on("fred-l")] == [(0, 1), (1, 1), (1, 2)]
        check_all(rig)

    def test_without_the_followers_start_held_entries_the_catch_up_has_are_dropped(
            self) -> None:
        """When where the follower began is not known, the catch-up reads to the end of the
        journal and may hold what the link also held; each goes on the link once."""
        rig = _rig()
        rig.core._follow_start = None  # as before `follow` is called
        rig.core.forward([rig.publish(T, "pub")])
        rig.settle_all()
        rig.core.repair(RepairJob("fred-l", 5, FRED, (("pub", 1),)))
        held = rig.publish(T, "pub")
        rig.core.forward([held])
        [read] = rig.reader.pending()
        assert read.until is None
        rig.answer_reads()  # the catch-up holds `held` too
        rig.settle_all()
        assert [(ep, s) for ep, _, _, s in rig.data_on("fred-l")] == [(0, 1), (1, 2)]
        check_all(rig)

    def test_the_answer_follows_the_last_catch_up_item(self) -> None:
        """The RepairAnswer is emitted after the Send holding the catch-up's last item, once
        the link log holds it (the answer names that item)."""
        rig = _rig()
        rig.core.forward([rig.publish(T, "pub")])
        rig.settle_all()
        rig.core.repair(RepairJob("fred-l", 3, FRED, (("pub", 0),)))
        rig.answer_reads()
        assert rig.wire.answers() == []  # sent, not yet durable
        rig.settle_all()
        actions = rig.wire.actions
        [answer] = rig.wire.answers()
        last = max(i for i, a in enumerate(actions) if isinstance(a, Send))
        held = [i for i, a in enumerate(actions) if isinstance(a, Durable)
                and any(r.link == "fred-l" and r.link_seq == answer.link_seq for r in a.records)]
        assert held and last < held[-1] < actions.index(answer)
        assert [seq for _, seq, _, _ in rig.data_on("fred-l")][-1] == answer.link_seq

    def test_a_refused_repair_changes_nothing_and_releases_what_it_held(self) -> None:
        """A 570 from the read answers the requester; no new epoch; held entries go on in the
        old epoch after what the link already carried."""
        rig = _rig()
        rig.core.forward([rig.publish(T, "pub")])
        rig.settle_all()
        rig.core.repair(RepairJob("fred-l", 4, FRED, (("pub", 0),)))
        rig.core.forward([rig.publish(T, "pub")])
        rig.settle_all()
        [read] = rig.reader.pending()
        rig.reader.answer(read, RebuildRefused("too much"))
        rig.deferred.run_all()
        rig.settle_all()
        assert [(ep, seq, s) for ep, seq, _, s in rig.data_on("fred-l")] == [(0, 1, 1), (0, 2, 2)]
        [answer] = rig.wire.answers()
        assert isinstance(answer.error, RebuildRefused)
        check_all(rig)

    def test_a_second_request_waits_for_the_first_and_a_third_replaces_the_second(
            self) -> None:
        """One repair of a link at a time; of the requests waiting behind it only the newest
        is served."""
        rig = _rig()
        for trans in (1, 2, 3):
            rig.core.repair(RepairJob("fred-l", trans, FRED, (("pub", 0),)))
        assert len(rig.reader.reads) == 1
        rig.answer_reads()
        rig.settle_all()
        rig.answer_reads()
        rig.settle_all()
        assert [a.job.trans_id for a in rig.wire.answers()] == [1, 3]


class TestHeartbeats:
    def test_only_idle_links_get_heartbeats(self) -> None:
        """After a heartbeat interval, a link that carried nothing gets a heartbeat; one that
        carried data meanwhile does not."""
        rig = _rig()
        rig.core.tick()  # both links start being watched
        rig.clock.now = HEARTBEAT_S - 1
        rig.routes.subs[T].pop(BARNEY)
        rig.routes.subscribe(BARNEY, "other", "barney-l")
        rig.core.forward([rig.publish(T, "pub")])  # fred's link is busy
        rig.settle_all()
        rig.clock.now = HEARTBEAT_S + 0.5
        rig.core.tick()
        rig.settle_all()
        beats = [r.link for _, r, _ in rig.wire.sent() if r.kind is LinkKind.HEARTBEAT]
        assert beats == ["barney-l"]
        check_all(rig)

    def test_a_held_link_gets_no_heartbeat(self) -> None:
        """A link under repair is not idle: its subscriber awaits the catch-up."""
        rig = _rig()
        rig.core.tick()
        rig.core.repair(RepairJob("fred-l", 1, FRED, (("pub", 0),)))
        rig.clock.now = 2 * HEARTBEAT_S
        rig.core.tick()
        rig.settle_all()
        beats = [r.link for _, r, _ in rig.wire.sent() if r.kind is LinkKind.HEARTBEAT]
        assert beats == ["barney-l"]


class TestSnapshots:
    def test_a_snapshot_meets_the_live_stream_with_no_gap_and_no_duplicate(self) -> None:
        """Queued in the step a subscription becomes visible, the state comes first on the
        link and every later message follows it, contiguous."""
        rig = Rig()
        rig.subscribe(FRED, T, "fred-l")
        state = [rig.publish(T, "pub") for _ in range(3)]
        rig.core.forward(state)
        rig.subscribe(BARNEY, T, "barney-l")
        assert rig.core.queue_snapshot(BARNEY, "barney-l", state) == 3
        live = rig.publish(T, "pub")
        rig.core.forward([live])
        rig.settle_all()
        barney = [(r.link_seq, r.snapshot, r.source_seq) for r in rig.wire.on("barney-l")
                  if r.kind is LinkKind.DATA]
        assert barney == [(1, True, 1), (2, True, 2), (3, True, 3), (4, False, 4)]
        check_all(rig)

    def test_then_hears_whether_the_snapshot_became_durable(self) -> None:
        """The snapshot's callback says False when a record of it failed."""
        rig = _rig()
        e = rig.publish(T, "pub")
        heard: list[bool] = []
        rig.core.queue_snapshot(FRED, "fred-l", [e], heard.append)
        rig.links.settle(rig.links.unsettled()[0], frozenset({0}))
        rig.deferred.run_all()
        assert heard == [False]


class TestWithheld:
    def test_a_message_a_subscriber_may_not_see_takes_no_seq_on_its_link(self) -> None:
        """The token filter runs before seqs are assigned: barney's link stays contiguous
        without the secret, fred's carries it."""
        rig = _rig()
        rig.routes.denied.add((BARNEY, "secret"))
        rig.core.forward([rig.publish(T, "pub"), rig.publish(T, "pub", token="secret"),
                          rig.publish(T, "pub")])
        rig.settle_all()
        assert [(seq, s) for _, seq, _, s in rig.data_on("barney-l")] == [(1, 1), (2, 3)]
        assert [(seq, s) for _, seq, _, s in rig.data_on("fred-l")] == [(1, 1), (2, 2), (3, 3)]
        assert not rig.core.entitled(rig.journal[1], BARNEY)  # a gap fill sends it withheld
        check_all(rig)


class TestWrap:
    def test_link_seqs_wrap_to_one_never_zero(self) -> None:
        """At the resolution's maximum the next seq is 1; 0 belongs to resets alone."""
        rig = Rig(bits=2)  # seqs 1, 2, 3, then 1
        rig.subscribe(FRED, T, "fred-l")
        for _ in range(5):
            rig.core.forward([rig.publish(T, "pub")])
            rig.settle_all()
        assert [seq for _, seq, _, _ in rig.data_on("fred-l")] == [1, 2, 3, 1, 2]
        check_all(rig)


class TestSelection:
    """Selection is the Routes' (over stored fields); the core gives a seq only to what a
    link's subscriptions select, so a selecting link stays contiguous."""

    @staticmethod
    def _odd(e: object) -> bool:
        return getattr(e, "source_seq", 0) % 2 == 1

    def test_a_message_the_selector_does_not_take_takes_no_link_seq(self) -> None:
        rig = Rig()
        rig.subscribe(FRED, T, "fred-l")
        rig.core.claimed(BARNEY, rig.links.claim("barney-l", BARNEY))
        rig.routes.subscribe(BARNEY, T, "barney-l", select=self._odd)
        for _ in range(6):
            rig.core.forward([rig.publish(T, "pub")])
        rig.settle_all()
        assert [(seq, s) for _, seq, _, s in rig.data_on("fred-l")] == \
            [(k, k) for k in range(1, 7)]
        assert [(seq, s) for _, seq, _, s in rig.data_on("barney-l")] == [(1, 1), (2, 3), (3, 5)]
        check_all(rig)

    def test_a_repair_catch_up_carries_only_what_the_link_selects(self) -> None:
        rig = Rig()
        rig.core.claimed(BARNEY, rig.links.claim("barney-l", BARNEY))
        rig.routes.subscribe(BARNEY, T, "barney-l", select=self._odd)
        for _ in range(6):
            rig.core.forward([rig.publish(T, "pub")])
        rig.settle_all()
        rig.core.repair(RepairJob("barney-l", 3, BARNEY, (("pub", 1),)))
        rig.answer_reads()
        rig.settle_all()
        assert [(ep, s) for ep, _, _, s in rig.data_on("barney-l")] == \
            [(0, 1), (0, 3), (0, 5), (1, 3), (1, 5)]
        check_all(rig)


class TestWhenSettled:
    def test_a_gap_fill_waits_for_what_its_link_was_sent_to_settle(self) -> None:
        """Records are sent before the link log holds them, so a gap fill of a seq just sent
        waits until the appends that carried the link's records so far have settled (durable
        or failed), not for later ones, nor for other links' alone."""
        rig = _rig()
        rig.core.forward([rig.publish(T, "pub")])
        called: list[str] = []
        rig.core.when_settled("fred-l", lambda: called.append("fred"))
        rig.core.forward([rig.publish(T, "pub")])  # gathered, then appended: a later append
        rig.deferred.run_all()
        first, second = rig.links.unsettled()
        rig.links.settle(second)
        rig.deferred.run_all()
        assert called == []
        rig.links.settle(first, frozenset({0}))  # a failed record counts as settled
        rig.deferred.run_all()
        assert called == ["fred"]
        rig.core.when_settled("nobody-l", lambda: called.append("nobody"))
        assert called == ["fred", "nobody"]  # nothing settling on it: at once


class TestCatchUpDurableFirst:
    def test_a_catch_up_is_sent_once_durable_and_live_items_wait_behind_it(self) -> None:
        """A repair's catch-up is not live traffic: it is sent only once the link log holds
        it, so what a crash can lose unlogged is only live data, which the fan-out mark sends
        again (robust-binding §2.5); whatever is appended after it waits, keeping link order;
        a catch-up record that failed is not sent."""
        rig = _rig()
        rig.core.forward([rig.publish(T, "pub")])
        rig.settle_all()
        rig.core.repair(RepairJob("fred-l", 5, FRED, (("pub", 0),)))
        rig.answer_reads()
        rig.deferred.run_all()  # the reset and the catch-up (pub#1) appended, not sent
        sent = len(rig.wire.sent())
        rig.core.forward([rig.publish(T, "pub")])
        rig.deferred.run_all()  # appended: fred's and barney's copies wait behind them
        assert len(rig.links.unsettled()) == 2
        assert len(rig.wire.sent()) == sent
        assert [r.kind for r in rig.wire.on("fred-l")] == [LinkKind.RESET, LinkKind.DATA]
        catch_up = rig.links.unsettled()[0]
        assert [r.link for r in catch_up.records] == ["fred-l", "fred-l"]
        rig.links.settle(catch_up, frozenset({1}))  # the catch-up's data record failed
        rig.deferred.run_all()
        new = [(r.link, r.kind, r.epoch, r.link_seq) for _, r, _ in rig.wire.sent()[sent:]]
        assert new == [("fred-l", LinkKind.RESET, 1, 0), ("fred-l", LinkKind.DATA, 1, 2),
                       ("barney-l", LinkKind.DATA, 0, 2)]
        rig.settle_all()
        assert [a.error is not None for a in rig.wire.answers()] == [True]
        check_all(rig)
