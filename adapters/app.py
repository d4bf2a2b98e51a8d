"""`BrokerApp`: one running apexps broker — the core on Kafka, access control, the pubsub service,
the journal follower and the APEX server — started and stopped as one, in dependency order.

`apexps up` / `apexps broker` run exactly this; tests run it in-process too.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import structlog

from adapters.apex import Relay
from adapters.apex.server import ApexServer
from adapters.pubsub.acks import AckRecorder
from adapters.pubsub.handler import PubsubHandler
from broker.access import AccessControl
from broker.core import BrokerCore, OpenReport
from broker.events import WatchTable
from broker.holds import KafkaHolds
from broker.kafka_io import KafkaConfig, Position
from broker.names import SERVICE, WELL_KNOWN_TOPICS
from broker.pubsub import JournalFollower, PubsubService
from broker.recent import DEFAULT_RECENT_BYTES, RecentJournal
from broker.records import AccessEffect, AccessEntry, AccessKind, now_ms
from broker.robust.config import RobustConfig
from broker.robust.fanout import CARRIED_MARGIN_MS
from common.errors import ApexpsError

__all__ = ["DEFAULT_ACCESS_ID", "DEFAULT_TOKENS_ID", "BrokerApp"]

log = structlog.get_logger(__name__)

#: The entry a broker started without `--access` relies on: its own domain may do everything.
DEFAULT_ACCESS_ID = "default:local-domain"
#: Its permission-token counterpart: its own domain receives every token (broker/entitlements.py).
DEFAULT_TOKENS_ID = "default:local-domain-tokens"


class BrokerApp:
    def __init__(self, config: KafkaConfig, *, domain: str = "example.com",
                 host: str = "127.0.0.1", port: int = 0,
                 access_file: str | Path | None = None,
                 peers: list[tuple[str, str, int]] | None = None,
                 accept_peers: list[str] | None = None,
                 redistribute: list[tuple[str, str]] | None = None,
                 security: dict[str, Any] | None = None,
                 robust: RobustConfig | None = None, sequenced: bool = True,
                 recent_bytes: int = DEFAULT_RECENT_BYTES,
                 events: WatchTable | None = None) -> None:
        """`sequenced=False` serves the plain topic path (no link seqs, gap fill or
        heartbeats: what the robust benchmark compares against); `peers`: (domain, host, port)
        of relays to keep a link to (relay-relay mode); `accept_peers`: domains whose relays
        may bind to us; `redistribute`: (topic, domain) pairs this broker redistributes
        (draft §2.4); `security`: ApexServer's TLS and SASL settings (tls, require_tls, sasl,
        require_auth); `recent_bytes`: how much of what the journal follower read is kept in
        memory for gap fills and repairs (broker/recent.py; 0: none, they read Kafka).
        `events`: the resource watch table with its Expires and implicit-watch policies
        (docs/event-binding.md; default: `WatchTable()`)."""
        self.events = events
        self.recent_bytes = recent_bytes
        self.security = dict(security or {})
        self.redistribute = list(redistribute or ())
        self.config, self.domain = config, domain.lower()
        self.peers = list(peers or ())
        self.accept_peers = frozenset(d.lower() for d in accept_peers or ())
        self.host, self.port, self.access_file = host, port, access_file
        self.core = BrokerCore(config, robust=robust)
        self.sequenced = sequenced
        self.report: OpenReport | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.report = await asyncio.to_thread(self.core.open)  # blocking Kafka reads
        # Item state before the follower: it starts where the state's journal replay ended.
        self.items_report = await asyncio.to_thread(self.core.items.recover, self._created)
        self.access = AccessControl(self.core.access)
        await asyncio.to_thread(self._provision_access)
        self.access.start_following()
        self.service = PubsubService(self.core, self.access, self.domain)
        accepted = self.accept_peers
        self.holds = KafkaHolds(self.core.holds)  # hold4Endpoint data, durable in Kafka
        self.relay = Relay(domain=self.domain, may_bind=lambda _ref, peer: peer in accepted,
                           holds=self.holds)
        # What subscribers answered `ok` on their links, as evidence in Kafka (invariant 8).
        self.acks = (AckRecorder(self.core.acks, asyncio.get_running_loop())
                     if self.sequenced else None)
        self.server = ApexServer(self.relay, host=self.host, port=self.port,
                                 answered=None if self.acks is None else self.acks.answered,
                                 **self.security)
        self.handler = PubsubHandler(self.service, self.core.journal, self.server.send,
                                     self.core.links if self.sequenced else None,
                                     self.core.robust, items=self.core.items,
                                     marks=self.core.fanout if self.sequenced else None,
                                     events=self.events)
        self.relay.register_service(SERVICE, self.handler)
        self.core.access.watch(self._access_changed)
        start = self.core.items.resume_positions()
        carried: set[tuple[str, Position]] = set()
        if self.sequenced:
            # What was journaled but not yet on its links when the last broker stopped is
            # sequenced now (broker/robust/fanout.py), not lost.
            marks = await asyncio.to_thread(self.core.fanout.load)
            await asyncio.to_thread(self._begin_epochs_unless_clean)
            for part, offset in marks.items():
                start[part] = min(offset, start.get(part, offset))
            written = self.core.fanout.written_at
            if written is not None:
                carried = await asyncio.to_thread(self.core.links.carried_since,
                                                  written - CARRIED_MARGIN_MS)
        recent = RecentJournal(self.recent_bytes) if self.recent_bytes > 0 else None
        self.core.journal.recent = recent
        self.follower = await asyncio.to_thread(
            JournalFollower, self.config, self.core.codec, self.handler.forward_threadsafe,
            start=start, recent=recent)
        self.handler.on_acked = self.follower.acked
        # Nothing before where the follower begins is forwarded, by either road.
        self.handler.cursor.start(self.follower.start_positions)
        if self.handler.sequenced is not None:
            self.handler.sequenced.follow(self.follower.start_positions, carried,
                                          self.follower.when_read)
        self.follower.start()
        self.handler.start()
        for topic, origin in self.redistribute:
            await asyncio.to_thread(self._prepare_redistribution, topic, origin)
            self.handler.redistribute(topic, origin)
        # From here the journal's and the link log's reports come on this loop's thread, one
        # wake-up each instead of a poll thread's and then the loop's.
        self.core.serve_reports_on(self._loop)
        await self.server.start()
        self.port = self.server.port
        for peer_domain, host, port in self.peers:
            self.server.connect_peer(peer_domain, host, port)

    def _begin_epochs_unless_clean(self) -> None:
        """Link records are sent before Kafka holds them: unless the last broker to serve
        stopped cleanly, some a subscriber saw may be lost, so every link begins a new epoch
        on first use (docs/robust-binding.md §2.5). Then the clean-stop record goes, before
        anything is served."""
        fanout, links = self.core.fanout, self.core.links
        clean = fanout.clean_writer
        if clean is None or clean < links.last_writer:
            count = links.begin_new_epochs()
            if count:
                log.warning("the last broker did not stop cleanly: every link begins a new "
                            "epoch", links=count)
        fanout.running()

    def _stopped_clean(self) -> None:
        """Every link record durable: say so, so the next start keeps the links' epochs."""
        try:
            self.core.links.flush()
            self.core.fanout.stopped_clean(self.core.links.writer)
        except ApexpsError as exc:
            log.warning("clean stop not recorded; the next start begins new link epochs",
                        error=str(exc))

    def _access_changed(self, _entry_id: str, _entry: object) -> None:
        """(Any thread.) Pending watches wait for the access entries (event-binding.md §5)."""
        with contextlib.suppress(RuntimeError):  # the loop is gone: the broker has stopped
            self._loop.call_soon_threadsafe(self.handler.events.access_changed)

    def _created(self, topic: str) -> int | None:
        """When `topic` was created (None: it does not exist), for the item store. The
        well-known topics always exist: their cached messages survive every restart."""
        if topic in WELL_KNOWN_TOPICS:
            return 0
        found = self.core.topics.get(topic)
        return None if found is None else found.created_at

    def _provision_access(self) -> None:
        if self.access_file is not None:
            loaded = self.access.load_file(self.access_file, domain=self.domain)
            self.access.remove(DEFAULT_ACCESS_ID)
            self.access.remove(DEFAULT_TOKENS_ID)
            log.info("access entries loaded", file=str(self.access_file), entries=loaded)
        elif not any(e.entry_id.startswith("file:") for e in self.access.entries()):
            self.access.put(AccessEntry(DEFAULT_ACCESS_ID, f"*@{self.domain}",
                                        ("pubsub:all", "core:data"), AccessEffect.ALLOW,
                                        now_ms()))
            self.access.put(AccessEntry(DEFAULT_TOKENS_ID, f"*@{self.domain}", ("*",),
                                        AccessEffect.ALLOW, now_ms(),
                                        kind=AccessKind.PERMTOKEN))
            log.warning("no access file: every endpoint of the domain may do everything and "
                        "receives every permission token; pass --access FILE for a real "
                        "policy", domain=self.domain)

    def _prepare_redistribution(self, topic: str, origin: str) -> None:
        """Our topic of that name, and the origin's rights on it: configuring redistribution
        is trusting the origin for that topic (forwarded requests, forwarded data)."""
        if topic not in self.core.topics:
            self.core.create_topic(topic, owner=f"{SERVICE}@{self.domain}")
        now = now_ms()
        self.access.put(AccessEntry(f"redistribute:{topic}@{origin}:requests",
                                    f"{SERVICE}@{origin}", ("pubsub:subscribe", "pubsub:cancel"),
                                    AccessEffect.ALLOW, now, topic))
        self.access.put(AccessEntry(f"redistribute:{topic}@{origin}:data",
                                    f"{SERVICE}/{topic}@{origin}", ("core:data",),
                                    AccessEffect.ALLOW, now, topic))

    async def close(self) -> None:
        await self.server.close()
        await self.handler.close()
        if self.acks is not None:
            self.acks.close()
        await asyncio.to_thread(self.follower.stop)
        if self.sequenced:
            await asyncio.to_thread(self._stopped_clean)
        self.access.stop_following()
        await asyncio.to_thread(self.holds.close)
        await asyncio.to_thread(self.core.close)

    async def __aenter__(self) -> BrokerApp:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
