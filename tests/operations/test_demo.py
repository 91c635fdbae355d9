"""`scrapesync demo`: on a machine with nothing configured it runs the whole flow and exits 0,
leaving a published export that holds exactly the records Cloud scraped."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from simulator import generate_records
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.slow

CONFIGURATION = (
    "DATABASE_URL",
    "REDIS_URL",
    "WEBSCRAPER_API_TOKEN",
    "WEBSCRAPER_API_URL",
    "WEBHOOK_TOKEN",
    "SCRAPESYNC_DATASETS",
    "SCRAPESYNC_STATUS_TOKEN",
    "SCRAPESYNC_EXPORT_DIR",
    "SCRAPESYNC_KILL_AT",
)


def _demo(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the demo in a fresh folder with none of scrapesync's variables set."""
    clean = {k: v for k, v in os.environ.items() if k not in CONFIGURATION}
    folder = tmp_path / "demo"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from scrapesync.cli import run; run()",
            "demo",
            "--dir",
            str(folder),
        ],
        cwd=tmp_path,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return done, folder


def _check_export(folder: Path) -> None:
    (path,) = (folder / "exports").glob("*.jsonl")
    exported = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    # the demo's columns name every field, as text but the numeric price
    expected = [
        {"entity_key": r["sku"], **r, "price": float(r["price"])}
        for r in sorted(generate_records(300), key=lambda r: r["sku"])
    ]
    assert exported == expected
    manifest = json.loads(next((folder / "exports").glob("*.manifest.json")).read_text("utf-8"))
    assert (manifest["records"], manifest["state"], manifest["is_published"]) == (
        300,
        "published",
        True,
    )


def test_the_demo_runs_the_whole_flow_without_any_configuration(tmp_path: Path) -> None:
    """No variables, no Redis: in-process queue, 300 records synced, accepted, published,
    announced with valid signatures, nothing left for a reconcile or a maintenance pass, and the
    export written."""
    done, folder = _demo(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "in-process worker thread" in out
    assert "Cloud scraped 300 records and notified 2 times" in out
    assert "synced 300 observations into SQL" in out
    assert "accepted and published" in out
    assert "(run.accepted, dataset.published, dataset.changed); signatures valid" in out
    assert "a second pass: nothing to do" in out
    # the pass every worker runs on its timer finds nothing left, and the status shows it ran
    assert "7. a maintenance pass (every worker's timer): 0 syncs due, 0 jobs queued" in out
    assert "maintenance: last pass 0 s ago" in out
    run_line = next(line for line in out.splitlines() if line.startswith("products-"))
    assert run_line.split()[1:] == ["published", "300", "300", "100%", "0", "0", "yes"]
    assert f"export:   {folder / 'exports'}" in out
    _check_export(folder)
    log_lines = (folder / "scrapesync.log").read_text("utf-8").splitlines()
    events = [json.loads(line)["event"] for line in log_lines]
    assert events.count("notification.accepted") == 2
    assert "attempt.committed" in events
    assert events.count("delivery.delivered") == 3  # accepted, published, changed
    assert "api_token=" not in "".join(log_lines)
    _check_quiet(done)
    _check_queries(out, folder)


def _check_quiet(done: subprocess.CompletedProcess[str]) -> None:
    """The demo's JSON log lines go to its log file alone: its output is its steps and results,
    and nothing comes on standard error."""
    assert '{"ts"' not in done.stdout, done.stdout
    assert done.stderr == "", done.stderr


def _check_queries(out: str, folder: Path) -> None:
    """The two SQL queries the demo prints answer from its database as printed: the products
    under 20 (price a number) and one SKU's price on the run's day, from the history."""
    queries = [line.strip() for line in out.splitlines() if line.startswith("  SELECT ")]
    assert len(queries) == 2, out
    with closing(sqlite3.connect(folder / "scrapesync.db")) as connection:
        cheap = connection.execute(queries[0]).fetchall()
        price = connection.execute(queries[1]).fetchall()
    records = list(generate_records(300))
    under = sorted((float(r["price"]), r["sku"]) for r in records if float(r["price"]) < 20)
    assert [(float(p), sku) for sku, _title, p in cheap] == under
    first = min(records, key=lambda r: r["sku"])
    assert f"entity_key = '{first['sku']}'" in queries[1]
    assert [float(p) for (p,) in price] == [float(first["price"])]


@pytest.mark.redis
def test_the_demo_uses_redis_when_redis_url_answers(tmp_path: Path) -> None:
    """REDIS_URL that answers: the same flow through RQ on a queue of the demo's own."""
    done, folder = _demo(tmp_path, REDIS_URL=REDIS_URL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"RQ on {REDIS_URL} (queue scrapesync-demo-" in done.stdout
    _check_quiet(done)
    _check_export(folder)
