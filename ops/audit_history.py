"""A history with known faults, for testing the audit (issue 19): build one, then damage a copy.

Run:
    python -m ops.audit_history build --bootstrap H:P [--messages 600] [--kills 1] [--seed N]
    python -m ops.audit_history damage --bootstrap H:P --from NS --to NS2 \\
        [--remove-link L:SEQ] [--dup-link L:SEQ] [--swap-link L:SEQ:SEQ]
        [--remove-journal SOURCE:SEQ] [--dup-journal SOURCE:SEQ] [--swap-journal SOURCE:SEQ:SEQ]
Each prints one JSON object on stdout: what it built, or the damage it made.

`build` is the chaos run (ops/chaos_robust.py's `run_chaos`, imported): a real broker process,
three publishers (one with permission token 6747), three robust subscribers over fault proxies
(s3 denied that token), dropped connections and `--kills` kill -9s of the broker in the middle,
and the chaos run's own exactly-once check. Then a quiet phase on the same namespace, with the
chaos run's broker and publisher pieces: a fourth publisher writes `--quiet` messages to topic
`t.quiet`, which nobody subscribes to. Its records are the journal records no link carried, so
removing one from a copy is a source hole and nothing else. The output names the namespace,
the publishers, subscribers and links, each source's seq range and each link's DATA link seqs.

`damage` copies every topic of namespace NS into NS2 through Kafka (each record's partition,
key, value, headers and timestamp; NS2's topics are created with NS's partition counts and
cleanup policy) and changes only what it is told to:
- `--remove-link L:SEQ`: link L's DATA record of link seq SEQ is left out (expected finding:
  `missing`, on link L, of the message it carried);
- `--dup-link L:SEQ`: that record is written twice, the copy right after it in its pack
  (`duplicate`);
- `--swap-link L:A:B`: the DATA records of link seqs A and B exchange places in the log
  (`reorder` of every delivery from A up to B, each logged after a later one: one finding when
  no delivery lies between them);
- `--remove-journal S:SEQ`, `--dup-journal S:SEQ`, `--swap-journal S:A:B`: the same on source
  S's journal records (`source_hole`, `source_duplicate`, `source_order`). The journal is
  written without GAP records for what was removed.
A link seq is ambiguous once a link has several epochs (seqs restart at each RESET): `L:SEQ`
names the one of the latest epoch that has it unless written `L:SEQ@EPOCH`.

Offsets. The broker's producer is idempotent, not transactional, so a copied partition has the
same offsets as the original until a damage shifts them. Link records point into the journal
by (partition, offset): the copy rewrites those pointers through the old -> new offset map of
the journal partition, so every undamaged delivery still points at its message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from ops import chaos_robust as chaos

__all__ = ["Damage", "build", "copy_damaged", "main", "namespace_facts"]

QUIET_TOPIC = "t.quiet"
QUIET_PUBLISHER = "p4"
#: what a correct audit reports for each kind of damage
CATEGORY = {"remove-link": "missing", "dup-link": "duplicate", "swap-link": "reorder",
            "remove-journal": "source_hole", "dup-journal": "source_duplicate",
            "swap-journal": "source_order"}


# --- build ---------------------------------------------------------------------------------


async def _quiet_phase(config: chaos.ChaosConfig, workdir: Path, count: int) -> None:
    """A fourth publisher writes `count` lines to a topic nobody subscribes to."""
    broker = chaos._Broker(config, workdir, workdir / "access.xml")
    await broker.start()
    try:
        proc = await chaos._spawn("--log-level", "warning", "topic", "create", QUIET_TOPIC,
                                  "--as", chaos._endpoint("admin"), "--server",
                                  f"127.0.0.1:{broker.port}", stdout=asyncio.subprocess.DEVNULL,
                                  stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"topic create {QUIET_TOPIC}: {err.decode().strip()}")
        publisher = chaos._Publisher(QUIET_PUBLISHER, QUIET_TOPIC, None, count, workdir)
        await publisher.start(broker.port)
        await publisher.feed(count)
        code = await publisher.finish()
        if code != 0:
            raise RuntimeError(f"{QUIET_PUBLISHER}: apexps publish exited {code}")
    finally:
        await broker.stop()


def build(bootstrap: str, *, messages: int, kills: int, seed: int, quiet: int,
          drops_every: float = 2.0, rate: float = 20.0) -> dict[str, Any]:
    """The chaos run plus the quiet phase; what was built, as `namespace_facts` and more."""
    config = chaos.ChaosConfig(bootstrap, messages=messages, kills=kills, seed=seed, rate=rate,
                               drops_every=drops_every, settle=120.0)
    report = asyncio.run(chaos.run_chaos(config, say=lambda text: print(
        f"audit_history: {text}", file=sys.stderr, flush=True)))
    asyncio.run(_quiet_phase(config, report.workdir, quiet))
    return {
        "namespace": config.namespace, "bootstrap": bootstrap, "workdir": str(report.workdir),
        "kills": report.kills, "chaos_ok": report.ok,
        "chaos_violations": [list(v) for v in report.violations],
        "publishers": [{"name": n, "endpoint": chaos._endpoint(n), "topic": t, "token": tok}
                       for n, t, tok in (*chaos.PUBLISHERS, (QUIET_PUBLISHER, QUIET_TOPIC, None))],
        "subscribers": [{"name": n, "endpoint": chaos._endpoint(n), "link": f"chaos-{n}",
                         "topics": list(chaos.TOPICS), "denied_token": d}
                        for n, d in chaos.SUBSCRIBERS],
        "quiet_source": chaos._endpoint(QUIET_PUBLISHER),
        **namespace_facts(bootstrap, config.namespace),
    }


# --- reading and writing whole topics ------------------------------------------------------


@dataclass
class _Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Any


def _topics(admin: AdminClient, namespace: str) -> dict[str, int]:
    """{role: partition count} of the namespace's topics."""
    meta = admin.list_topics(timeout=30)
    prefix = f"{namespace}."
    return {name[len(prefix):]: len(t.partitions) for name, t in meta.topics.items()
            if name.startswith(prefix)}


def _read_all(bootstrap: str, topic: str, partitions: int) -> list[_Rec]:
    """Every record of `topic`, partition by partition, in offset order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"h{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    out: list[_Rec] = []
    try:
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            while True:
                msg = consumer.poll(30)
                if msg is None:
                    raise RuntimeError(f"no progress reading {topic}[{p}]")
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        break
                    raise RuntimeError(f"reading {topic}[{p}]: {error}")
                offset = msg.offset() or 0
                out.append(_Rec(p, offset, msg.key(), msg.value(), msg.timestamp()[1],
                                msg.headers()))
                if offset >= high - 1:
                    break
    finally:
        consumer.close()
    return out


def _create_like(admin: AdminClient, source: str, target: str, partitions: int) -> None:
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, source)])
    described = next(iter(configs.values())).result()
    keep = {k: described[k].value for k in ("cleanup.policy", "retention.ms")
            if k in described and described[k].value is not None}
    futures = admin.create_topics([NewTopic(target, partitions, 1, config=keep)])
    for f in futures.values():
        f.result()


def _write_all(bootstrap: str, topic: str, records: Iterable[_Rec]) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "compression.type": "lz4"})
    n = 0
    for r in records:
        while True:
            try:
                producer.produce(topic, value=r.value, key=r.key, partition=r.partition,
                                 timestamp=r.timestamp, headers=r.headers)
                break
            except BufferError:
                producer.poll(0.5)
        n += 1
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"records for {topic} still unsent after two minutes")
    return n


# --- what a namespace holds ------------------------------------------------------------------


def _decode(value: bytes | None) -> tuple[str, Any] | None:
    from broker.codec import default_codec

    if value is None:
        return None
    try:
        return default_codec().decode(value)
    except Exception:  # a damaged record is copied as it is, never interpreted
        return None


def _link_seq(rec: dict[str, Any]) -> int:
    from broker.robust.linkseq import LinkSeqSpace

    steps = rec["ordinal"] - rec["epoch_start"]
    return 0 if steps == 0 else LinkSeqSpace(rec["bits"]).add(0, steps)


def _link_records(value: bytes | None) -> tuple[str, list[dict[str, Any]]] | None:
    decoded = _decode(value)
    if decoded is None:
        return None
    name, rec = decoded
    return (name, rec["records"]) if name == "link_batch" else (name, [rec])


def namespace_facts(bootstrap: str, namespace: str) -> dict[str, Any]:
    """Each source's journal seqs and each link's DATA link seqs (per epoch), from Kafka."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    parts = _topics(admin, namespace)
    sources: dict[str, list[int]] = defaultdict(list)
    for r in _read_all(bootstrap, f"{namespace}.journal", parts.get("journal", 0)):
        decoded = _decode(r.value)
        if decoded is not None and decoded[1].get("kind") == "DATA":
            sources[decoded[1]["source"]].append(decoded[1]["source_seq"])
    links: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in _read_all(bootstrap, f"{namespace}.links", parts.get("links", 0)):
        got = _link_records(r.value)
        for rec in got[1] if got else []:
            if rec["kind"] == "DATA" and not rec.get("snapshot"):
                links[rec["link"]][rec["epoch"]].append(_link_seq(rec))
    return {
        "topics": parts,
        "sources": {s: {"first": min(q), "last": max(q), "messages": len(q)}
                    for s, q in sorted(sources.items())},
        "links": {link: {str(e): {"first": min(q), "last": max(q), "records": len(q)}
                         for e, q in sorted(epochs.items())}
                  for link, epochs in sorted(links.items())},
    }


# --- damage --------------------------------------------------------------------------------


class UsageError(ValueError):
    """A damage the namespace cannot take (no such record, an ambiguous seq, NS2 exists)."""


@dataclass(frozen=True)
class Damage:
    """One change to make: `kind` (a key of CATEGORY) on `target` (a link or a source)."""

    kind: str
    target: str
    seqs: tuple[int, ...]
    epoch: int | None = None

    @classmethod
    def parse(cls, kind: str, text: str) -> Damage:
        swap = kind.startswith("swap")
        m = re.fullmatch(r"(.+?):(\d+)(?::(\d+))?(?:@(\d+))?", text)
        if m is None or (m[3] is None) == swap or (m[4] and kind.endswith("journal")):
            shape = "A:SEQ:SEQ" if swap else "A:SEQ"
            raise UsageError(f"--{kind} {text!r}: expected {shape}"
                             + ("[@EPOCH]" if kind.endswith("link") else ""))
        seqs = (int(m[2]), int(m[3])) if swap else (int(m[2]),)
        return cls(kind, m[1], seqs, int(m[4]) if m[4] else None)

    def finding(self, source: str | None, source_seq: int | None,
                link_seq: int | None) -> dict[str, Any]:
        """One finding a correct audit makes of this damage, in the findings' own columns."""
        return {"category": CATEGORY[self.kind],
                "link": self.target if self.kind.endswith("link") else None,
                "source": source, "source_seq": source_seq, "link_seq": link_seq}


def _apply(items: list[tuple[int, Any]], edits: list[tuple[str, list[int]]],
           ) -> list[tuple[int, Any]]:
    """`items` ((home, payload) in log order) after each (kind, [original indices]) edit:
    remove one; dup one (the copy right after it, in the same home); swap two payloads (each
    home keeps its place, so the two are logged in each other's place)."""
    cur = [(home, payload, i) for i, (home, payload) in enumerate(items)]
    for kind, where in edits:
        at = [next(k for k, c in enumerate(cur) if c[2] == w) for w in where]
        if kind.startswith("swap"):
            (ha, pa, ia), (hb, pb, ib) = cur[at[0]], cur[at[1]]
            cur[at[0]], cur[at[1]] = (ha, pb, ib), (hb, pa, ia)
        elif kind.startswith("dup"):
            home, payload, _ = cur[at[0]]
            cur.insert(at[0] + 1, (home, payload, -1))
        else:
            del cur[at[0]]
    return [(home, payload) for home, payload, _ in cur]


def _journal_copy(records: list[_Rec], damages: list[Damage],
                  ) -> tuple[list[_Rec], dict[tuple[int, int], int], list[dict[str, Any]]]:
    """The damaged journal, its old -> new offset map, and what each damage hit."""
    where: dict[tuple[str, int], tuple[int, int]] = {}  # (source, seq) -> (partition, index)
    by_part: dict[int, list[_Rec]] = defaultdict(list)
    for r in records:
        by_part[r.partition].append(r)
    for p, recs in by_part.items():
        for i, r in enumerate(recs):
            decoded = _decode(r.value)
            if decoded is not None and decoded[1].get("kind") == "DATA":
                where.setdefault((decoded[1]["source"], decoded[1]["source_seq"]), (p, i))
    edits: dict[int, list[tuple[str, list[int]]]] = defaultdict(list)
    hits = []
    for d in damages:
        missing = [s for s in d.seqs if (d.target, s) not in where]
        if missing:
            raise UsageError(f"--{d.kind}: source {d.target} has no journal record of seq "
                             f"{missing}")
        found = [where[d.target, s] for s in d.seqs]
        p = found[0][0]  # a source's records are all in one partition
        edits[p].append((d.kind, [i for _, i in found]))
        # A swap of A < B logs B, A+1, ..., B-1, A: each of A..B-1 follows a higher seq.
        seqs = range(min(d.seqs), max(d.seqs)) if d.kind.startswith("swap") else d.seqs
        hits.append({"journal_partition": p,
                     "journal_offsets": [by_part[p][i].offset for _, i in found],
                     "expected": [d.finding(d.target, n, None) for n in seqs]})
    out: list[_Rec] = []
    offsets: dict[tuple[int, int], int] = {}
    for p, recs in sorted(by_part.items()):
        new = _apply(list(enumerate(recs)), edits.get(p, []))
        for i, (_, r) in enumerate(new):
            offsets.setdefault((p, r.offset), i)
            out.append(r)
    return out, offsets, hits


def _links_copy(records: list[_Rec], damages: list[Damage],
                offsets: dict[tuple[int, int], int]) -> tuple[list[_Rec], list[dict[str, Any]]]:
    """The damaged link log (packs re-encoded where changed) and what each damage hit."""
    from broker.codec import default_codec

    codec = default_codec()
    by_part: dict[int, list[_Rec]] = defaultdict(list)
    for r in records:
        by_part[r.partition].append(r)
    # Slots: (index of the Kafka record, the link record), in log order per partition.
    slots: dict[int, list[tuple[int, dict[str, Any] | None]]] = {}
    names: dict[tuple[int, int], str] = {}
    for p, recs in by_part.items():
        slots[p] = []
        for i, r in enumerate(recs):
            got = _link_records(r.value)
            if got is None:
                slots[p].append((i, None))  # undecodable or a tombstone: kept verbatim
                continue
            names[p, i] = got[0]
            slots[p].extend((i, rec) for rec in got[1])
    edits: dict[int, list[tuple[str, list[int]]]] = defaultdict(list)
    hits = []
    for d in damages:
        found = []
        for seq in d.seqs:
            cands = [(p, j, rec) for p, ss in slots.items() for j, (_, rec) in enumerate(ss)
                     if rec is not None and rec["link"] == d.target and rec["kind"] == "DATA"
                     and not rec.get("snapshot") and _link_seq(rec) == seq
                     and (d.epoch is None or rec["epoch"] == d.epoch)]
            if not cands:
                raise UsageError(f"--{d.kind}: link {d.target} has no DATA record of link seq "
                                 f"{seq}" + (f" in epoch {d.epoch}" if d.epoch is not None
                                             else ""))
            latest = max(rec["epoch"] for _, _, rec in cands)
            found.append(next(c for c in cands if c[2]["epoch"] == latest))
        edits[found[0][0]].append((d.kind, [j for _, j, _ in found]))
        hits.append({"epoch": found[0][2]["epoch"],
                     "carried": [{"source": rec["source"], "source_seq": rec["source_seq"],
                                  "ordinal": rec["ordinal"]} for _, _, rec in found],
                     "expected": _link_expected(d, [rec for _, _, rec in found], slots)})
    out: list[_Rec] = []
    for p, recs in sorted(by_part.items()):
        packs: dict[int, list[dict[str, Any] | None]] = defaultdict(list)
        for home, rec in _apply(slots[p], edits.get(p, [])):
            packs[home].append(rec)
        for i, r in enumerate(recs):
            content = packs.get(i, [])
            if not content:
                continue  # its only record was removed
            if content == [None]:
                out.append(r)
                continue
            recs_out = [_repoint(rec, offsets) for rec in content if rec is not None]
            if names.get((p, i)) == "link_record" and len(recs_out) == 1:
                value = codec.encode("link_record", recs_out[0])
            else:
                value = codec.encode("link_batch", {"records": recs_out})
            out.append(_Rec(r.partition, r.offset, r.key, value, r.timestamp, r.headers))
    return out, hits


def _link_expected(d: Damage, found: list[dict[str, Any]],
                   slots: dict[int, list[tuple[int, dict[str, Any] | None]]],
                   ) -> list[dict[str, Any]]:
    """What the audit reports of a link damage: a removed delivery is a message missing (it has
    no link seq: the link did not carry it); a copy is a duplicate at its seq; a swap of A < B
    logs B first, so every delivery from A up to (not including) B comes after a later one."""
    one = found[0]
    if d.kind.startswith("remove"):
        return [d.finding(one["source"], one["source_seq"], None)]
    if d.kind.startswith("dup"):
        return [d.finding(one["source"], one["source_seq"], _link_seq(one))]
    low, high = sorted(rec["ordinal"] for rec in found)
    return [d.finding(rec["source"], rec["source_seq"], _link_seq(rec))
            for ss in slots.values() for _, rec in ss
            if rec is not None and rec["link"] == d.target and rec["kind"] == "DATA"
            and not rec.get("snapshot") and rec["epoch"] == one["epoch"]
            and low <= rec["ordinal"] < high]


def _repoint(rec: dict[str, Any], offsets: dict[tuple[int, int], int]) -> dict[str, Any]:
    if rec.get("journal_partition") is None or rec.get("journal_offset") is None:
        return rec
    new = offsets.get((rec["journal_partition"], rec["journal_offset"]))
    return rec if new is None else {**rec, "journal_offset": new}


def copy_damaged(bootstrap: str, source_ns: str, target_ns: str,
                 damages: list[Damage]) -> dict[str, Any]:
    """Copy every topic of `source_ns` to `target_ns` with `damages` made; what was done."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    parts = _topics(admin, source_ns)
    if not parts:
        raise UsageError(f"namespace {source_ns} has no topics")
    if _topics(admin, target_ns):
        raise UsageError(f"namespace {target_ns} exists already; pick a new one")
    journal = _read_all(bootstrap, f"{source_ns}.journal", parts.get("journal", 0))
    new_journal, offsets, journal_hits = _journal_copy(
        journal, [d for d in damages if d.kind.endswith("journal")])
    links = _read_all(bootstrap, f"{source_ns}.links", parts.get("links", 0))
    new_links, link_hits = _links_copy(
        links, [d for d in damages if d.kind.endswith("link")], offsets)
    copied = {}
    for role, n in sorted(parts.items()):
        _create_like(admin, f"{source_ns}.{role}", f"{target_ns}.{role}", n)
        records = {"journal": new_journal, "links": new_links}.get(role)
        if records is None:
            records = _read_all(bootstrap, f"{source_ns}.{role}", n)
        copied[role] = _write_all(bootstrap, f"{target_ns}.{role}", records)
    hits = iter([*journal_hits, *link_hits])
    ordered = [d for d in damages if d.kind.endswith("journal")] + \
        [d for d in damages if d.kind.endswith("link")]
    damage = [{"kind": d.kind, "target": d.target, "seqs": list(d.seqs), **next(hits)}
              for d in ordered]
    return {
        "from": source_ns, "to": target_ns, "copied": copied,
        "damage": damage,
        "expected": [f for one in damage for f in one["expected"]],
    }


# --- command line --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ops.audit_history",
                                 description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="a known history against a real broker")
    b.add_argument("--bootstrap", required=True)
    b.add_argument("--messages", type=int, default=600)
    b.add_argument("--quiet", type=int, default=20, help="messages to the unsubscribed topic")
    b.add_argument("--kills", type=int, default=1)
    b.add_argument("--seed", type=int, default=1)
    # Slow on purpose: the chaos run feeds on a clock and kills at the half-way line, and its
    # publishers must have connected by then (a publisher that finds no broker exits); at 20/s
    # the kill comes 15 s after they start, however loaded the machine.
    b.add_argument("--rate", type=float, default=20.0, help="lines per second, all together")
    b.add_argument("--drops-every", type=float, default=2.0)
    d = sub.add_parser("damage", help="a damaged copy of a namespace")
    d.add_argument("--bootstrap", required=True)
    d.add_argument("--from", dest="source_ns", required=True)
    d.add_argument("--to", dest="target_ns", required=True)
    for kind in CATEGORY:
        d.add_argument(f"--{kind}", action="append", default=[], metavar="WHAT:SEQ")
    args = ap.parse_args(argv)
    from adapters.cli import logs

    logs.configure("warning", json=False)
    began = time.monotonic()
    try:
        if args.command == "build":
            out = build(args.bootstrap, messages=args.messages, kills=args.kills,
                        seed=args.seed, quiet=args.quiet, drops_every=args.drops_every,
                        rate=args.rate)
        else:
            damages = [Damage.parse(kind, text) for kind in CATEGORY
                       for text in getattr(args, kind.replace("-", "_"))]
            out = copy_damaged(args.bootstrap, args.source_ns, args.target_ns, damages)
    except UsageError as exc:
        print(f"audit_history: {exc}", file=sys.stderr)
        return 2
    out["seconds"] = round(time.monotonic() - began, 1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
