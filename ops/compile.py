"""Compile the message path (`common.compiled.MODULES`) with Cython into `.compiled/`.

`ops/bootstrap` runs it after every install check; it rebuilds only the modules whose source
changed since their build (or all, for another Cython or Python), and writes the manifest the
finder trusts last, so an interrupted build leaves the old builds or none, never a wrong one.
Where Cython or a C compiler is missing it says so and leaves apexps in pure Python.

    python -m ops.compile [--clean]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from common.compiled import BUILD_DIR, MODULES, source_hash

ROOT = BUILD_DIR.parent
# Python's semantics, not C's: an annotation is never a C type, so the build runs the source's
# code exactly (common/compiled.py); `binding` keeps functions introspectable like Python's.
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True,
              "embedsignature": False}


def _source(name: str) -> Path:
    return ROOT / (name.replace(".", "/") + ".py")


def _stamp() -> str:
    return f"{sys.implementation.cache_tag} cython {version('Cython')}"


def _load(manifest: Path) -> dict[str, dict[str, str]]:
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("stamp") != _stamp():
        return {}
    modules = data.get("modules")
    return modules if isinstance(modules, dict) else {}


def _build(names: list[str], out: Path) -> dict[str, Path]:
    """Each of `names` built; the extensions end up under `out`."""
    from Cython.Build import cythonize
    from Cython.Compiler.Errors import CompileError
    from setuptools import Extension, setup

    # Generated C warns by the hundred about nothing of ours; without -g the build is quicker.
    extensions = [Extension(name, [str(_source(name).relative_to(ROOT))],
                            extra_compile_args=["-w", "-g0"]) for name in names]
    built = {}
    with tempfile.TemporaryDirectory(prefix="apexps-compile-") as tmp:
        modules = []
        for extension in extensions:  # one by one: a module Cython refuses stays Python
            try:
                modules += cythonize([extension], compiler_directives=DIRECTIVES, quiet=True,
                                     build_dir=str(Path(tmp) / "c"))
            except CompileError as error:
                print(f"compile: Cython refused {extension.name}: {error}", file=sys.stderr)
        setup(name="apexps-compiled", ext_modules=modules, script_args=[
            "-q", "build_ext", "--build-lib", str(Path(tmp) / "lib"),
            "--build-temp", str(Path(tmp) / "o"), "-j", "2"])
        for name in names:
            for found in (Path(tmp) / "lib").glob(name.replace(".", "/") + ".*.so"):
                # A rename, never a write over the old file: a running broker maps that one.
                target = out / found.relative_to(Path(tmp) / "lib")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(found, target.with_suffix(".new"))
                target.with_suffix(".new").replace(target)
                built[name] = target
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.compile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clean", action="store_true", help="remove every build and stop")
    args = parser.parse_args(argv)
    if args.clean:
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        return 0
    try:
        import Cython  # noqa: F401
    except ImportError:
        print("compile: no Cython in this environment: apexps runs in pure Python (slower)",
              file=sys.stderr)
        return 0
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        print("compile: no C compiler: apexps runs in pure Python (slower)", file=sys.stderr)
        return 0
    manifest_path = BUILD_DIR / "manifest.json"
    old = _load(manifest_path)
    hashes = {name: source_hash(_source(name)) for name in MODULES}
    keep = {name: entry for name, entry in old.items()
            if hashes.get(name) == entry.get("source") and (BUILD_DIR / entry["binary"]).is_file()}
    todo = [name for name in MODULES if name not in keep]
    if todo:
        print(f"compile: building {len(todo)} of {len(MODULES)} modules of the message path "
              f"with Cython{' (a few minutes)' if len(todo) > 10 else ''}", file=sys.stderr)
        started = time.monotonic()
        # The manifest goes first: a build interrupted half-way must not be trusted.
        manifest_path.unlink(missing_ok=True)
        BUILD_DIR.mkdir(exist_ok=True)
        try:
            built = _build(todo, BUILD_DIR / "lib")
        except Exception as error:  # any failure leaves pure Python, said once
            print(f"compile: the build failed ({error}); apexps runs in pure Python",
                  file=sys.stderr)
            built = {}
        for name, path in built.items():
            keep[name] = {"source": hashes[name], "binary": str(path.relative_to(BUILD_DIR))}
        missing = sorted(set(todo) - set(built))
        if missing:
            print(f"compile: not built, left in pure Python: {', '.join(missing)}",
                  file=sys.stderr)
        print(f"compile: {len(built)} modules built in {time.monotonic() - started:.0f} s",
              file=sys.stderr)
    manifest = {"stamp": _stamp(), "cache_tag": sys.implementation.cache_tag, "modules": keep}
    BUILD_DIR.mkdir(exist_ok=True)
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    tmp.replace(manifest_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
