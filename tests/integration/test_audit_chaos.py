"""The audit of a short chaos run (ops/chaos_robust.py: three publishers, three subscribers
behind dropping proxies, two kill -9s of the broker) against the suite's Kafka is clean: the
restarts, repairs, resets and refills it provokes leave no source hole, and every link carried
what its subscriber was entitled to, once per epoch, in order."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from adapters.cli.main import main
from ops.chaos_robust import ChaosConfig, run_chaos

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow,
              pytest.mark.usefixtures("spark")]


def test_the_audit_of_a_chaos_run_is_clean(kafka_bootstrap: str, tmp_path: Path) -> None:
    # A slow feed (36 s) puts the kills after the publishers have started even on a loaded
    # machine: a publisher that cannot reach the broker at its start exits.
    config = ChaosConfig(kafka_bootstrap, messages=900, rate=25.0, kills=2, seed=3,
                         drops_every=2.0, settle=150.0, workdir=tmp_path / "chaos")
    report = asyncio.run(asyncio.wait_for(run_chaos(config, say=print), 400))
    assert report.kills == 2 and report.ok, report.summary()

    out = tmp_path / "audit"
    code = main(["audit", "--bootstrap", kafka_bootstrap, "--namespace", config.namespace,
                 "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert {k: v for k, v in summary["counts"].items() if v} == {}
    assert (code, summary["clean"]) == (0, True)
    # (apex=pubsub@example.com, the broker's own source, publishes the well-known topics)
    assert sum(s["messages"] for name, s in summary["per_source"].items()
               if name.startswith("p")) == 900
    # s3 is denied 6747 (p3's token): it expected, and got, t.a and t.b less p3's lines.
    subs = summary["per_subscription"]
    assert {s["link"] for s in subs.values()} == {"chaos-s1", "chaos-s2", "chaos-s3"}
    assert all(s["missing"] == 0 and s["expected"] == s["delivered"] for s in subs.values())
    assert summary["decisions"]["fraction"] == 1.0
