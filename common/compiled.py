"""The message path, compiled: Cython builds of the modules every publication and delivery runs
through, loaded in place of their sources only while they are built from exactly those sources.

Why. Flat out, the broker's thread is the interpreter: 88 % of it in libpython, spread over the
~40 Python calls a message takes (read, decode, ingest, encode, acknowledge, render, reply), no
function over 4.4 % (docs/bench-peers.md). No one of them is worth a C twin; all of them compiled
take the eval loop's dispatch off each call, for 15-25 % of the broker's time per message
(docs/performance.md). The sources stay the code: Cython compiles them unchanged, with Python's
semantics (no type annotations read as C types), so a test of the source tests the build too.

How it stays safe. `python -m ops.compile` writes `.compiled/`: one extension a module, and a
manifest of the SHA-256 of each source it was built from. `install()` puts a finder first on
`sys.meta_path` that answers for a module in the manifest only when its source still has that
hash; an edited source is imported as source (and the log at start says how many modules are
compiled), so a stale build never runs. Nothing is compiled where no C compiler or Cython was at
hand, and `APEXPS_PURE_PYTHON=1` switches the builds off, like the C twins (`broker.speedups`).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

__all__ = ["BUILD_DIR", "MODULES", "CompiledFinder", "install", "loaded", "source_hash"]

#: Where `python -m ops.compile` writes the builds and their manifest: beside the packages.
BUILD_DIR = Path(__file__).resolve().parent.parent / ".compiled"

#: The modules a message passes through, broker and client side (profiled: docs/bench-peers.md).
#: A module here must not need its own `__file__` (its extension lives in BUILD_DIR).
MODULES = (
    "common.xml_safe",
    "adapters.beep._channel", "adapters.beep._connection", "adapters.beep._events",
    "adapters.beep._frames", "adapters.beep._mime", "adapters.beep._session",
    "adapters.beep._window",
    "adapters.apex._canonical", "adapters.apex._multipart", "adapters.apex._party",
    "adapters.apex._receipts", "adapters.apex._robust_syntax", "adapters.apex._security",
    "adapters.apex._server_session", "adapters.apex.batch_codec", "adapters.apex.batch_fast",
    "adapters.apex.codec", "adapters.apex.endpoint", "adapters.apex.inre",
    "adapters.apex.options", "adapters.apex.pubsub_codec", "adapters.apex.relay",
    "adapters.apex.robust_codec", "adapters.apex.robust_stamp", "adapters.apex.server",
    "adapters.apex.ticket",
    "adapters.pubsub._deliveries", "adapters.pubsub.acks", "adapters.pubsub.handler",
    "adapters.pubsub.sequenced",
    "adapters.client._received", "adapters.client._transport", "adapters.client.client",
    "adapters.client.publisher", "adapters.client.pubsub_client",
    "adapters.client.resequencer", "adapters.client.robust_client",
    "broker.avro_bytes", "broker.journal", "broker.journal_writer", "broker.kafka_io",
    "broker.kafka_producer", "broker.publish_gate", "broker.pubseq", "broker.recent",
    "broker.records", "broker.report_pipe",
    "broker.delivery.actions", "broker.delivery.core", "broker.delivery.cursor",
    "broker.pubsub._table", "broker.pubsub.ingest", "broker.pubsub.schemas",
    "broker.pubsub.service",
    "broker.robust._link_writer", "broker.robust.acks", "broker.robust.fanout",
    "broker.robust.items", "broker.robust.linkseq",
    "broker.selectors._eval", "broker.selectors._fields", "broker.selectors._index",
)

_MANIFEST = "manifest.json"


def source_hash(path: Path) -> str:
    """What the manifest records of a source: the SHA-256 of its bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


class CompiledFinder:
    """Finds a module's build in BUILD_DIR while its source is the one the build was made from.

    For any other module, or a stale build, it answers None and the normal finders import the
    source."""

    def __init__(self, build_dir: Path, manifest: dict[str, dict[str, str]]) -> None:
        self._dir = build_dir
        self._manifest = manifest
        self.refused: list[str] = []

    @classmethod
    def from_dir(cls, build_dir: Path) -> CompiledFinder | None:
        try:
            data = json.loads((build_dir / _MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("cache_tag") != sys.implementation.cache_tag:
            return None
        modules = data.get("modules")
        return cls(build_dir, modules) if isinstance(modules, dict) else None

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        entry = self._manifest.get(name)
        if entry is None or not path:
            return None
        source = Path(path[0]) / (name.rpartition(".")[2] + ".py")
        try:
            fresh = source_hash(source) == entry["source"]
        except (OSError, KeyError):
            fresh = False
        binary = self._dir / entry.get("binary", "")
        if not fresh or not binary.is_file():
            self.refused.append(name)
            return None
        loader = importlib.machinery.ExtensionFileLoader(name, str(binary))
        return importlib.util.spec_from_file_location(name, binary, loader=loader)


def install() -> CompiledFinder | None:
    """Put the finder first on `sys.meta_path`, once a process; None where nothing is built or
    the builds are switched off."""
    for present in sys.meta_path:
        if isinstance(present, CompiledFinder):
            return present
    if os.environ.get("APEXPS_PURE_PYTHON", "") not in ("", "0"):
        return None
    finder = CompiledFinder.from_dir(BUILD_DIR)
    if finder is not None:
        sys.meta_path.insert(0, finder)
    return finder


def loaded() -> dict[str, bool]:
    """Each module of MODULES this process has imported, and whether it runs compiled."""
    return {name: isinstance(getattr(sys.modules[name], "__loader__", None),
                             importlib.machinery.ExtensionFileLoader)
            for name in MODULES if name in sys.modules}
