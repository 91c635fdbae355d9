"""Crash safety with real processes: workers and the web process are SIGKILLed at named points
and what they leave behind is recovered without losing a task or duplicating a record."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from flask import Flask
from sqlalchemy import select

from simulator import CloudState
from simulator.server import SimServer
from sync.bootstrap import Services
from sync.ingest import sweeper
from sync.ingest.store import count_rows
from sync.models import Notification, Observation, SyncTask
from tests.harness import (
    BIN,
    WEBHOOK_TOKEN,
    attempts_of,
    deployment_env,
    notify,
    observation_count,
    products_sitemap,
    run_worker,
    task_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

RECORDS = 6000  # more than one staging batch, so "mid-download" lands inside the stream


@pytest.fixture
def env(tmp_path: Path, database_url: str, sim: SimServer) -> dict[str, str]:
    """The environment of a worker or web process of this deployment (short leases)."""
    return deployment_env(
        tmp_path, database_url=database_url, sim=sim, SCRAPESYNC_LEASE_SECONDS="2"
    )


def _outcomes(services: Services, key: str) -> list[str]:
    return [a.outcome for a in attempts_of(services, key)]


def _distinct_entities(services: Services) -> int:
    with services.uow.begin() as session:
        keys = session.execute(select(Observation.entity_key)).scalars().all()
    return len(set(keys))


@pytest.mark.parametrize("kill_at", ["after-lease", "mid-download", "mid-upsert"])
def test_a_worker_killed_before_its_commit_loses_nothing_and_duplicates_nothing(
    web: Flask, services: Services, cloud: CloudState, env: dict[str, str], kill_at: str
) -> None:
    """SIGKILL before the commit leaves no data and a leased task; once the lease expires the
    sweeper queues it again and the next worker stores exactly one observation per entity."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, n=RECORDS)
    key = f"job-{job_id}"
    notify(web, job_id)
    killed = run_worker(env, kill_at=kill_at)
    assert "terminated unexpectedly" in killed.stderr + killed.stdout, killed.stderr[-2000:]
    task = task_of(services, key)
    assert (task.state, task.lease_token) == ("leased", 1)
    assert _outcomes(services, key) == ["running"]
    assert observation_count(services) == 0
    time.sleep(2.5)  # the dead worker's lease runs out
    assert sweeper.sweep(services).enqueued == 1
    recovered = run_worker(env)
    assert recovered.returncode == 0, recovered.stderr[-2000:]
    assert task_of(services, key).state == "committed"
    assert _outcomes(services, key) == ["abandoned", "committed"]
    assert observation_count(services) == RECORDS == _distinct_entities(services)


def test_a_worker_killed_after_its_commit_before_acknowledging_is_harmless(
    web: Flask, services: Services, cloud: CloudState, env: dict[str, str]
) -> None:
    """SIGKILL after the commit: RQ never hears success, but the data and the task state are
    already durable; recovery finds nothing to do and writes nothing twice."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, n=RECORDS)
    key = f"job-{job_id}"
    notify(web, job_id)
    killed = run_worker(env, kill_at="after-commit")
    assert "terminated unexpectedly" in killed.stderr + killed.stdout, killed.stderr[-2000:]
    assert task_of(services, key).state == "committed"
    assert observation_count(services) == RECORDS
    time.sleep(2.5)
    assert sweeper.sweep(services).enqueued == 0
    assert run_worker(env).returncode == 0
    assert _outcomes(services, key) == ["committed"]
    assert observation_count(services) == RECORDS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_web_process_killed_between_commit_and_answer_makes_cloud_retry_harmless(
    services: Services, cloud: CloudState, env: dict[str, str], tmp_path: Path
) -> None:
    """The web worker dies after storing the notification but before answering; Cloud's retry
    reaches the restarted worker and the job still gets exactly one pending sync."""
    port = _free_port()
    web = subprocess.Popen(
        [
            str(BIN / "gunicorn"),
            "--workers",
            "1",
            "--bind",
            f"127.0.0.1:{port}",
            "webhooks:create_app()",
        ],
        env={
            **env,
            "SCRAPESYNC_KILL_AT": "intake-after-commit",
            "SCRAPESYNC_KILL_ONCE_MARKER": str(tmp_path / "killed-once"),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        cloud.notify_url = f"http://127.0.0.1:{port}/webhooks/webscraper/{WEBHOOK_TOKEN}"
        cloud.notify_delays = (1.0, 3.0)
        job_id = cloud.create_job(products_sitemap(cloud))
        cloud.run_job(job_id, n=10)  # Cloud notifies, the web worker dies, Cloud retries
        assert cloud.wait_for_notifications(timeout=20)
    finally:
        web.terminate()
        web.wait(timeout=10)
    sent = cloud.notifications_sent
    assert [d["ok"] for d in sent] == [False, True], sent
    assert (tmp_path / "killed-once").exists()
    task = task_of(services, f"job-{job_id}")
    assert (task.state, task.requested_generation) == ("pending", 1)
    with services.uow.begin() as session:
        assert count_rows(session, Notification) == 2
        assert count_rows(session, SyncTask) == 1
