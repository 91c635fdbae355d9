"""Maintenance that cannot stop: the worker's own timer keeps passing, whatever a pass meets."""

from __future__ import annotations

import dataclasses
import time

import pytest
from flask import Flask
from redis import Redis

from simulator import CloudState
from sync.bootstrap import Services
from sync.db import UnitOfWork, make_engine
from sync.operations import maintenance
from sync.queue import RQDispatcher, sync_job_id
from tests.harness import notify, products_sitemap, task_of

pytestmark = pytest.mark.redis


def _lost_task(web: Flask, services: Services, cloud: CloudState) -> str:
    """A pending task whose RQ job Redis has lost."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, n=3)
    notify(web, job_id)
    assert isinstance(services.dispatcher, RQDispatcher)
    services.dispatcher.redis.flushdb()
    return f"job-{job_id}"


def _queued(services: Services) -> list[str]:
    assert isinstance(services.dispatcher, RQDispatcher)
    return list(services.dispatcher.queue.job_ids)


def _wait(condition: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the maintenance thread never got there"
        time.sleep(0.02)


def test_passes_keep_coming_while_the_database_is_down_and_heal_once_it_is_back(
    web: Flask, services: Services, cloud: CloudState, caplog: pytest.LogCaptureFixture
) -> None:
    """A pass that meets a dead database is logged and the next pass still comes; once the
    database answers, a pass queues the task that Redis lost."""
    key = _lost_task(web, services, cloud)
    dead = UnitOfWork(
        make_engine(
            "postgresql+psycopg://postgres@127.0.0.1:1/none", connect_args={"connect_timeout": 1}
        )
    )
    fast = dataclasses.replace(services.settings, sweep_interval=0.1)
    loop = maintenance.MaintenanceLoop(
        dataclasses.replace(services, uow=dead, settings=fast), owner="w1"
    )
    loop.start()
    try:
        # three passes meet the dead database, and the passes still come
        _wait(lambda: loop.passes >= 3)
        assert sum(r.msg == "maintenance.step_failed" for r in caplog.records) >= 3
        assert _queued(services) == []
        loop.services = dataclasses.replace(services, settings=fast)  # the database is back
        task = task_of(services, key)
        expected = sync_job_id(key, task.requested_generation, task.attempt_count)
        _wait(lambda: expected in _queued(services))
    finally:
        loop.stop()
    assert loop.passes >= 4


def test_workers_take_turns_so_one_pass_runs_per_interval(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Two workers offered a pass at the same moment: one runs it, the other waits its turn
    until the short lock expires by itself."""
    _lost_task(web, services, cloud)
    assert services.redis is not None

    def at(interval: float) -> Services:
        settings = dataclasses.replace(services.settings, sweep_interval=interval)
        return dataclasses.replace(services, settings=settings)

    # the turn alone, at a short interval: taken, refused, and free again once the lock expires
    fast = at(0.5)
    assert [maintenance.take_turn(fast, "w1"), maintenance.take_turn(fast, "w2")] == [True, False]
    time.sleep(0.5 * maintenance.LOCK_SHARE + 0.1)
    assert maintenance.take_turn(fast, "w2") is True
    time.sleep(0.5 * maintenance.LOCK_SHARE + 0.1)

    # whole passes, at an interval longer than a pass takes: one runs, one task is queued
    slow = at(30.0)
    first = maintenance.MaintenanceLoop(slow, owner="w1")
    second = maintenance.MaintenanceLoop(slow, owner="w2")
    assert [first.tick(), second.tick()] == [True, False]
    assert len([j for j in _queued(services) if j.startswith("sync-")]) == 1
    assert 0 < services.redis.pttl(maintenance.LOCK_KEY) <= 30_000 * maintenance.LOCK_SHARE


def test_with_redis_gone_a_worker_still_runs_its_pass(
    web: Flask, services: Services, cloud: CloudState, caplog: pytest.LogCaptureFixture
) -> None:
    """No lock can be taken and nothing can be queued while Redis is away: the pass runs
    anyway, says what it could not queue, and leaves the task for the next pass, which the
    last pass's heartbeat spaces like the lock would."""
    key = _lost_task(web, services, cloud)
    gone = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
    settings = dataclasses.replace(services.settings, sweep_interval=30.0)
    away = dataclasses.replace(
        services, redis=gone, dispatcher=RQDispatcher(gone), settings=settings
    )
    assert maintenance.MaintenanceLoop(away, owner="w1").tick() is True
    assert any(r.msg == "maintenance.lock_unavailable" for r in caplog.records)
    # the heartbeat in SQL spaces the passes instead of the lock: the other worker waits its turn
    assert maintenance.MaintenanceLoop(away, owner="w2").tick() is False
    assert any(r.msg == "sweep.enqueue_failed" for r in caplog.records)
    assert task_of(services, key).state == "pending"
    report = maintenance.run_pass(services)  # Redis is back
    assert (report.counts["due"], report.counts["enqueued"], report.failed) == (1, 1, [])
