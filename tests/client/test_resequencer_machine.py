"""The subscriber stub against a model broker over a hostile channel (hypothesis.stateful):
whatever is lost, duplicated, reordered, reset, forgotten or wrapped, the application sees every
message exactly once, in per-source order (docs/robust-binding.md §1)."""

from __future__ import annotations

import itertools
from collections import defaultdict

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from adapters.apex.robust_codec import LinkReply
from adapters.apex.robust_stamp import Stamp, StampKind
from adapters.client.resequencer import (
    Action,
    Deliver,
    LinkRefused,
    Lost,
    Positions,
    RequestGap,
    RequestRepair,
    Resequencer,
)

from .resequencer_model import ModelBroker, Sent

LINK = "desk-1"
SOURCES = ("a@example.com", "b@example.com", "c@example.com")
BITS = 16
MAX_GAP = 40
INTERVAL = 1.0


class StubAgainstModel(RuleBasedStateMachine):
    """Random publishes, heartbeats and faults; the drain at the end must make it whole."""

    def __init__(self) -> None:
        super().__init__()
        self.app: dict[str, list[int]] = defaultdict(list)
        self.now = 0.0
        self.notices: list[Action] = []

    @initialize(start=st.sampled_from(["fresh", "near-wrap", "restart"]),
                max_held=st.sampled_from([10, 1000]))
    def start(self, start: str, max_held: int) -> None:
        if start == "fresh":
            self.broker = ModelBroker(LINK, BITS, max_gap=MAX_GAP)
            self.broker.channel.append(Sent(Stamp(LINK, 0, StampKind.RESET, 0,
                                                  time=self.broker.time), b"<linkreset />"))
            positions = None
        else:
            # An application restarting from saved positions just before the 16-bit wrap.
            self.broker = ModelBroker(LINK, BITS, max_gap=MAX_GAP, seq=65_520, epoch=3)
            positions = Positions(LINK, BITS, 3, 65_520, self.broker.time, {})
        self.stub = Resequencer(LINK, BITS, INTERVAL, positions=positions, max_gap=MAX_GAP,
                                   max_held=max_held)
        if start == "restart":
            self._run(self.stub.resume(self.now))

    # --- plumbing ---------------------------------------------------------------------------

    def _run(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Deliver):
                source, seq = action.stamp.source, action.stamp.source_seq
                assert source is not None and seq is not None
                assert action.content == f"{source}:{seq}".encode()
                self.app[source].append(seq)
            elif isinstance(action, RequestGap):
                self.broker.gap(action.document())
            elif isinstance(action, RequestRepair):
                self.broker.repair(action.document())
            else:
                assert not isinstance(action, LinkRefused | Lost), action
                self.notices.append(action)

    def _deliver_one(self) -> None:
        item = self.broker.channel.popleft()
        if isinstance(item, LinkReply):
            self._run(self.stub.on_reply(item, self.now))
        else:
            self._run(self.stub.receive(item.stamp, item.content, self.now))

    # --- the broker's traffic -------------------------------------------------------------

    @rule(source=st.sampled_from(SOURCES), n=st.integers(1, 12))
    def publish(self, source: str, n: int) -> None:
        for _ in range(n):
            self.broker.publish(source)

    @rule()
    def heartbeat(self) -> None:
        self.broker.heartbeat()

    @rule(n=st.integers(1, 20))
    def deliver(self, n: int) -> None:
        for _ in range(min(n, len(self.broker.channel))):
            self._deliver_one()

    # --- faults -----------------------------------------------------------------------------

    @rule(n=st.integers(1, 5))
    def lose(self, n: int) -> None:
        for _ in range(min(n, len(self.broker.channel))):
            self.broker.channel.popleft()

    @rule()
    def duplicate(self) -> None:
        if self.broker.channel:
            self.broker.channel.appendleft(self.broker.channel[0])

    @rule(k=st.integers(1, 6))
    def reorder(self, k: int) -> None:
        ch = self.broker.channel
        if len(ch) > k:
            item = ch[0]
            del ch[0]
            ch.insert(k, item)

    # The rules that end link context are drawn rarely (one try in four acts), so most runs
    # also exercise gap fill rather than always falling back to repair by source.
    @rule(act=st.integers(0, 3))
    def disconnect(self, act: int) -> None:
        if act:
            return
        self.broker.channel.clear()
        self._run(self.stub.resume(self.now))

    @rule(act=st.integers(0, 3))
    def retention_passes(self, act: int) -> None:
        if not act:
            self.broker.forget()

    @rule(act=st.integers(0, 3))
    def broker_resets_the_link(self, act: int) -> None:
        if not act:
            self.broker.reset()

    @rule(dt=st.floats(0.05, 12.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self._run(self.stub.tick(self.now))

    # --- what must always hold ----------------------------------------------------------------

    @invariant()
    def each_source_in_order_and_once(self) -> None:
        for source, seqs in self.app.items():
            assert all(a < b for a, b in itertools.pairwise(seqs)), (source, seqs)
            assert not seqs or seqs[-1] <= self.broker.published[source]

    def teardown(self) -> None:
        """With the faults over, the stub must catch up with everything published."""
        if not hasattr(self, "broker"):
            return
        for _ in range(100):
            while self.broker.channel:
                self._deliver_one()
            complete = all(self.app[s] == list(range(1, self.broker.published[s] + 1))
                           for s in SOURCES)
            if complete and self.stub.idle:
                break
            self.broker.heartbeat()
            while self.broker.channel:
                self._deliver_one()
            self.now += 11.0
            self._run(self.stub.tick(self.now))
        for source in SOURCES:
            assert self.app[source] == list(range(1, self.broker.published[source] + 1)), (
                source, self.app[source], self.stub.counters)
        assert self.stub.idle, self.stub.counters


StubAgainstModel.TestCase.settings = settings(max_examples=200, stateful_step_count=60,
                                              deadline=None)
TestStubAgainstModel = StubAgainstModel.TestCase
