"""The shape a newcomer relies on (docs/development.md): no module over 500 lines, no function
over 80, ``sync/`` keeps only its ground floor directly, and no import cycle between packages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sync", "webhooks", "config", "simulator", "scrapesync")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_GROUND_FLOOR = 15


def _modules() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def test_no_module_is_over_500_lines() -> None:
    """Every module reads in one sitting (migrations aside)."""
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_80_lines() -> None:
    """Every function is one named step."""
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = length
    assert long == {}


def test_sync_holds_its_ground_floor_and_packages_by_concept() -> None:
    """``sync/`` holds at most 15 modules directly; the rest live in named packages."""
    ground = [p.name for p in (ROOT / "sync").glob("*.py") if p.name != "__init__.py"]
    packages = {p.name for p in (ROOT / "sync").iterdir() if (p / "__init__.py").exists()}
    assert len(ground) <= MAX_GROUND_FLOOR, sorted(ground)
    assert {"cloud", "ingest", "acceptance", "runs", "datasets", "delivery", "operations"} <= (
        packages
    )


def _unit(module: str) -> str:
    """What a module counts as in the graph of ``sync``: its package (``sync.runs``), or itself
    on the ground floor (``sync.db``); outside ``sync``, its top-level package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "sync" else parts[0]


def _imports_at_load(path: Path) -> set[str]:
    """The project modules a module imports when it is loaded (an import inside a function,
    or only for type checking, runs later or never)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for inner in ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]:
            if isinstance(inner, ast.Import):
                found.update(alias.name for alias in inner.names)
            elif isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                found.add(inner.module)
                found.update(f"{inner.module}.{alias.name}" for alias in inner.names)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycle_between_the_packages_of_sync_or_the_top_level_packages() -> None:
    """A package of ``sync`` (or a ground-floor module) never imports, through any chain, one
    that imports it back; nor do ``sync``, ``webhooks``, ``config``, ``simulator`` and
    ``scrapesync`` among themselves: the flow reads one way."""
    modules = {_module_name(p): p for p in _modules()}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        source = _unit(name)
        for target in _imports_at_load(path):
            while target not in modules and "." in target:  # `from pkg import name`
                target = target.rsplit(".", 1)[0]
            if target in modules and _unit(target) != source:
                edges.setdefault(source, set()).add(_unit(target))
    cycles = []
    for start in edges:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in edges.get(node, ()):
                if nxt == start:
                    cycles.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert not cycles, cycles
