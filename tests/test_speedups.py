"""The compiled accelerators are built, and can be switched off.

What each one computes is held to the pure-Python code it shortcuts (or a test oracle of its
layout) by the property tests of that code (tests/beep/test_fast_paths.py, tests/apex/); this
file checks only that the build provided them, since a build without a C compiler silently goes
on without (setup.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pytest import MonkeyPatch

from adapters import speedups

_PROBE = (
    "import json; from adapters import speedups; from adapters.beep import _frames, _mime; "
    "from adapters.apex import batch_fast as _batch_fast, _canonical; "
    "from broker.robust import _link_writer; "
    "print(json.dumps([speedups.active(), [_frames._scan_whole is None, "
    "_mime._content_type_only is None, _canonical._match_layout is None, "
    "_batch_fast._scan_batch is None, _link_writer._link_bodies is None]]))"
)


def _probe(**env: str) -> list[object]:
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**os.environ, **env},
                         capture_output=True, text=True, check=True).stdout
    result: list[object] = json.loads(out)
    return result


def test_every_accelerator_is_built() -> None:
    missing = [name for name, on in _probe(APEXPS_PURE_PYTHON="0")[0].items() if not on]
    assert not missing, (
        f"not built: {missing}. Building them needs a C compiler and the Python headers "
        "(apt-get install gcc python3-dev); then run `bash ops/bootstrap` again.")


def test_pure_python_switch_turns_every_accelerator_off() -> None:
    """APEXPS_PURE_PYTHON=1 turns every accelerator off, and each hot path that has a twin runs
    its pure-Python general path; without it, each runs its twin."""
    active, pure = _probe(APEXPS_PURE_PYTHON="1")
    assert active == dict.fromkeys(speedups.ACCELERATORS, False)
    assert pure == [True] * 5
    _, pure = _probe(APEXPS_PURE_PYTHON="0")
    assert pure == [False] * 5


def test_the_broker_says_which_accelerators_it_runs_with(monkeypatch: MonkeyPatch) -> None:
    """The ready line counts them; a missing one is a warning that says how to build it; one
    switched off on purpose is only noted."""
    from structlog.testing import capture_logs

    from adapters.cli import run_cmd

    monkeypatch.delenv("APEXPS_PURE_PYTHON", raising=False)
    assert run_cmd.report_accelerators() == f"{len(speedups.ACCELERATORS)}/" \
        f"{len(speedups.ACCELERATORS)}"
    one_missing = dict.fromkeys(speedups.ACCELERATORS, True) | {speedups.ACCELERATORS[0]: False}
    monkeypatch.setattr(run_cmd.speedups, "active", lambda: one_missing)
    with capture_logs() as logs:
        count = run_cmd.report_accelerators()
    assert count == f"{len(speedups.ACCELERATORS) - 1}/{len(speedups.ACCELERATORS)}"
    (warning,) = logs
    assert warning["log_level"] == "warning" and warning["missing"] == [speedups.ACCELERATORS[0]]
    assert "gcc python3-dev" in warning["fix"]
    monkeypatch.setenv("APEXPS_PURE_PYTHON", "1")
    with capture_logs() as logs:
        run_cmd.report_accelerators()
    assert [entry["log_level"] for entry in logs] == ["info"]
