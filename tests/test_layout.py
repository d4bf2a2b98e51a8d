"""The layout's import rule that ruff cannot state: no product module imports another package's
private (`_name`) module or a private name of another package's module; what crosses packages
is public. (The other rules, who may import what, are ruff bans: pyproject.toml and the
ruff.toml files beside the packages.) ops/ and tests/ are left out: benchmarks and tests time and
test private hot paths on purpose."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("common", "broker", "adapters")


def _module(path: Path) -> tuple[str, str]:
    """(the module's dotted name, its package's)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), ".".join(parts[:-1])
    return ".".join(parts), ".".join(parts[:-1])


def _imports(path: Path, text: str) -> list[tuple[int, str, str | None]]:
    """(line, absolute module, imported name or None) for every import in `text`, at `path`."""
    _, package = _module(path)
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found += [(node.lineno, base, alias.name) for alias in node.names]
    return found


def private_crossings(path: Path, text: str | None = None) -> list[str]:
    """Imports in `path` (or `text`, as if at `path`) of another package's private parts."""
    _, package = _module(path)
    bad = []
    for line, module, name in _imports(path, path.read_text() if text is None else text):
        if not module.startswith(PRODUCT):
            continue
        target = module if name is None else f"{module}.{name}"
        parts = target.split(".")
        for i, part in enumerate(parts):
            # a private part: its owner is the package holding it, which must be ours
            if part.startswith("_") and not part.startswith("__"):
                owner = ".".join(parts[:i])
                if owner != package and not package.startswith(owner + ".") and \
                        owner.rpartition(".")[0] != package:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {target}")
                break
    return bad


def test_no_product_module_imports_another_packages_private_module() -> None:
    """Everything used across packages is public: no `from other_pkg._mod import ...`."""
    bad = [hit for top in PRODUCT for path in sorted((ROOT / top).rglob("*.py"))
           for hit in private_crossings(path)]
    assert bad == []


def test_the_rule_sees_a_private_import_across_packages() -> None:
    """The checker itself: crossings are found, imports inside the package are not."""
    server = ROOT / "adapters" / "apex" / "server.py"
    assert private_crossings(server) == []  # imports ._party, ._server_session: its own
    probe = ROOT / "adapters" / "client" / "probe.py"
    text = ("from adapters.apex._party import Watch\nfrom adapters.apex import _party\n"
            "from ..apex.codec import _private\nfrom ._outlet import DataOutlet\n")
    assert [hit.split(": ")[1] for hit in private_crossings(probe, text)] == [
        "adapters.apex._party.Watch", "adapters.apex._party", "adapters.apex.codec._private"]
