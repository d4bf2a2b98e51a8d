"""The compiled accelerators are built, and can be switched off.

What each one computes is held to its pure-Python twin by the property tests of the code it
speeds up (tests/beep/test_fast_paths.py, tests/apex/); this file checks only that the build
provided them, since a build without a C compiler silently goes on without (setup.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from adapters import speedups

_PROBE = (
    "import json; from adapters import speedups; from adapters.beep import _frames, _mime; "
    "from adapters.apex import _batch_fast, _canonical; from broker.robust import _link_writer; "
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
    its pure-Python version; without it, each runs its twin."""
    active, pure = _probe(APEXPS_PURE_PYTHON="1")
    assert active == dict.fromkeys(speedups.ACCELERATORS, False)
    assert pure == [True] * 5
    _, pure = _probe(APEXPS_PURE_PYTHON="0")
    assert pure == [False] * 5
