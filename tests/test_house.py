"""The shape a newcomer relies on (docs/development.md): no module over 500 lines, no function
over 80, and ``sync/`` keeps only its ground floor directly."""

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
