"""The compiled message path (`common.compiled`): built, in use, and never stale.

What a build computes is its source's code (Cython with Python's semantics), and the whole suite
runs against the builds where they exist, so this file checks only that they are there, that the
finder hands them out, and that it refuses one whose source changed since.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.machinery import ExtensionFileLoader
from pathlib import Path

from common import compiled

_PROBE = (
    "import importlib, json; from common import compiled; "
    "[importlib.import_module(name) for name in compiled.MODULES]; "
    "print(json.dumps(compiled.loaded()))"
)


def _loaded(**env: str) -> dict[str, bool]:
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**os.environ, **env},
                         capture_output=True, text=True, check=True).stdout
    result: dict[str, bool] = json.loads(out)
    return result


def test_every_module_of_the_message_path_runs_compiled() -> None:
    source = [name for name, built in _loaded(APEXPS_PURE_PYTHON="0").items() if not built]
    assert not source, (
        f"imported as source: {source}. `bash ops/bootstrap` builds them (it needs Cython, from "
        "the dev extra, and a C compiler); `python -m ops.compile` says what it could not build")


def test_the_pure_python_switch_turns_the_builds_off() -> None:
    loaded = _loaded(APEXPS_PURE_PYTHON="1")
    assert set(loaded) == set(compiled.MODULES)
    assert not any(loaded.values())


def _tree(tmp_path: Path, text: str) -> tuple[compiled.CompiledFinder, Path]:
    package = tmp_path / "pkg"
    package.mkdir()
    source = package / "mod.py"
    source.write_text(text)
    binary = tmp_path / "build" / "pkg" / "mod.cpython-311-x86_64-linux-gnu.so"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"built from the first text")
    manifest = {"pkg.mod": {"source": compiled.source_hash(source),
                            "binary": str(binary.relative_to(tmp_path / "build"))}}
    return compiled.CompiledFinder(tmp_path / "build", manifest), source


def test_the_finder_hands_out_a_build_while_its_source_is_unchanged(tmp_path: Path) -> None:
    finder, source = _tree(tmp_path, "X = 1\n")
    spec = finder.find_spec("pkg.mod", [str(source.parent)])
    assert spec is not None and isinstance(spec.loader, ExtensionFileLoader)
    assert spec.origin == str(tmp_path / "build" / "pkg" / "mod.cpython-311-x86_64-linux-gnu.so")
    assert finder.find_spec("pkg.other", [str(source.parent)]) is None


def test_an_edited_source_is_imported_as_source_not_as_its_stale_build(tmp_path: Path) -> None:
    finder, source = _tree(tmp_path, "X = 1\n")
    source.write_text("X = 2\n")
    assert finder.find_spec("pkg.mod", [str(source.parent)]) is None
    assert finder.refused == ["pkg.mod"]


def test_a_missing_build_or_manifest_leaves_the_sources(tmp_path: Path) -> None:
    finder, source = _tree(tmp_path, "X = 1\n")
    next((tmp_path / "build").rglob("*.so")).unlink()
    assert finder.find_spec("pkg.mod", [str(source.parent)]) is None
    assert compiled.CompiledFinder.from_dir(tmp_path / "nowhere") is None
    (tmp_path / "build" / "manifest.json").write_text("{not json")
    assert compiled.CompiledFinder.from_dir(tmp_path / "build") is None
    (tmp_path / "build" / "manifest.json").write_text(json.dumps(
        {"cache_tag": "cpython-10", "modules": {}}))
    assert compiled.CompiledFinder.from_dir(tmp_path / "build") is None
