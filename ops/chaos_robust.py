"""Chaos acceptance run for robust delivery: publishers, subscribers, dropped connections
and kill -9 of the broker, then an exactly-once audit against the journal
(docs/robust-subscribing.md).

Run: `.venv/bin/python -m ops.chaos_robust [--bootstrap H:P] [--messages 20000]
[--drops-every 2.0] [--kills 2] [--seed N] [--rate 400]` (without --bootstrap a throwaway
local Kafka is started). Exit 0 when every check holds, 1 with a precise diff otherwise.

Set-up, every part its own OS process (the harness only feeds, cuts, kills and watches):

* the broker, `apexps broker --heartbeat-ms 500 --access FILE`, on a fixed port; the access file
  lets example.com do everything and grants every permission token to everyone of it, but
  denies token 6747 to s3;
* three `apexps publish --lines` (p1 to t.a, p2 to t.b, p3 to t.a with `--token 6747`), fed
  unique lines (`p1-000123`) by the harness at a steady total `--rate`, so that the run lasts;
* three `apexps subscribe --topic t.a --topic t.b --link chaos-sK --state FILE`, each through a
  `FaultProxy` of its own that drops the live connection at random (exponential intervals of
  mean `--drops-every` seconds, seeded), half of the time leaving the broker side half-dead;
* at 1/3 and 2/3 of the lines fed (for `--kills 2`), the broker is killed with SIGKILL and
  started again on the same port (ready when it prints its `apex:` line).

When every publisher has exited 0 (every line acknowledged, so durable), the harness waits
until each subscriber has printed every message it is entitled to (or `--settle` seconds),
stops it with SIGTERM (it saves its positions and logs its counters), stops the broker, and
checks, with the journal as the source of truth:

* each publisher's lines are in the journal exactly once, in order (publisher seqs 1..n), on
  its topic, with its token;
* each subscriber printed every journal message of t.a and t.b it is entitled to exactly once,
  with the journal's content, topic and token, each source's seqs strictly increasing; s3 got
  nothing with token 6747.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.fault_proxy import FaultProxy

__all__ = ["ChaosConfig", "ChaosReport", "main", "run_chaos"]

ROOT = Path(__file__).resolve().parents[1]
APEXPS = [sys.executable, "-m", "adapters.cli.main"]
DOMAIN = "example.com"
TOPICS = ("t.a", "t.b")
TOKEN = "6747"
#: (name, topic, token) of each publisher
PUBLISHERS = (("p1", "t.a", None), ("p2", "t.b", None), ("p3", "t.a", TOKEN))
#: each subscriber, and the token it is denied
SUBSCRIBERS = (("s1", None), ("s2", None), ("s3", TOKEN))
ACCESS_XML = f"""<access domain='{DOMAIN}'>
  <allow id='chaos-domain' originator='*@{DOMAIN}' tokens='all:all' />
  <grant-token id='chaos-tokens' subscriber='*@{DOMAIN}' tokens='*' />
  <deny-token id='chaos-s3-{TOKEN}' subscriber='s3@{DOMAIN}' tokens='{TOKEN}' />
</access>
"""
#: the feeder writes every this often (seconds)
TICK_S = 0.05
#: for a start, a restart, or a publisher to finish once fed (seconds)
START_TIMEOUT_S = 120.0
FINISH_TIMEOUT_S = 300.0
#: what a violation can be: a process failed; the journal is not the lines fed, once each in
#: order; a subscriber missed messages, got one twice, out of per-source order, one it is not
#: entitled to, one the journal does not hold, or one unlike the journal's
KINDS = ("process", "journal", "missing", "duplicate", "order", "forbidden", "unknown",
         "content")
#: at most this many lines of a diff are printed per kind of violation
DIFF_LINES = 20


def _endpoint(name: str) -> str:
    return f"{name}@{DOMAIN}"


def _say(text: str) -> None:
    print(f"chaos: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    bootstrap: str
    messages: int = 20_000
    #: mean seconds between drops of each subscriber's connection
    drops_every: float = 2.0
    kills: int = 2
    seed: int = 1
    #: lines per second fed to the three publishers together
    rate: float = 400.0
    #: how long subscribers may take to catch up once the publishers are done (seconds)
    settle: float = 180.0
    #: where logs and state files go (default: a new temporary directory, kept)
    workdir: Path | None = None
    namespace: str = field(default_factory=lambda: f"chaos{uuid.uuid4().hex[:10]}")


@dataclass(slots=True)
class SubscriberResult:
    name: str
    delivered: int = 0
    expected: int = 0
    #: seconds from the first line fed until it had everything (None: never)
    complete_after_s: float | None = None
    drops: int = 0
    half_dead: int = 0
    connections: int = 0
    #: the "robust subscriber stopped" record: the stub's counters
    counters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ChaosReport:
    config: ChaosConfig
    workdir: Path
    kills: int = 0
    duration_s: float = 0.0
    feed_s: float = 0.0
    journaled: dict[str, int] = field(default_factory=dict)
    subscribers: list[SubscriberResult] = field(default_factory=list)
    #: (kind, what): kind is one of KINDS
    violations: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def kinds(self) -> set[str]:
        """The kinds of violation found (see KINDS)."""
        return {kind for kind, _ in self.violations}

    def summary(self) -> str:
        c = self.config
        out = [f"{c.messages} messages ({', '.join(f'{k} {v}' for k, v in self.journaled.items())}"
               f" journaled), fed in {self.feed_s:.1f} s, run {self.duration_s:.1f} s;"
               f" broker kills {self.kills}; seed {c.seed}; logs in {self.workdir}",
               f"{'sub':4} {'deliv':>6} {'expect':>6} {'done@s':>7} {'drops':>5} {'half':>4}"
               f" {'conns':>5} {'resume':>6} {'refill':>6} {'gapreq':>6} {'repaird':>7}"
               f" {'holes':>5} {'repairs':>7} {'resets':>6} {'dups':>4} {'stale':>5}"
               f" {'lost':>4}"]
        for s in self.subscribers:
            k = s.counters
            done = "-" if s.complete_after_s is None else f"{s.complete_after_s:.1f}"
            out.append(
                f"{s.name:4} {s.delivered:>6} {s.expected:>6} {done:>7} {s.drops:>5}"
                f" {s.half_dead:>4} {s.connections:>5} {k.get('resumes', '?'):>6}"
                f" {k.get('refilled', '?'):>6} {k.get('gap_requests', '?'):>6}"
                f" {k.get('repaired', '?'):>7} {k.get('holes', '?'):>5}"
                f" {k.get('repairs', '?'):>7} {k.get('resets', '?'):>6}"
                f" {k.get('duplicates', '?'):>4} {k.get('stale', '?'):>5}"
                f" {k.get('lost', '?'):>4}")
        out.append("OK: every check holds" if self.ok else
                   f"FAILED: {len(self.violations)} violation(s)")
        out.extend(f"  [{kind}] {what}" for kind, what in self.violations)
        return "\n".join(out)


# --- the processes -------------------------------------------------------------------------


async def _spawn(*args: str, **kw: Any) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(*APEXPS, *args, cwd=ROOT, **kw)


class _Broker:
    """`apexps broker` on a fixed port, killed and restarted; each run logs to its own file."""

    def __init__(self, config: ChaosConfig, workdir: Path, access: Path) -> None:
        self.config, self.workdir, self.access = config, workdir, access
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.runs = 0

    async def start(self) -> None:
        self.runs += 1
        log = self.workdir / f"broker-{self.runs}.log"
        with log.open("wb") as err:
            self.proc = await _spawn(
                "--log-json", "broker", "--bootstrap", self.config.bootstrap,
                "--namespace", self.config.namespace, "--listen", f"127.0.0.1:{self.port}",
                "--heartbeat-ms", "500", "--access", str(self.access),
                stdout=asyncio.subprocess.PIPE, stderr=err, stdin=asyncio.subprocess.DEVNULL)
        assert self.proc.stdout is not None
        line = (await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT_S)).decode()
        if not line.startswith("apex: "):
            raise RuntimeError(f"the broker did not start (see {log}): {line!r}")
        self.port = int(line.split()[1].rpartition(":")[2])

    async def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class _Subscriber:
    """`apexps subscribe --link --state` through its own FaultProxy; its JSON lines kept."""

    def __init__(self, name: str, denied: str | None, proxy: FaultProxy, workdir: Path,
                 expected: int) -> None:
        self.name, self.denied, self.proxy, self.workdir = name, denied, proxy, workdir
        self.expected = expected
        self.lines: list[dict[str, Any]] = []
        self.keys: set[tuple[str, int]] = set()
        self.logs: list[dict[str, Any]] = []
        self.complete = asyncio.Event()
        self.complete_at: float | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.proc = await _spawn(
            "--log-json", "subscribe", "--server", f"127.0.0.1:{self.proxy.port}",
            "--as", _endpoint(self.name), *[a for t in TOPICS for a in ("--topic", t)],
            "--link", f"chaos-{self.name}", "--state", str(self.workdir / f"{self.name}.json"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL)
        subscribed = asyncio.Event()
        self._tasks = [asyncio.create_task(self._read_out()),
                       asyncio.create_task(self._read_err(subscribed))]
        waiting = asyncio.create_task(subscribed.wait())
        exited = asyncio.create_task(self.proc.wait())
        await asyncio.wait((waiting, exited), timeout=START_TIMEOUT_S,
                           return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        exited.cancel()
        if not subscribed.is_set():
            raise RuntimeError(f"{self.name} did not subscribe (see {self._log})")

    @property
    def _log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    async def _read_out(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with (self.workdir / f"{self.name}.out").open("wb") as copy:
            while line := await self.proc.stdout.readline():
                copy.write(line)
                record = json.loads(line)
                self.lines.append(record)
                self.keys.add((record["source"], record["sourceseq"]))
                if len(self.keys) >= self.expected and not self.complete.is_set():
                    self.complete_at = time.monotonic()
                    self.complete.set()

    async def _read_err(self, subscribed: asyncio.Event) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with self._log.open("wb") as copy:
            while line := await self.proc.stderr.readline():
                copy.write(line)
                if line.startswith(b"{"):
                    self.logs.append(json.loads(line))
                elif line.startswith(b"apexps: subscribed to"):
                    subscribed.set()

    async def stop(self) -> int | None:
        """SIGTERM (it saves its positions and logs its counters); its exit code."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        for task in self._tasks:
            await task
        return self.proc.returncode

    def counters(self) -> dict[str, Any]:
        stopped = [r for r in self.logs if r.get("event") == "robust subscriber stopped"]
        return stopped[-1] if stopped else {}


class _Publisher:
    """`apexps publish --lines` to one topic; the harness writes its stdin."""

    def __init__(self, name: str, topic: str, token: str | None, count: int,
                 workdir: Path) -> None:
        self.name, self.topic, self.token, self.workdir = name, topic, token, workdir
        self.lines = [f"{name}-{i:06d}" for i in range(1, count + 1)]
        self.fed = 0
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, port: int) -> None:
        with (self.workdir / f"{self.name}.log").open("wb") as err:
            self.proc = await _spawn(
                "--log-level", "warning", "publish", "--topic", self.topic, "--lines",
                "--as", _endpoint(self.name), "--server", f"127.0.0.1:{port}",
                *(("--token", self.token) if self.token else ()),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=err)

    async def feed(self, upto: int) -> None:
        """Write lines up to number `upto` (waits while the publisher's pipe is full)."""
        assert self.proc is not None and self.proc.stdin is not None
        if upto > self.fed:
            chunk = "".join(f"{line}\n" for line in self.lines[self.fed:upto])
            self.proc.stdin.write(chunk.encode())
            self.fed = upto
            await self.proc.stdin.drain()

    async def finish(self) -> int:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        return await asyncio.wait_for(self.proc.wait(), FINISH_TIMEOUT_S)


# --- the run -------------------------------------------------------------------------------


def _shares(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


async def _feed(publishers: list[_Publisher], rate: float, milestones: list[asyncio.Event],
                ) -> None:
    """Feed every publisher at its share of `rate`; set milestones[i] once (i+1)/(n+1) of all
    lines are fed."""
    total = sum(len(p.lines) for p in publishers)
    start = time.monotonic()
    while True:
        share = (time.monotonic() - start) * rate / len(publishers)
        await asyncio.gather(*(p.feed(min(len(p.lines), int(share) + 1)) for p in publishers))
        fed = sum(p.fed for p in publishers)
        for i, event in enumerate(milestones):
            if fed >= total * (i + 1) / (len(milestones) + 1):
                event.set()
        if fed >= total:
            return
        await asyncio.sleep(TICK_S)


async def _chaos_kills(broker: _Broker, milestones: list[asyncio.Event],
                       report: ChaosReport, say: Callable[[str], None]) -> None:
    for event in milestones:
        await event.wait()
        await broker.kill9()
        report.kills += 1
        say(f"broker killed with SIGKILL ({report.kills}); restarting on port {broker.port}")
        began = time.monotonic()
        await broker.start()
        say(f"broker ready again after {time.monotonic() - began:.1f} s")


async def _create_topics(port: int) -> None:
    for topic in TOPICS:
        proc = await _spawn("--log-level", "warning", "topic", "create", topic,
                            "--as", _endpoint("admin"), "--server", f"127.0.0.1:{port}",
                            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"topic create {topic}: {err.decode().strip()}")


async def run_chaos(config: ChaosConfig, say: Callable[[str], None] = _say) -> ChaosReport:
    """The whole run, then the audit; the report says what happened and what was wrong."""
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="apexps-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = ChaosReport(config, workdir)
    access = workdir / "access.xml"
    access.write_text(ACCESS_XML)
    rng = random.Random(config.seed)
    began = time.monotonic()
    broker = _Broker(config, workdir, access)
    proxies: list[FaultProxy] = []
    subscribers: list[_Subscriber] = []
    publishers = [_Publisher(name, topic, token, n, workdir) for (name, topic, token), n
                  in zip(PUBLISHERS, _shares(config.messages, len(PUBLISHERS)), strict=True)]
    stop_faults = asyncio.Event()
    faults: list[asyncio.Task[None]] = []
    try:
        await broker.start()
        say(f"broker on port {broker.port}, namespace {config.namespace}, logs in {workdir}")
        await _create_topics(broker.port)
        for name, denied in SUBSCRIBERS:
            proxy = await FaultProxy(broker.port, random.Random(rng.random())).start()
            proxies.append(proxy)
            expected = sum(len(p.lines) for p in publishers
                           if denied is None or p.token != denied)
            subscribers.append(_Subscriber(name, denied, proxy, workdir, expected))
        await asyncio.gather(*(s.start() for s in subscribers))
        for p in publishers:
            await p.start(broker.port)
        say(f"feeding {config.messages} lines at {config.rate:g}/s; a drop every"
            f" {config.drops_every:g} s on average per subscriber; {config.kills} kill(s)")
        faults = [asyncio.create_task(x.inject(config.drops_every, stop_faults))
                  for x in proxies]
        milestones = [asyncio.Event() for _ in range(config.kills)]
        killer = asyncio.create_task(_chaos_kills(broker, milestones, report, say))
        await _feed(publishers, config.rate, milestones)
        report.feed_s = time.monotonic() - began
        say(f"all lines fed after {report.feed_s:.1f} s; waiting for the acknowledgements")
        await killer
        codes = await asyncio.gather(*(p.finish() for p in publishers))
        stop_faults.set()
        for p, code in zip(publishers, codes, strict=True):
            if code != 0:
                _add(report.violations, "process", f"{p.name}: apexps publish exited {code} (see"
                                         f" {workdir / (p.name + '.log')})")
        say(f"publishers done after {time.monotonic() - began:.1f} s; waiting for the"
            " subscribers to catch up")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(s.complete.wait() for s in subscribers)),
                                   config.settle)
        report.duration_s = time.monotonic() - began
        for s in subscribers:
            exit_code = await s.stop()
            if exit_code != 0:
                _add(report.violations, "process",
                     f"{s.name}: apexps subscribe exited {exit_code}")
    finally:
        stop_faults.set()
        for task in faults:
            await task
        for s in subscribers:
            await s.stop()
        for p in publishers:
            if p.proc is not None and p.proc.returncode is None:
                p.proc.kill()
                await p.proc.wait()
        await broker.stop()
        for proxy in proxies:
            await proxy.close()
    for s in subscribers:
        result = SubscriberResult(
            s.name, delivered=len(s.lines), expected=s.expected,
            complete_after_s=None if s.complete_at is None else s.complete_at - began,
            drops=s.proxy.drops, half_dead=s.proxy.half_dead,
            connections=s.proxy.connections, counters=s.counters())
        report.subscribers.append(result)
    journal = await asyncio.to_thread(_read_journal, config)
    _audit(report, publishers, subscribers, journal)
    return report


# --- the audit -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Entry:
    topic: str
    source: str
    source_seq: int
    publisher_seq: int | None
    token: str | None
    content: str


def _read_journal(config: ChaosConfig) -> dict[str, list[_Entry]]:
    """Every publisher's DATA records, and any GAP records (as entries with no content)."""
    from broker.core import BrokerCore
    from broker.kafka_io import KafkaConfig
    from broker.records import RecordKind

    core = BrokerCore(KafkaConfig(bootstrap=config.bootstrap, namespace=config.namespace))
    core.open()
    try:
        out: dict[str, list[_Entry]] = {}
        for name, _, _ in PUBLISHERS:
            out[name] = [
                _Entry(e.topic, e.source, e.source_seq, e.publisher_seq, e.permission_token,
                       e.content.decode() if e.kind is RecordKind.DATA else f"<GAP to {e.gap_to}"
                       f" {e.gap_reason}>")
                for e in core.journal.read_source(_endpoint(name))]
        return out
    finally:
        core.close()


def _add(violations: list[tuple[str, str]], kind: str, what: str) -> None:
    assert kind in KINDS, kind
    violations.append((kind, what))


def _clip(items: list[str]) -> str:
    more = f" … and {len(items) - DIFF_LINES} more" if len(items) > DIFF_LINES else ""
    return "; ".join(items[:DIFF_LINES]) + more


def _runs(seqs: list[int]) -> str:
    """1,2,3,7,8 → '1-3, 7-8'."""
    out: list[str] = []
    for s in sorted(seqs):
        if out and s == int(out[-1].rpartition("-")[2]) + 1:
            out[-1] = f"{out[-1].partition('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ", ".join(out)


def _audit(report: ChaosReport, publishers: list[_Publisher], subscribers: list[_Subscriber],
           journal: dict[str, list[_Entry]]) -> None:
    v = report.violations
    entitled_base: dict[tuple[str, int], _Entry] = {}
    for p in publishers:
        entries = journal[p.name]
        report.journaled[p.name] = len(entries)
        gaps = [e for e in entries if e.content.startswith("<GAP")]
        if gaps:
            _add(v, "journal", f"{p.name}: GAP records in the journal: "
                     f"{_clip([f'seq {e.source_seq} {e.content}' for e in gaps])}")
        data = [e for e in entries if not e.content.startswith("<GAP")]
        pubseqs = [e.publisher_seq for e in data]
        if pubseqs != list(range(1, len(p.lines) + 1)):
            dup = sorted(k for k, n in Counter(pubseqs).items() if n > 1 and k is not None)
            missing = sorted(set(range(1, len(p.lines) + 1)) - set(pubseqs))
            _add(v, "journal", f"{p.name}: journal publisher seqs are not 1..{len(p.lines)}"
                 f" once each in order: {len(data)} records, duplicated [{_runs(dup)}], missing"
                     f" [{_runs(missing)}]")
        wrong = [f"pubseq {e.publisher_seq}: {e.content!r} on {e.topic} token {e.token}"
                 for e in data if e.publisher_seq is not None
                 and (not 1 <= e.publisher_seq <= len(p.lines)
                      or e.content != p.lines[e.publisher_seq - 1]
                      or e.topic != p.topic or e.token != p.token)]
        if wrong:
            _add(v, "journal", f"{p.name}: journal records unlike the lines fed: {_clip(wrong)}")
        seqs = [e.source_seq for e in entries]
        if seqs != sorted(set(seqs)):
            _add(v, "journal", f"{p.name}: journal source seqs not strictly increasing")
        for e in data:
            entitled_base[(e.source, e.source_seq)] = e
    for s in subscribers:
        entitled = {k: e for k, e in entitled_base.items()
                    if e.topic in TOPICS and (s.denied is None or e.token != s.denied)}
        _audit_subscriber(v, s, entitled, entitled_base)


def _audit_subscriber(v: list[tuple[str, str]], s: _Subscriber,
                      entitled: dict[tuple[str, int], _Entry],
                      journal: dict[tuple[str, int], _Entry]) -> None:
    got = [(line["source"], line["sourceseq"]) for line in s.lines]
    counts = Counter(got)
    dups = sorted(k for k, n in counts.items() if n > 1)
    if dups:
        repeats = [f"{a} {b} x{counts[a, b]}" for a, b in dups]
        _add(v, "duplicate", f"{s.name}: delivered more than once: {_clip(repeats)}")
    missing = sorted(set(entitled) - set(counts))
    if missing:
        by_source: dict[str, list[int]] = {}
        for source, seq in missing:
            by_source.setdefault(source, []).append(seq)
        _add(v, "missing", f"{s.name}: {len(missing)} entitled message(s) never delivered: "
                 + "; ".join(f"{src} seqs [{_runs(seqs)}]" for src, seqs in by_source.items()))
    forbidden = [k for k in counts if k in journal and k not in entitled]
    if forbidden:
        which = [f"{a} {b}" for a, b in sorted(forbidden)]
        _add(v, "forbidden", f"{s.name}: delivered {len(forbidden)} message(s) it is not"
             f" entitled to (token {s.denied}): {_clip(which)}")
    unknown = [k for k in counts if k not in journal]
    if unknown:
        _add(v, "unknown", f"{s.name}: delivered messages not in the journal:"
                 f" {_clip([f'{a} {b}' for a, b in sorted(unknown)])}")
    unlike = [f"{line['source']} {line['sourceseq']}: {line.get('content')!r} on"
              f" {line['topic']} vs journal {e.content!r} on {e.topic}"
              for line in s.lines if (e := journal.get((line["source"], line["sourceseq"])))
              and (line.get("content") != e.content or line["topic"] != e.topic
                   or line.get("token") != e.token)]
    if unlike:
        _add(v, "content", f"{s.name}: delivered content unlike the journal: {_clip(unlike)}")
    last: dict[str, int] = {}
    disorder: list[str] = []
    for n, (source, seq) in enumerate(got, 1):
        if seq <= last.get(source, 0):
            disorder.append(f"line {n}: {source} {seq} after {last[source]}")
        last[source] = max(seq, last.get(source, 0))
    if disorder:
        _add(v, "order", f"{s.name}: source seqs out of order: {_clip(disorder)}")


# --- command line --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--bootstrap", help="an existing Kafka (default: start a throwaway one)")
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--drops-every", type=float, default=2.0, metavar="SECONDS",
                    help="mean interval between drops of each subscriber's connection")
    ap.add_argument("--kills", type=int, default=2, help="broker SIGKILLs during publishing")
    ap.add_argument("--seed", type=int, default=None, help="(default: a random one, printed)")
    ap.add_argument("--rate", type=float, default=400.0, help="lines per second, all together")
    ap.add_argument("--settle", type=float, default=180.0,
                    help="seconds the subscribers may take to catch up at the end")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    from adapters.cli import logs

    logs.configure("warning", json=False)  # the audit's own BrokerCore: only its troubles
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    kafka = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from adapters.local.kafka import LocalKafka

        kafka = LocalKafka(Path(tempfile.mkdtemp(prefix="apexps-chaos-kafka-")))
        bootstrap = kafka.start().bootstrap
    try:
        config = ChaosConfig(bootstrap, messages=args.messages, drops_every=args.drops_every,
                             kills=args.kills, seed=seed, rate=args.rate, settle=args.settle,
                             workdir=args.workdir)
        report = asyncio.run(run_chaos(config))
    finally:
        if kafka is not None:
            kafka.stop()
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
