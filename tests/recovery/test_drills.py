"""Recovery drills with the Procfile's real processes: a whole worker SIGKILLed again and again,
SIGTERM in the middle of a download, PostgreSQL stopped at once and started again, Redis killed
and restarted empty or flushed, and a burst of notifications against max_connections = 10.
After each, the surviving or restarted processes finish every wanted task by themselves.

Leases and sweeps are short here (1 s leases, sub-second to 1 s sweeps); the README's drill
table gives the times these drills measure and what the defaults make of them in production.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from flask import Flask
from sqlalchemy import func, select, text

from scrapesync.processes import Deployment, kill_tree, signal_tree, wait_until
from scrapesync.servers import PrivatePostgres, PrivateRedis
from simulator import CloudState
from simulator.server import SimServer
from sync.bootstrap import Services
from sync.db import UnitOfWork
from sync.models import Attempt, Observation, SyncTask
from sync.queue import RQDispatcher
from tests.harness import (
    WEBHOOK_TOKEN,
    attempts_of,
    deployment_env,
    notify,
    observation_count,
    products_sitemap,
    task_of,
)
from webhooks import create_app

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

RECORDS = 6000  # past one staging batch, so the "mid-download" hold lands inside the stream
LEASE = 1.0
SWEEP = 0.5


def drill_env(
    tmp_path: Path,
    *,
    database_url: str,
    sim: SimServer,
    lease: float = LEASE,
    sweep: float = SWEEP,
    redis_url: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """A worker's or web process's environment for a drill: short leases and sweeps."""
    env = deployment_env(
        tmp_path,
        database_url=database_url,
        sim=sim,
        SCRAPESYNC_LEASE_SECONDS=str(lease),
        SCRAPESYNC_SWEEP_SECONDS=str(sweep),
        SCRAPESYNC_RECONCILE_SECONDS="3600",
        SCRAPESYNC_SHUTDOWN_GRACE_SECONDS="1",
        **extra,
    )
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return env


def _holds(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _finished_job(cloud: CloudState, n: int, *, start: int = 0) -> int:
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.set_generated(job_id, n, start=start)
    cloud.run_job(job_id)
    return job_id


def _downloads(cloud: CloudState, job_id: int) -> int:
    return cloud.requests.count(("GET", f"/api/v1/scraping-job/{job_id}/json"))


def _states(uow: UnitOfWork) -> dict[str, str]:
    with uow.begin() as session:
        return dict(session.execute(select(SyncTask.task_key, SyncTask.state)).all())


def _all_committed(uow: UnitOfWork, count: int) -> bool:
    states = _states(uow)
    return len(states) == count and set(states.values()) == {"committed"}


def _distinct_entities(uow: UnitOfWork) -> tuple[int, int]:
    with uow.begin() as session:
        return session.execute(
            select(func.count(), func.count(func.distinct(Observation.entity_key)))
        ).one()


def _connections(uow: UnitOfWork) -> dict[str, int]:
    """Open connections to the drill's database by kind of process."""
    with uow.begin() as session:
        rows = session.execute(
            text(
                "SELECT application_name, count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1"
            )
        ).all()
    return {str(name): int(n) for name, n in rows}


def _running_attempts(uow: UnitOfWork) -> int:
    with uow.begin() as session:
        return int(
            session.execute(
                select(func.count()).select_from(Attempt).where(Attempt.outcome == "running")
            ).scalar_one()
        )


def test_a_whole_worker_killed_ten_times_mid_download_resumes_each_time_and_stores_once(
    web: Flask,
    services: Services,
    cloud: CloudState,
    sim: SimServer,
    deployment: Deployment,
    tmp_path: Path,
    database_url: str,
    record_property: pytest.RecordProperty,
) -> None:
    """Ten times in a row a worker (rq worker, its work horse and its scheduler) is SIGKILLed
    in the middle of one job's download and a single new worker is started: each restart
    resumes the task within lease + sweep + 10 s, every kill is an attempt, the job is
    downloaded at most once per kill plus once, and each entity is stored exactly once."""
    job_id = _finished_job(cloud, RECORDS)
    key = f"job-{job_id}"
    holds = tmp_path / "holds"
    env = drill_env(tmp_path, database_url=database_url, sim=sim)
    held = {**env, "SCRAPESYNC_HOLD_AT": "mid-download", "SCRAPESYNC_HOLD_FILE": str(holds)}
    notify(web, job_id)
    resumed: list[float] = []

    for kill in range(1, 11):
        worker = deployment.start("worker", held)
        resumed.append(
            wait_until(
                lambda kill=kill: _holds(holds) == kill,  # type: ignore[misc]
                timeout=LEASE + SWEEP + 10,
                what=f"restart {kill} resumes the download",
                report=deployment.logs,
            )
        )
        kill_tree(worker)
    deployment.start("worker", env)
    wait_until(
        lambda: task_of(services, key).state == "committed",
        timeout=LEASE + SWEEP + 30,
        what="the last worker commits",
        report=deployment.logs,
    )
    record_property("resume_seconds", [round(r, 2) for r in resumed])
    print(f"\nSIGKILL drill: resumed after {', '.join(f'{r:.1f}' for r in resumed)} s")
    outcomes = [a.outcome for a in attempts_of(services, key)]
    assert outcomes == ["abandoned"] * 10 + ["committed"]
    assert _downloads(cloud, job_id) <= 11
    assert observation_count(services) == RECORDS
    assert _distinct_entities(services.uow) == (RECORDS, RECORDS)


def test_sigterm_early_in_a_download_hands_the_task_to_the_next_worker_within_a_sweep(
    web: Flask,
    services: Services,
    cloud: CloudState,
    sim: SimServer,
    deployment: Deployment,
    tmp_path: Path,
    database_url: str,
    record_property: pytest.RecordProperty,
) -> None:
    """Heroku's SIGTERM reaches a worker early in a download that cannot finish in its grace:
    the attempt is recorded abandoned and the lease released, so another worker starts the task
    long before the 30 s lease would have let it."""
    job_id = _finished_job(cloud, RECORDS)
    key = f"job-{job_id}"
    holds = tmp_path / "holds"
    env = drill_env(tmp_path, database_url=database_url, sim=sim, lease=30)
    held = {**env, "SCRAPESYNC_HOLD_AT": "mid-download", "SCRAPESYNC_HOLD_FILE": str(holds)}
    notify(web, job_id)
    stopping = deployment.start("worker", held)
    wait_until(lambda: _holds(holds) == 1, timeout=30, what="the download", report=deployment.logs)
    lease_until = task_of(services, key).lease_until
    deployment.start("worker", env)
    signal_tree(stopping, signal.SIGTERM)  # Heroku signals every process of the dyno
    sent = time.monotonic()
    try:
        stopping.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker was still running 30 s after SIGTERM:\n{deployment.logs()}")
    wait_until(
        lambda: task_of(services, key).state == "committed",
        timeout=SWEEP + 20,
        what="the other worker commits",
        report=deployment.logs,
    )
    handed_over = time.monotonic() - sent
    record_property("handover_seconds", round(handed_over, 2))
    print(f"\nSIGTERM drill: committed by the next worker {handed_over:.1f} s after SIGTERM")
    first, second = attempts_of(services, key)
    assert (first.outcome, first.error_class) == ("abandoned", "ShutDownImminentException")
    assert second.outcome == "committed"
    assert second.worker != first.worker
    assert second.started_at < lease_until  # nobody waited out the stopped worker's lease
    assert stopping.returncode == 0
    assert observation_count(services) == RECORDS


def _private_services(
    services: Services, *, uow: UnitOfWork | None = None, redis_url: str | None = None
) -> Services:
    """The test's services pointed at a drill's private database or Redis."""
    from redis import Redis

    changed = services if uow is None else dataclasses.replace(services, uow=uow)
    if redis_url is not None:
        redis = Redis.from_url(redis_url)
        changed = dataclasses.replace(changed, redis=redis, dispatcher=RQDispatcher(redis))
    return changed


def test_postgresql_stopped_at_once_mid_sync_and_started_again_heals_without_a_restart(
    services: Services,
    cloud: CloudState,
    sim: SimServer,
    deployment: Deployment,
    tmp_path: Path,
    private_postgres: PrivatePostgres,
    record_property: pytest.RecordProperty,
) -> None:
    """PostgreSQL dies (immediate stop) while a worker is mid-sync with more tasks queued, and
    comes back 5 s later: without restarting any process, every task commits within two sweep
    intervals (plus the syncs' own time) of the database answering again."""
    sweep = 1.0
    private_postgres.empty()
    uow = private_postgres.uow()
    local = _private_services(services, uow=uow)
    web = create_app(local)
    big = _finished_job(cloud, RECORDS)
    small = [_finished_job(cloud, 20, start=RECORDS + 20 * k) for k in range(3)]
    holds = tmp_path / "holds"
    env = drill_env(
        tmp_path,
        database_url=private_postgres.url,
        sim=sim,
        sweep=sweep,
        SCRAPESYNC_HOLD_AT="mid-download",
        SCRAPESYNC_HOLD_FILE=str(holds),
        SCRAPESYNC_HOLD_SECONDS="2",
        SCRAPESYNC_KILL_ONCE_MARKER=str(tmp_path / "held-once"),
    )
    worker = deployment.start("worker", env)
    assert notify(web, big).status_code == 200
    wait_until(lambda: _holds(holds) == 1, timeout=30, what="the download", report=deployment.logs)
    for job_id in small:
        assert notify(web, job_id).status_code == 200
    private_postgres.stop("immediate")
    time.sleep(5)
    private_postgres.start()
    took = wait_until(
        lambda: _all_committed(uow, 4),
        timeout=2 * sweep + 20,
        what="every task commits",
        report=deployment.logs,
    )
    record_property("recover_seconds", round(took, 2))
    print(f"\nPostgreSQL drill: every task committed {took:.1f} s after the database came back")
    assert worker.poll() is None  # the same worker, never restarted
    assert _running_attempts(uow) == 0
    assert _distinct_entities(uow) == (RECORDS + 60, RECORDS + 60)


@pytest.mark.parametrize("loss", ["killed and restarted empty", "flushed"])
def test_redis_lost_with_tasks_queued_heals_without_a_restart(
    services: Services,
    cloud: CloudState,
    sim: SimServer,
    deployment: Deployment,
    tmp_path: Path,
    database_url: str,
    private_redis: PrivateRedis,
    loss: str,
    record_property: pytest.RecordProperty,
) -> None:
    """Redis loses everything (SIGKILL and an empty restart, or FLUSHALL) while a worker is busy
    and four more tasks wait in its queue: the tasks live on in SQL, and without restarting any
    process they all commit within two sweep intervals of Redis answering again."""
    sweep = 1.0
    local = _private_services(services, redis_url=private_redis.url)
    web = create_app(local)
    big = _finished_job(cloud, RECORDS)
    small = [_finished_job(cloud, 20, start=RECORDS + 20 * k) for k in range(4)]
    holds = tmp_path / "holds"
    env = drill_env(
        tmp_path,
        database_url=database_url,
        sim=sim,
        sweep=sweep,
        redis_url=private_redis.url,
        SCRAPESYNC_HOLD_AT="mid-download",
        SCRAPESYNC_HOLD_FILE=str(holds),
        SCRAPESYNC_HOLD_SECONDS="1",
        SCRAPESYNC_KILL_ONCE_MARKER=str(tmp_path / "held-once"),
    )
    worker = deployment.start("worker", env)
    assert notify(web, big).status_code == 200
    wait_until(lambda: _holds(holds) == 1, timeout=30, what="the download", report=deployment.logs)
    for job_id in small:
        assert notify(web, job_id).status_code == 200
    assert isinstance(local.dispatcher, RQDispatcher)
    queued = [j for j in local.dispatcher.queue.job_ids if j.startswith("sync-")]
    assert len(queued) == 4
    if loss == "flushed":
        private_redis.client().flushall()
    else:
        private_redis.kill()
        private_redis.start()
    took = wait_until(
        lambda: _all_committed(services.uow, 5),
        timeout=2 * sweep + 20,
        what="every task commits",
        report=deployment.logs,
    )
    record_property("recover_seconds", round(took, 2))
    print(f"\nRedis drill ({loss}): every task committed {took:.1f} s after Redis came back")
    assert worker.poll() is None  # the same worker, never restarted
    assert _running_attempts(services.uow) == 0
    assert _distinct_entities(services.uow) == (RECORDS + 80, RECORDS + 80)


def test_a_burst_of_twenty_notifications_syncs_by_itself_within_ten_connections(
    services: Services,
    cloud: CloudState,
    sim: SimServer,
    deployment: Deployment,
    tmp_path: Path,
    private_postgres: PrivatePostgres,
    record_property: pytest.RecordProperty,
) -> None:
    """One web process (the Procfile's gunicorn) and two workers share a PostgreSQL that allows
    ten connections: a burst of twenty notifications is answered 200 and every job syncs, with
    nobody restarted and nothing done by hand."""
    private_postgres.empty()
    uow = private_postgres.uow()
    env = drill_env(tmp_path, database_url=private_postgres.url, sim=sim, lease=5, sweep=1.0)
    jobs = [_finished_job(cloud, 30, start=30 * k) for k in range(20)]
    url = deployment.start_web(env)
    for _ in range(2):
        deployment.start("worker", env)
    codes: list[int] = []
    barrier = threading.Barrier(len(jobs))

    def deliver(job_id: int) -> None:
        form = {"scrapingjob_id": str(job_id), "status": "finished", "sitemap_name": "products"}
        barrier.wait()
        response = httpx.post(f"{url}/webhooks/webscraper/{WEBHOOK_TOKEN}", data=form, timeout=10)
        codes.append(response.status_code)

    threads = [threading.Thread(target=deliver, args=(job_id,)) for job_id in jobs]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes == [200] * len(jobs), deployment.logs()
    wait_until(
        lambda: _all_committed(uow, len(jobs)),
        timeout=60,
        every=0.2,
        what="every job syncs",
        report=lambda: f"{_states(uow)}\n{deployment.logs()}",
    )
    took = time.monotonic() - started
    held = _connections(uow)
    record_property("burst_seconds", round(took, 2))
    print(f"\nmax_connections drill: 20 notifications synced {took:.1f} s after the burst; {held}")
    assert _distinct_entities(uow) == (600, 600)
    assert held.get("scrapesync-web", 0) <= 2  # one idle connection per gunicorn process
