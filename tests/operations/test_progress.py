"""Long foreground work shows progress on a terminal and stays quiet in a pipe or with --json."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest

from simulator import CloudState
from simulator.server import SimServer
from sync.db import UnitOfWork
from tests.harness import BIN, deployment_env, products_sitemap

pytestmark = [pytest.mark.slow, pytest.mark.redis]

RECORDS = 3000


def on_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run a command with a pseudo-terminal as stdout and stderr, as a person at a shell does."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env, close_fds=True
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal is gone once the command exits
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(leader)
        code = proc.wait(timeout=30)
    return code, b"".join(chunks).decode("utf-8", errors="replace")


def piped(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a command with its output going into a pipe."""
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def env(tmp_path: Path, database_url: str, sim: SimServer, uow: UnitOfWork) -> dict[str, str]:
    """The environment of an operator's shell on this deployment (over empty tables: each
    test's simulated Cloud numbers its jobs from 1001 again)."""
    return deployment_env(tmp_path, database_url=database_url, sim=sim)


def test_a_large_sync_and_its_export_show_progress_on_a_terminal(
    env: dict[str, str], cloud: CloudState, tmp_path: Path
) -> None:
    """`scrapesync sync` draws a bar over the job's records, `export` over the rows written."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, n=RECORDS)
    code, seen = on_terminal([str(BIN / "scrapesync"), "sync", str(job_id)], env)
    assert code == 0, seen
    assert "reading the job's records" in seen
    assert "100%" in seen
    assert f"job-{job_id}: committed" in seen
    code, seen = on_terminal(
        [str(BIN / "scrapesync"), "export", "products", "--out", str(tmp_path / "out")], env
    )
    assert code == 0, seen
    assert "writing records" in seen
    assert "100%" in seen
    assert f"records={RECORDS}" in seen


def test_in_a_pipe_the_same_commands_print_only_their_results(
    env: dict[str, str], cloud: CloudState, tmp_path: Path
) -> None:
    """Piped, there is no bar: sync prints its result lines, export its two paths."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, n=RECORDS)
    synced = piped([str(BIN / "scrapesync"), "sync", str(job_id)], env)
    assert synced.returncode == 0, synced.stderr
    assert "reading the job's records" not in synced.stdout + synced.stderr
    assert "\r" not in synced.stdout + synced.stderr
    results = [line for line in synced.stdout.splitlines() if not line.startswith("{")]
    assert results[0].startswith(f"job-{job_id}: committed")
    exported = piped(
        [str(BIN / "scrapesync"), "export", "products", "--out", str(tmp_path / "out")], env
    )
    assert exported.returncode == 0, exported.stderr
    assert exported.stderr == ""
    lines = exported.stdout.splitlines()
    assert len(lines) == 2
    assert f"records={RECORDS}" in lines[0]
    assert lines[1].endswith(".manifest.json")


def test_reconcile_over_many_pages_shows_the_listing_on_a_terminal_but_not_with_json(
    env: dict[str, str], cloud: CloudState
) -> None:
    """250 Cloud jobs are three pages: the bar counts them; --json on a terminal is pure JSON."""
    sitemap = products_sitemap(cloud)
    for _ in range(250):
        cloud.create_job(sitemap)
    code, seen = on_terminal([str(BIN / "scrapesync"), "reconcile", "--dry-run"], env)
    assert code == 0, seen
    assert "listing Cloud jobs (pages)" in seen
    assert "checking Cloud jobs" in seen
    assert "reconcile: 250 Cloud jobs listed" in seen
    code, seen = on_terminal([str(BIN / "scrapesync"), "reconcile", "--dry-run", "--json"], env)
    assert code == 0, seen
    report = json.loads(seen)
    assert report["listed"] == 250
