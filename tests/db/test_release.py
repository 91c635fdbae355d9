"""The release process: `scrapesync db upgrade` migrates the configured database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_db_upgrade_creates_the_schema_in_the_configured_database(tmp_path: Path) -> None:
    """The Procfile's release command builds every table in DATABASE_URL, and is repeatable."""
    url = f"sqlite:///{tmp_path / 'release.db'}"
    env = {"PATH": os.environ["PATH"], "DATABASE_URL": url}
    for _ in range(2):
        done = subprocess.run(
            [str(BIN / "scrapesync"), "db", "upgrade"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
    tables = set(inspect(create_engine(url)).get_table_names())
    assert {"sync_tasks", "observations", "outbox", "alembic_version"} <= tables


@pytest.mark.slow
def test_a_bad_database_url_is_one_clear_line(tmp_path: Path) -> None:
    """An unreachable database fails the release with an error, not a hang."""
    env = {
        "PATH": os.environ["PATH"],
        "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1",
    }
    done = subprocess.run(
        [str(BIN / "scrapesync"), "db", "upgrade"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("error: cannot reach the database:")
    assert "127.0.0.1" in done.stderr
