"""Self-healing (issue 32): every task that SQL says is due ends synced by itself, whatever Redis
holds: a job whose hash says it waits where no list or registry holds it, a delayed job that a
flush took, no job at all, or a Redis that stopped answering."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from flask import Flask
from redis import Redis
from rq.job import Job
from rq.scheduler import RQScheduler

from scrapesync.processes import wait_until
from scrapesync.servers import PrivateRedis
from simulator import CloudState
from sync import bootstrap
from sync.bootstrap import Services
from sync.db import UnitOfWork
from sync.operations import heartbeat, maintenance
from sync.queue import RQDispatcher, sync_job_id
from tests.harness import (
    at_time,
    attempts_of,
    drain,
    notify,
    observation_count,
    products_sitemap,
    task_of,
)

pytestmark = pytest.mark.redis


def _dispatcher(services: Services) -> RQDispatcher:
    assert isinstance(services.dispatcher, RQDispatcher)
    return services.dispatcher


def _finished_job(cloud: CloudState, n: int) -> int:
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, n=n)
    return job_id


def _wanted_job_id(services: Services, key: str) -> str:
    task = task_of(services, key)
    return sync_job_id(key, task.requested_generation, task.attempt_count)


def _status(services: Services, job_id: str) -> str:
    status = _dispatcher(services).redis.hget(Job.key_for(job_id), "status")
    return bytes(status or b"").decode()


def _taken_by_a_worker_that_died(services: Services) -> str:
    """Take the first job off the queue as an RQ worker does (onto RQ's intermediate list),
    and never start it: what a worker killed between the two leaves behind."""
    dispatcher = _dispatcher(services)
    taken = dispatcher.redis.lmove(dispatcher.queue.key, dispatcher.queue.intermediate_queue_key)
    assert taken is not None
    return bytes(taken).decode()


def _synced(services: Services, key: str, records: int) -> None:
    """The task is committed by its last attempt and its records are stored once."""
    assert task_of(services, key).state == "committed"
    assert attempts_of(services, key)[-1].outcome == "committed"
    assert observation_count(services) == records


def test_a_job_a_dead_worker_took_off_the_queue_is_queued_again_and_syncs(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A worker killed after taking a job's id off the queue and before starting it leaves a
    hash that says queued with no list behind it: the next pass queues the job again under its
    own id (off RQ's intermediate list), and the task syncs."""
    job_id = _finished_job(cloud, 40)
    key = f"job-{job_id}"
    assert notify(web, job_id).status_code == 200
    orphan = _taken_by_a_worker_that_died(services)
    assert orphan == _wanted_job_id(services, key)
    assert _status(services, orphan) == "queued"
    dispatcher = _dispatcher(services)

    report = maintenance.run_pass(services)

    assert (report.counts["due"], report.counts["enqueued"], report.failed) == (1, 1, [])
    assert [j for j in dispatcher.queue.job_ids if j.startswith("sync-")] == [orphan]
    assert dispatcher.queue.intermediate_queue.get_job_ids() == []
    drain(services)
    _synced(services, key, 40)
    assert len(attempts_of(services, key)) == 1


def test_a_retry_wait_task_whose_delayed_job_was_flushed_syncs_once_due(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A task parked in retry_wait after a 429 loses its delayed job in a flush: nothing is
    queued before its time, and once it is due a pass queues it and it syncs."""
    job_id = _finished_job(cloud, 30)
    key = f"job-{job_id}"
    cloud.inject_fault("rate_limit", path_contains=f"scraping-job/{job_id}", times=1, retry_after=1)
    notify(web, job_id)
    drain(services)
    parked = task_of(services, key)
    assert parked.state == "retry_wait"
    dispatcher = _dispatcher(services)
    assert dispatcher.queue.scheduled_job_registry.get_job_ids() == [_wanted_job_id(services, key)]
    dispatcher.redis.flushdb()  # the tests' own Redis database: FLUSHALL for this deployment
    # a moment before its time (on a busy machine the real clock may already be past a 1 s wait)
    early = at_time(services, parked.next_attempt_at - timedelta(seconds=1))
    assert maintenance.run_pass(early).counts["enqueued"] == 0

    wait_until(lambda: services.clock() > parked.next_attempt_at, timeout=10, what="due")
    report = maintenance.run_pass(services)

    assert (report.counts["due"], report.counts["enqueued"]) == (1, 1)
    drain(services)
    _synced(services, key, 30)
    assert [a.outcome for a in attempts_of(services, key)] == ["retry_wait", "committed"]


def test_a_retry_wait_task_whose_due_job_a_dead_worker_took_is_queued_again_and_syncs(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Once a parked task is due, RQ's scheduler moves its delayed job onto the queue, and a
    worker killed before starting it leaves a hash that says queued: the next pass queues the
    job again and the task syncs."""
    job_id = _finished_job(cloud, 20)
    key = f"job-{job_id}"
    cloud.inject_fault("rate_limit", path_contains=f"scraping-job/{job_id}", times=1, retry_after=1)
    notify(web, job_id)
    drain(services)
    parked = task_of(services, key)
    assert parked.state == "retry_wait"
    dispatcher = _dispatcher(services)
    wait_until(lambda: services.clock() > parked.next_attempt_at, timeout=10, what="due")
    scheduler = RQScheduler([dispatcher.queue], connection=dispatcher.redis)
    scheduler.prepare_registries([dispatcher.queue.name])
    scheduler.enqueue_scheduled_jobs()
    orphan = _taken_by_a_worker_that_died(services)
    assert (orphan, _status(services, orphan)) == (_wanted_job_id(services, key), "queued")

    report = maintenance.run_pass(services)

    assert (report.counts["due"], report.counts["enqueued"]) == (1, 1)
    drain(services)
    _synced(services, key, 20)
    assert [a.outcome for a in attempts_of(services, key)] == ["retry_wait", "committed"]


def test_a_pending_task_with_no_job_in_redis_is_swept_and_syncs(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A notification stored while its job was lost (Redis flushed right after) leaves a pending
    task with no RQ job at all: the next pass queues it and it syncs."""
    job_id = _finished_job(cloud, 25)
    key = f"job-{job_id}"
    notify(web, job_id)
    _dispatcher(services).redis.flushdb()

    report = maintenance.run_pass(services)

    assert (report.counts["due"], report.counts["enqueued"]) == (1, 1)
    drain(services)
    _synced(services, key, 25)


def test_a_job_waiting_in_its_queue_still_takes_the_repeats(services: Services) -> None:
    """A job whose id is in its queue's list really waits: asking again queues nothing more."""
    dispatcher = _dispatcher(services)
    asked = [dispatcher.sync("job-1", generation=1, attempts=0) for _ in range(3)]
    assert asked == [True, False, False]
    assert dispatcher.queue.job_ids == [sync_job_id("job-1", 1, 0)]


def test_a_scheduled_job_missing_from_the_schedule_is_scheduled_again(
    services: Services,
) -> None:
    """A hash that says scheduled with no entry in the scheduled registry would never run: a
    request for later schedules it again, and a request for now queues it."""
    dispatcher = _dispatcher(services)
    registry = dispatcher.queue.scheduled_job_registry
    job_id = sync_job_id("job-2", 1, 1)
    later = services.clock() + timedelta(minutes=5)
    assert dispatcher.sync("job-2", generation=1, attempts=1, at=later) is True
    assert dispatcher.sync("job-2", generation=1, attempts=1, at=later) is False
    registry.remove(job_id)
    assert _status(services, job_id) == "scheduled"

    assert dispatcher.sync("job-2", generation=1, attempts=1, at=later) is True
    assert registry.get_job_ids() == [job_id]
    assert dispatcher.sync("job-2", generation=1, attempts=1) is True
    assert (registry.get_job_ids(), dispatcher.queue.job_ids) == ([], [job_id])


def test_a_deferred_job_missing_from_its_registry_is_queued_again(services: Services) -> None:
    """A hash that says deferred with no entry in the deferred registry waits for nothing: the
    job is queued again under its own id."""
    dispatcher = _dispatcher(services)
    job_id = sync_job_id("job-3", 1, 0)
    assert dispatcher.sync("job-3", generation=1, attempts=0) is True
    dispatcher.redis.lrem(dispatcher.queue.key, 0, job_id)
    dispatcher.redis.hset(Job.key_for(job_id), "status", "deferred")

    assert dispatcher.sync("job-3", generation=1, attempts=0) is True
    assert (_status(services, job_id), dispatcher.queue.job_ids) == ("queued", [job_id])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers (a Redis that hangs)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


def test_after_redis_fails_to_answer_the_dispatcher_gives_up_at_once_for_a_moment(
    silent_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis that does not answer costs one socket timeout, not one per job: the next jobs
    are refused at once for the hold-off, and each refusal is logged with the job it names."""
    dispatcher = RQDispatcher(bootstrap.connect_redis(f"redis://127.0.0.1:{silent_port}/0"))
    started = time.monotonic()
    assert dispatcher.sync("job-4", generation=1, attempts=0) is None
    first = time.monotonic() - started
    assert bootstrap.REDIS_SOCKET_TIMEOUT <= first < bootstrap.REDIS_SOCKET_TIMEOUT + 3
    started = time.monotonic()
    assert [dispatcher.relay(bucket=1), dispatcher.evaluation("r1", suffix="s1")] == [None, None]
    assert time.monotonic() - started < 0.5
    failures = [r for r in caplog.records if r.msg.endswith("enqueue_failed")]
    assert [r.msg for r in failures] == [
        "sync.enqueue_failed",
        "relay.enqueue_failed",
        "evaluation.enqueue_failed",
    ]
    assert "relay-1 not queued" in str(failures[1].exc_info[1])  # type: ignore[index]


@pytest.mark.slow
def test_a_hung_redis_does_not_stop_the_passes_and_they_heal_once_it_answers(
    web: Flask,
    services: Services,
    cloud: CloudState,
    uow: UnitOfWork,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis stops answering mid-life (SIGSTOP): every call gives up after the client's timeout,
    the passes keep coming and their heartbeat with them, and once Redis answers again (empty)
    the next pass queues the task that waits. (The client's timeout is cut to a second here;
    the test above holds the real one.)"""
    monkeypatch.setattr(bootstrap, "REDIS_SOCKET_TIMEOUT", 1.0)
    server = PrivateRedis()
    server.start()
    loop: maintenance.MaintenanceLoop | None = None
    try:
        redis = bootstrap.connect_redis(server.url)
        fast = dataclasses.replace(services.settings, sweep_interval=1.0)
        hung = dataclasses.replace(
            services, redis=redis, dispatcher=RQDispatcher(redis), settings=fast
        )
        job_id = _finished_job(cloud, 5)
        notify(web, job_id)  # queued on the tests' Redis, never on the private one
        wanted = _wanted_job_id(services, f"job-{job_id}")
        loop = maintenance.MaintenanceLoop(hung, owner="w1")
        loop.start()
        wait_until(lambda: wanted in _queue_of(redis), timeout=10, what="the first pass queues")
        wait_until(lambda: _beats(loop, uow)[1] is not None, timeout=10, what="its heartbeat")

        server.pause()
        before = _beats(loop, uow)
        wait_until(lambda: _beats(loop, uow)[0] >= before[0] + 2, timeout=60, what="2 passes")
        assert _beats(loop, uow)[1] > before[1]  # status sees the passes go on

        server.resume()
        redis.flushall()
        wait_until(lambda: wanted in _queue_of(redis), timeout=15, what="a pass queues again")
    finally:
        if loop is not None:
            loop.stop()
        server.resume()
        server.kill()


def _queue_of(redis: Redis) -> list[str]:
    return [bytes(j).decode() for j in redis.lrange("rq:queue:scrapesync", 0, -1)]


def _beats(loop: maintenance.MaintenanceLoop, uow: UnitOfWork) -> tuple[int, object]:
    with uow.begin() as session:
        return loop.passes, heartbeat.last(session)


def test_status_can_tell_when_the_last_pass_ran_what_it_did_and_when_it_is_late(
    services: Services,
) -> None:
    """The last pass's heartbeat carries its time, counts and failed steps; a pass that has not
    come round for three sweep intervals is late, and so is one that never ran."""
    with services.uow.begin() as session:
        assert heartbeat.latest(session) is None
    moment = services.clock()
    heartbeat.beat(at_time(services, moment - timedelta(minutes=5)), summary={"due": 9})
    heartbeat.beat(at_time(services, moment), summary={"due": 2, "failed": ["sweep"]})
    with services.uow.begin() as session:
        beat = heartbeat.latest(session)
    assert beat is not None
    assert (beat.finished_at, beat.summary["due"], beat.failed) == (moment, 2, ["sweep"])
    interval = 30.0
    assert not heartbeat.late(beat, now=moment + timedelta(seconds=90), interval=interval)
    assert heartbeat.late(beat, now=moment + timedelta(seconds=91), interval=interval)
    assert heartbeat.late(None, now=moment, interval=interval)
