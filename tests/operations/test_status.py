"""Status: the same overview as a table, as JSON, and as a page a person reads in a browser."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from flask import Flask
from werkzeug.serving import make_server

from scrapesync.cli import main
from simulator import CloudState, generate_records
from sync.bootstrap import Services
from sync.operations import heartbeat, reconcile, status, status_text
from sync.runs import launch
from tests.harness import drain, notify
from webhooks import create_app

pytestmark = pytest.mark.redis

STATUS_TOKEN = "status-token-9f8e7d"


def _collect(
    web: Flask, services: Services, cloud: CloudState, window: str, n: int, *, broken: bool
) -> str:
    """Launch the products run of ``window`` and let Cloud finish it with ``n`` records."""
    outcome = launch.launch(services, "products", window=window)
    assert outcome.job_id is not None
    records = [dict(r) for r in generate_records(n)]
    for record in records:
        if broken and record["retailer"] == "gamma.example":
            record["price"] = "call us"
    cloud.set_records(outcome.job_id, records)
    cloud.run_job(outcome.job_id)
    notify(web, outcome.job_id, custom_id=outcome.run_id)
    drain(services)
    return outcome.run_id


@pytest.fixture
def history(web: Flask, services: Services, cloud: CloudState) -> dict[str, str]:
    """Three published runs, one rejected run and one still collecting."""
    runs = {
        "first": _collect(web, services, cloud, "2026-11-28", 30, broken=False),
        "second": _collect(web, services, cloud, "2026-11-29", 36, broken=False),
        "third": _collect(web, services, cloud, "2026-11-30", 33, broken=False),
        "rejected": _collect(web, services, cloud, "2026-12-01", 30, broken=True),
    }
    collecting = launch.launch(services, "products", window="2026-12-02")
    runs["collecting"] = collecting.run_id
    reconcile.reconcile(services)
    return runs


@pytest.fixture
def guarded(services: Services) -> Services:
    """The services with a status token configured."""
    settings = dataclasses.replace(services.settings, status_token=STATUS_TOKEN)
    return dataclasses.replace(services, settings=settings)


def _by_id(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {run["run_id"]: run for run in values["runs"]}


@pytest.mark.slow
def test_status_json_has_runs_coverage_verdicts_tasks_outbox_reconcile_and_budget(
    services: Services, history: dict[str, str]
) -> None:
    """`scrapesync status --json`: every part an operator asks about, as plain values."""
    result = CliRunner().invoke(main, ["status", "--json"])
    assert result.exit_code == 0, result.output
    values = json.loads(result.output)
    runs = _by_id(values)
    first = runs[history["first"]]
    assert (first["state"], first["observations"], first["expected_records"]) == (
        "published",
        30,
        30,
    )
    assert first["coverage_percent"] == 100.0
    third = runs[history["third"]]
    assert (third["published"], first["published"]) == (True, False)
    rejected = runs[history["rejected"]]
    assert rejected["state"] == "rejected"
    assert any("gamma.example" in reason for reason in rejected["reasons"])
    gamma = next(p for p in rejected["partitions"] if p["partition"] == "gamma.example")
    assert gamma["state"] == "quarantined"
    assert any("price" in reason for reason in gamma["reasons"])
    collecting = runs[history["collecting"]]
    assert (collecting["state"], collecting["observations"]) == ("collecting", 0)
    assert collecting["launches"][0]["state"] == "created"
    assert values["tasks"]["by_state"]["committed"] == 4
    assert values["tasks"]["oldest_lease_age_seconds"] is None
    assert values["outbox"]["backlog"] == 0
    assert values["last_reconcile"]["state"] == "done"
    assert values["api_budget"]["limit"] == services.settings.api_budget_limit
    assert 0 < values["api_budget"]["remaining"] <= 1000


@pytest.mark.slow
def test_status_prints_a_table_a_person_reads(services: Services, history: dict[str, str]) -> None:
    """`scrapesync status`: one line per run, the reasons under it, then the queues."""
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == [
        "RUN",
        "STATE",
        "RECORDS",
        "EXPECTED",
        "COVERAGE",
        "FAILED",
        "EMPTY",
        "PUBLISHED",
    ]
    third = next(line for line in lines if line.startswith(history["third"]))
    assert third.split() == [history["third"], "published", "33", "33", "100%", "0", "0", "yes"]
    assert f"{history['rejected']}:" in lines
    assert any("partition gamma.example: quarantined" in line for line in lines)
    assert any(line.startswith("tasks: 4 committed") for line in lines)
    assert any(line.startswith("last reconcile: ") for line in lines)


@pytest.mark.slow
def test_the_status_pages_need_the_token(guarded: Services, history: dict[str, str]) -> None:
    """No token: 401 with a basic-auth challenge; the token as ?token=, Bearer or basic-auth
    password: 200; without a configured token the pages are off."""
    client = create_app(guarded).test_client()
    for path in ("/status", "/api/runs"):
        refused = client.get(path)
        assert refused.status_code == 401
        assert refused.headers["WWW-Authenticate"].startswith("Basic")
        assert client.get(path, query_string={"token": "wrong"}).status_code == 401
    basic = base64.b64encode(f"ops:{STATUS_TOKEN}".encode()).decode()
    for headers, query in (
        ({}, {"token": STATUS_TOKEN}),
        ({"Authorization": f"Bearer {STATUS_TOKEN}"}, {}),
        ({"Authorization": f"Basic {basic}"}, {}),
    ):
        answer = client.get("/api/runs", headers=headers, query_string=query)
        assert answer.status_code == 200
        assert answer.headers["Cache-Control"] == "no-store"
        assert history["third"] in {run["run_id"] for run in answer.json["runs"]}
    page = client.get("/status", headers={"Authorization": f"Bearer {STATUS_TOKEN}"})
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert page.mimetype == "text/html"
    assert STATUS_TOKEN not in html
    assert html.count('<tr class="run"') == 5
    assert html.count("<rect ") == 5  # one bar per run in the inline chart
    assert "<script" not in html
    off = dataclasses.replace(
        guarded, settings=dataclasses.replace(guarded.settings, status_token=None)
    )
    assert create_app(off).test_client().get("/status").status_code == 403


@pytest.fixture
def served(guarded: Services) -> Iterator[str]:
    """The web app with the status token, on a loopback socket; yields its base URL."""
    server = make_server("127.0.0.1", 0, create_app(guarded), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join()
    server.server_close()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1200,900",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run does)")
def test_the_status_page_renders_in_headless_chromium(
    served: str, history: dict[str, str], tmp_path: Path
) -> None:
    """A real browser draws the page: a non-trivial screenshot, and the runs table in the DOM."""
    url = f"{served}/status?token={STATUS_TOKEN}"
    png = tmp_path / "status.png"
    shot = _chromium(tmp_path / "profile", f"--screenshot={png}", url)
    assert png.exists(), shot.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 30_000
    dom = _chromium(tmp_path / "profile", "--dump-dom", url)
    assert '<table id="runs">' in dom.stdout, dom.stderr[-2000:]
    for run_id in history.values():
        assert f'data-run-id="{run_id}"' in dom.stdout
    assert dom.stdout.count("<rect ") == 5
    keep = os.environ.get("SCRAPESYNC_SCREENSHOT_TO")  # to look at it: a path for the PNG
    if keep:
        shutil.copyfile(png, keep)


def test_a_held_lease_shows_its_age(services: Services, cloud: CloudState) -> None:
    """A worker holding a lease: the task counts as leased and its lease has an age."""
    from sync.ingest import store
    from sync.operations import status, status_text

    with services.uow.begin() as session:
        store.want_sync(session, 4242, now=services.clock())
        lease = store.claim(session, "job-4242", owner="w1", lease_seconds=60, now=services.clock())
        session.commit()
    assert lease is not None
    values = status.overview(services)
    assert values["tasks"]["by_state"]["leased"] == 1
    assert values["tasks"]["oldest_lease_age_seconds"] >= 0
    assert values["tasks"]["expired_leases"] == 0
    assert "tasks: 1 leased; oldest lease " in status_text.format_table(values)


def test_status_says_when_the_maintenance_pass_last_ran_and_when_it_is_late(
    services: Services,
) -> None:
    """Never run: said so. A pass just now: its age. Three sweep intervals without one: late,
    in the JSON, the text report and the page alike."""
    never = status.overview(services)["maintenance"]
    assert (never["age_seconds"], never["late"]) == (None, True)
    assert "maintenance: never ran" in status_text.format_table(status.overview(services))
    heartbeat.beat(services, summary={"due": 0, "failed": ["outbox_pruned"]})
    fresh = status.overview(services)["maintenance"]
    assert fresh["late"] is False
    assert 0 <= fresh["age_seconds"] < 60
    assert fresh["failed_steps"] == ["outbox_pruned"]
    later = dataclasses.replace(
        services,
        clock=lambda: services.clock() + timedelta(seconds=4 * services.settings.sweep_interval),
    )
    stale = status.overview(later)
    assert stale["maintenance"]["late"] is True
    line = next(
        x for x in status_text.format_table(stale).splitlines() if x.startswith("maintenance:")
    )
    assert "LATE" in line
    assert "failed steps: outbox_pruned" in line
