"""Issue 32 with the Procfile's real workers: a worker killed in the window between taking a job
off the queue and starting it, and the maintenance lock lost between two ticks. Either way the
surviving or restarted workers sync every task by themselves."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from flask import Flask
from rq.job import Job
from sqlalchemy import select

from scrapesync.processes import Deployment, kill_tree, wait_until
from scrapesync.servers import PrivateRedis
from simulator import CloudState
from simulator.server import SimServer
from sync import db
from sync.bootstrap import Services
from sync.db import UnitOfWork
from sync.models import MaintenanceRun
from sync.operations import heartbeat, maintenance
from sync.queue import RecordingDispatcher, RQDispatcher, sync_job_id
from tests.harness import (
    attempts_of,
    deployment_env,
    notify,
    observation_count,
    products_sitemap,
    task_of,
)
from webhooks import create_app

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SWEEP = 1.0


def _env(tmp_path: Path, database_url: str, sim: SimServer, **extra: str) -> dict[str, str]:
    return deployment_env(
        tmp_path,
        database_url=database_url,
        sim=sim,
        SCRAPESYNC_LEASE_SECONDS="5",
        SCRAPESYNC_SWEEP_SECONDS=str(SWEEP),
        SCRAPESYNC_RECONCILE_SECONDS="3600",
        SCRAPESYNC_SHUTDOWN_GRACE_SECONDS="1",
        **extra,
    )


def _finished_job(cloud: CloudState, n: int) -> int:
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, n=n)
    return job_id


def _pass_lock_free(uow: UnitOfWork) -> bool:
    """Whether no process holds the lock of a maintenance pass under way."""
    with db.alone(uow, maintenance._PASS_LOCK_SPACE, heartbeat.MAINTENANCE) as free:
        return free


def _holds(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _last_beat(uow: UnitOfWork) -> object:
    with uow.begin() as session:
        return heartbeat.last(session)


def test_a_worker_killed_between_taking_a_job_and_starting_it_leaves_no_task_behind(
    web: Flask,
    services: Services,
    cloud: CloudState,
    sim: SimServer,
    deployment: Deployment,
    tmp_path: Path,
    database_url: str,
) -> None:
    """A worker takes a sync job off the queue, then waits to fork its work horse until its
    maintenance pass ends; killed there, every process at once, it leaves a job whose hash says
    queued in no list. A new worker's pass queues it again and the task syncs, once."""
    holds, armed = tmp_path / "holds", tmp_path / "held-once"
    env = _env(tmp_path, database_url, sim)
    held = {
        **env,
        "SCRAPESYNC_HOLD_AT": "maintenance-pass",
        "SCRAPESYNC_HOLD_FILE": str(holds),
        "SCRAPESYNC_KILL_ONCE_MARKER": str(armed),
    }
    armed.touch()  # no hold while the worker starts: starting RQ's scheduler forks too
    first = deployment.start("worker", held)
    wait_until(
        lambda: "Job OK (reconcile-" in deployment.logs(),
        timeout=30,
        what="the worker listens, its first pass's reconcile done",
        report=deployment.logs,
    )
    armed.unlink()  # the next pass holds, and so does any fork of the worker's
    wait_until(lambda: _holds(holds) == 1, timeout=30, what="a pass held", report=deployment.logs)
    job_id = _finished_job(cloud, 300)
    key = f"job-{job_id}"
    assert notify(web, job_id).status_code == 200
    dispatcher = services.dispatcher
    assert isinstance(dispatcher, RQDispatcher)
    wanted = sync_job_id(key, 1, 0)
    wait_until(
        lambda: dispatcher.queue.intermediate_queue.get_job_ids() == [wanted],
        timeout=30,
        what="the worker takes the job",
        report=deployment.logs,
    )
    kill_tree(first)
    status = dispatcher.redis.hget(Job.key_for(wanted), "status")
    assert (status, dispatcher.queue.job_ids) == (b"queued", [])
    assert (task_of(services, key).state, task_of(services, key).attempt_count) == ("pending", 0)

    deployment.start("worker", env)
    wait_until(
        lambda: task_of(services, key).state == "committed",
        timeout=SWEEP + 30,
        what="the next worker syncs the task",
        report=deployment.logs,
    )
    assert [a.outcome for a in attempts_of(services, key)] == ["committed"]
    assert observation_count(services) == 300


@pytest.mark.parametrize("loss", ["flushed", "killed and restarted empty"])
def test_the_maintenance_lock_lost_between_two_ticks_does_not_stop_the_passes(
    services: Services,
    cloud: CloudState,
    sim: SimServer,
    deployment: Deployment,
    tmp_path: Path,
    database_url: str,
    private_redis: PrivateRedis,
    loss: str,
) -> None:
    """Redis loses the maintenance lock (and everything else) between two ticks of a running
    worker: the next pass still comes, takes the lock again, and queues a task that no RQ job
    names; the task syncs without any process restarted."""
    env = _env(tmp_path, database_url, sim, REDIS_URL=private_redis.url)
    worker = deployment.start("worker", env)
    redis = private_redis.client()
    wait_until(
        lambda: redis.exists(maintenance.LOCK_KEY) and _last_beat(services.uow) is not None,
        timeout=30,
        what="a first pass",
        report=deployment.logs,
    )
    if loss == "flushed":
        redis.flushall()
    else:
        private_redis.kill()
        private_redis.start()
        redis = private_redis.client()
    before = _last_beat(services.uow)
    job_id = _finished_job(cloud, 120)
    key = f"job-{job_id}"
    unqueued = create_app(dataclasses.replace(services, dispatcher=RecordingDispatcher()))
    assert notify(unqueued, job_id).status_code == 200  # stored, queued nowhere

    wait_until(
        lambda: task_of(services, key).state == "committed",
        timeout=2 * SWEEP + 30,
        what="a pass after the loss queues the task",
        report=deployment.logs,
    )
    # The pass that queued the task writes its heartbeat after its other steps, while the work
    # horse may already have committed the task: wait for that beat rather than race it.
    wait_until(
        lambda: _last_beat(services.uow) > before,  # type: ignore[operator]
        timeout=2 * SWEEP + 30,
        what="the pass after the loss records its heartbeat",
        report=deployment.logs,
    )
    assert worker.poll() is None  # the same worker, never restarted
    assert redis.exists(maintenance.LOCK_KEY) == 1
    assert observation_count(services) == 120
    with services.uow.begin() as session:
        sweeps = session.execute(
            select(MaintenanceRun.summary).where(MaintenanceRun.kind == "sweep")
        ).scalars()
        assert {"due": 1, "enqueued": 1, "failures": 0} in list(sweeps)


@pytest.mark.postgres
def test_a_worker_whose_turn_comes_during_another_workers_pass_leaves_it_to_that_one(
    services: Services,
    sim: SimServer,
    deployment: Deployment,
    tmp_path: Path,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis is flushed while a worker is inside its maintenance pass, so the short lock that
    spaces the passes is gone: a second worker takes its turn but runs no second copy beside
    the first. Once the first worker dies, every process at once, the second one's next turn
    runs the pass."""
    caplog.set_level("INFO", logger="scrapesync.maintenance")  # whatever ran before it
    holds = tmp_path / "holds"
    env = _env(tmp_path, database_url, sim)
    held = {**env, "SCRAPESYNC_HOLD_AT": "maintenance-pass", "SCRAPESYNC_HOLD_FILE": str(holds)}
    first = deployment.start("worker", held)
    wait_until(lambda: _holds(holds) == 1, timeout=30, what="a pass held", report=deployment.logs)
    dispatcher = services.dispatcher
    assert isinstance(dispatcher, RQDispatcher)
    before = _last_beat(services.uow)

    dispatcher.redis.flushdb()  # the lock goes with everything else
    second = maintenance.MaintenanceLoop(services, owner="second")
    assert second.tick() is False
    assert dispatcher.redis.get(maintenance.LOCK_KEY) == b"second"  # its turn, yet no pass
    assert any(r.msg == "maintenance.pass_under_way" for r in caplog.records)
    assert (second.passes, _last_beat(services.uow)) == (0, before)

    kill_tree(first)  # its connection, and the advisory lock with it, goes with the process
    # PostgreSQL lets the lock go once it notices the connection closed, a moment later; a turn
    # taken before that leaves it (as above) and spaces the next one by most of an interval
    wait_until(lambda: _pass_lock_free(services.uow), timeout=10, what="the dead pass's lock gone")
    dispatcher.redis.flushdb()
    assert second.tick() is True  # the next turn runs the pass
    assert second.passes == 1
    assert _last_beat(services.uow) != before
