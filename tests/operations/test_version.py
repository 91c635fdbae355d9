"""``scrapesync --version``: which release an operator is running."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.harness import BIN

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_version_is_the_projects_and_needs_no_configuration(tmp_path: Path) -> None:
    """`scrapesync --version` prints the version of pyproject.toml, with no variable set."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    done = subprocess.run(
        [str(BIN / "scrapesync"), "--version"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"scrapesync {version}\n"
