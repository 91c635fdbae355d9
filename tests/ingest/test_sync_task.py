"""The sync task: one correct copy of a job's data, whatever is repeated, refused or cut."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Engine, func, select, text

from simulator import CloudState
from sync.bootstrap import Services
from sync.identity import observation_key
from sync.ingest import early_merge, failures, job_export, store, sweeper, tasks
from sync.ingest.line_digests import LineDigests
from sync.models import MaintenanceRun, Observation, Run
from sync.queue import RQDispatcher
from tests.harness import (
    API_TOKEN,
    at_time,
    attempts_of,
    drain,
    notify,
    observation_count,
    products_sitemap,
    task_of,
)

pytestmark = pytest.mark.redis


def _finished_job(cloud: CloudState, n: int = 30, *, start: int = 0) -> int:
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.set_generated(job_id, n, start=start)
    cloud.run_job(job_id)
    return job_id


def test_a_finished_job_is_synced_into_observations(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Notification, then a worker: every record becomes one observation of its run."""
    job_id = _finished_job(cloud, n=30)
    notify(web, job_id)
    drain(services)
    task = task_of(services, f"job-{job_id}")
    assert (task.state, task.synced_generation) == ("committed", 1)
    (attempt,) = attempts_of(services, f"job-{job_id}")
    assert (attempt.outcome, attempt.records_read, attempt.inserted) == ("committed", 30, 30)
    assert attempt.cloud_status == "finished"
    assert observation_count(services) == 30
    with services.uow.begin() as session:
        run = session.execute(select(Run)).scalar_one()
        assert run.dataset == "products"
        assert run.run_id == f"products-{run.collection_window}"
        assert store.count_rows(session, Observation, Observation.run_id == run.run_id) == 30
        partitions = session.execute(select(func.count(func.distinct(Observation.partition))))
        assert partitions.scalar_one() == 3


def test_fifty_concurrent_duplicate_notifications_make_one_sync(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """50 simultaneous deliveries of one notification: one attempt, one observation per entity."""
    job_id = _finished_job(cloud, n=40)
    barrier = threading.Barrier(50)
    codes: list[int] = []

    def deliver() -> None:
        client = web.test_client()
        barrier.wait()
        codes.append(notify(web, job_id).status_code if client else 0)

    threads = [threading.Thread(target=deliver) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes == [200] * 50
    drain(services)
    assert [a.outcome for a in attempts_of(services, f"job-{job_id}")] == ["committed"]
    assert observation_count(services) == 40


def test_a_repeat_notification_of_an_unchanged_job_costs_one_call_and_downloads_nothing(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A second notification after the commit syncs again: Cloud reports the job as it was, so
    the attempt commits as unchanged with one API call and no download."""
    job_id = _finished_job(cloud, n=25)
    notify(web, job_id)
    drain(services)
    calls = len(cloud.requests)
    notify(web, job_id)
    drain(services)
    first, second = attempts_of(services, f"job-{job_id}")
    assert (first.outcome, second.outcome) == ("committed", "unchanged")
    assert cloud.requests[calls:] == [("GET", f"/api/v1/scraping-job/{job_id}")]
    task = task_of(services, f"job-{job_id}")
    assert (task.state, task.synced_generation) == ("committed", 2)


def test_a_forced_repeat_sync_of_unchanged_data_rewrites_nothing(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A forced repeat downloads and merges again, finds every payload unchanged and leaves the
    rows untouched."""
    job_id = _finished_job(cloud, n=25)
    notify(web, job_id)
    drain(services)
    with services.uow.begin() as session:
        before = dict(
            session.execute(select(Observation.observation_key, Observation.last_changed_at)).all()
        )
    notify(web, job_id)
    assert tasks.run_sync(services, f"job-{job_id}", force=True).outcome == "committed"
    _first, second = attempts_of(services, f"job-{job_id}")
    assert (second.inserted, second.updated, second.unchanged) == (0, 0, 25)
    assert task_of(services, f"job-{job_id}").synced_generation == 2
    with services.uow.begin() as session:
        after = dict(
            session.execute(select(Observation.observation_key, Observation.last_changed_at)).all()
        )
    assert after == before


def test_continue_after_a_commit_adds_the_new_records_and_duplicates_nothing(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Cloud's "Continue" re-finishes the same job id; its notification makes a new sync that
    adds the extra records and leaves the rest alone."""
    job_id = _finished_job(cloud, n=20)
    notify(web, job_id)
    drain(services)
    extra = [
        {
            "sku": f"EXTRA-{i}",
            "title": "t",
            "price": "1.00",
            "url": "https://alpha.example/x",
            "retailer": "alpha.example",
        }
        for i in range(5)
    ]
    cloud.continue_job(job_id, extra_records=extra)
    cloud.finish_job(job_id)
    notify(web, job_id)
    drain(services)
    second = attempts_of(services, f"job-{job_id}")[-1]
    assert (second.inserted, second.updated, second.unchanged) == (5, 0, 20)
    assert observation_count(services) == 25


def test_a_notification_during_a_lease_asks_for_one_more_sync(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A "Continue" that lands while a worker holds the lease is not lost: the task goes back to
    pending after the commit and syncs again."""
    job_id = _finished_job(cloud, n=10)
    notify(web, job_id)
    key = f"job-{job_id}"
    with services.uow.begin() as session:
        lease = store.claim(session, key, owner="w1", lease_seconds=60, now=services.clock())
        session.commit()
    assert lease is not None
    notify(web, job_id)  # arrives mid-lease
    assert task_of(services, key).requested_generation == 2
    with services.cloud() as client:
        job = client.get_job(job_id)
        target = tasks.resolve_target(services, job)
        result = tasks._import(services, client, lease, job, target)
    assert result.state == "pending"
    drain(services)
    task = task_of(services, key)
    assert (task.state, task.synced_generation) == ("committed", 2)


@pytest.mark.slow
def test_a_job_still_running_waits_and_its_notification_wakes_it(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A job that is not finished is not imported; the task waits, then syncs on the real
    notification."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.set_generated(job_id, 12)
    cloud.start_job(job_id)
    notify(web, job_id, status="started")
    drain(services)
    task = task_of(services, f"job-{job_id}")
    assert (task.state, task.last_error_class) == ("retry_wait", "JobNotFinishedError")
    assert task.run_id is not None
    assert task.run_id.startswith("products-")
    assert task.next_attempt_at > services.clock() + timedelta(seconds=30)
    assert observation_count(services) == 0
    cloud.finish_job(job_id)
    notify(web, job_id)
    drain(services)
    assert task_of(services, f"job-{job_id}").state == "committed"
    assert observation_count(services) == 12


@pytest.mark.parametrize(
    ("status", "state"), [(401, "quarantined"), (403, "quarantined"), (404, "gone")]
)
def test_jobs_that_cannot_be_read_are_quarantined_or_gone_with_the_reason(
    web: Flask, services: Services, cloud: CloudState, status: int, state: str
) -> None:
    """401/403 quarantine the task, 404 ends it; both keep the reason and are not retried."""
    job_id = _finished_job(cloud, n=5)
    cloud.inject_fault("status", path_contains=f"scraping-job/{job_id}", times=5, status=status)
    notify(web, job_id)
    drain(services)
    task = task_of(services, f"job-{job_id}")
    assert task.state == state
    assert str(status) in task.last_error
    (attempt,) = attempts_of(services, f"job-{job_id}")
    assert (attempt.outcome, attempt.http_status) == (state, status)


def test_a_sitemap_with_no_dataset_is_ignored_with_a_clear_reason(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A job of an unconfigured sitemap is ignored (not failed) with the sitemap named, not a
    crash."""
    other = cloud.add_sitemap("unknown-sitemap")
    job_id = cloud.create_job(other)
    cloud.run_job(job_id, n=3)
    notify(web, job_id)
    drain(services)
    task = task_of(services, f"job-{job_id}")
    assert task.state == "ignored"
    assert "unknown-sitemap" in task.last_error
    assert "datasets file" in task.last_error


@pytest.mark.parametrize("retry_after_format", ["seconds", "http-date"])
def test_a_429_with_retry_after_parks_the_task_for_that_long(
    web: Flask,
    services: Services,
    cloud: CloudState,
    sleeps: list[float],
    retry_after_format: str,
) -> None:
    """After a 429 the shared budget holds every call until Cloud's reset, so Cloud is asked
    once, and the task waits out Retry-After (seconds or an HTTP-date) in retry_wait."""
    job_id = _finished_job(cloud, n=5)
    cloud.retry_after_format = retry_after_format
    cloud.inject_fault(
        "rate_limit", path_contains=f"scraping-job/{job_id}", times=10, retry_after=3
    )
    notify(web, job_id)
    before = services.clock()
    drain(services)
    task = task_of(services, f"job-{job_id}")
    assert (task.state, task.last_error_class) == ("retry_wait", "ApiBudgetExhaustedError")
    wait = (task.next_attempt_at - before).total_seconds()
    assert 2.0 <= wait <= 5.0
    assert cloud.requests.count(("GET", f"/api/v1/scraping-job/{job_id}")) == 1
    assert task.failure_count == 0  # a rate limit is not the job's fault


def test_503s_back_off_and_a_later_attempt_commits(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Server errors put the task in retry_wait with backoff; once Cloud recovers it commits."""
    job_id = _finished_job(cloud, n=8)
    cloud.inject_fault("status", path_contains=f"scraping-job/{job_id}", times=3, status=503)
    notify(web, job_id)
    drain(services)
    key = f"job-{job_id}"
    task = task_of(services, key)
    assert (task.state, task.failure_count, task.last_error_class) == (
        "retry_wait",
        1,
        "CloudServerError",
    )
    assert attempts_of(services, key)[0].http_status == 503
    later = tasks.run_sync(at_time(services, task.next_attempt_at + timedelta(seconds=1)), key)
    assert later.outcome == "committed"
    assert observation_count(services) == 8


def test_a_connection_reset_is_retried(web: Flask, services: Services, cloud: CloudState) -> None:
    """A reset before any answer is a transport failure, retried inline and then by the task."""
    job_id = _finished_job(cloud, n=4)
    cloud.inject_fault("reset", path_contains=f"scraping-job/{job_id}", times=10)
    notify(web, job_id)
    drain(services)
    task = task_of(services, f"job-{job_id}")
    assert (task.state, task.last_error_class) == ("retry_wait", "CloudTransportError")


def test_a_cut_download_writes_nothing_and_the_retry_completes(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A download cut mid-stream rolls the whole import back; the next attempt imports all."""
    job_id = _finished_job(cloud, n=500)
    _cut_then_retried(web, services, cloud, job_id, lambda: observation_count(services) == 0)
    assert observation_count(services) == 500


def _cut_then_retried(
    web: Flask, services: Services, cloud: CloudState, job_id: int, meanwhile: Callable[[], bool]
) -> tasks.SyncResult:
    """Notify the job and sync it with its download cut mid-stream (the task waits to retry,
    and ``meanwhile()`` holds); then, the fault gone, sync it once it is due: that result,
    committed."""
    cloud.inject_fault("cut", path_contains=f"{job_id}/json", times=10, after_bytes=20_000)
    notify(web, job_id)
    drain(services)
    key = f"job-{job_id}"
    task = task_of(services, key)
    assert (task.state, task.last_error_class) == ("retry_wait", "DownloadIncompleteError")
    assert meanwhile()
    cloud.clear_faults()
    result = tasks.run_sync(at_time(services, task.next_attempt_at + timedelta(seconds=1)), key)
    assert result.outcome == "committed"
    return result


class _DigestsReadFirst(LineDigests):
    """The run's line digests, read before the sync goes on (so nothing is read ahead)."""

    @classmethod
    def reading(
        cls,
        engine: Engine,
        rules: str,
        run_id: str,
        *,
        first_known: Callable[[], None] | None = None,
        expected: int = 0,
    ) -> LineDigests:
        """The digests the run's rows hold, read by the time this returns."""
        found = super().reading(engine, rules, run_id, first_known=first_known, expected=expected)
        found.wait()
        return found


@pytest.mark.postgres
def test_a_later_sync_cut_mid_stream_undoes_what_it_merged_and_the_retry_completes(
    web: Flask, services: Services, cloud: CloudState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later sync of a run merges its records while they download; a download cut after
    several batches went in rolls all of them back with the import, and the next attempt
    imports everything."""
    notify(web, _finished_job(cloud, n=100))
    drain(services)
    o = Observation.__table__.c
    with services.uow.begin() as session:
        before = session.execute(select(o.observation_key, o.payload_hash)).all()
    monkeypatch.setattr(early_merge, "MERGE_BATCH", 20)
    sent: list[int] = []
    real_send = early_merge.EarlyMerge.send

    def counted(
        self: early_merge.EarlyMerge,
        rows: list[Any],
        payloads: list[str],
        shapes: list[str | None],
    ) -> None:
        sent.append(len(rows))
        real_send(self, rows, payloads, shapes)

    monkeypatch.setattr(early_merge.EarlyMerge, "send", counted)
    # The whole export is smaller than what the sync reads ahead while the run's digests are
    # read, so a download cut before they came would be cut before any batch was merged: the
    # digests are read first, and every line reaches the early merge as it downloads.
    monkeypatch.setattr(job_export, "LineDigests", _DigestsReadFirst)

    def nothing_kept() -> bool:
        assert len(sent) >= 2  # batches had gone in before the cut
        with services.uow.begin() as session:
            return session.execute(select(o.observation_key, o.payload_hash)).all() == before

    job_id = _finished_job(cloud, n=500)  # the same run: a hundred keys stored, 400 new
    result = _cut_then_retried(web, services, cloud, job_id, nothing_kept)
    assert result.counts is not None
    assert (result.counts.inserted, result.counts.unchanged) == (400, 100)
    assert observation_count(services) == 500


@pytest.mark.postgres
@pytest.mark.parametrize("later", [False, True], ids=["first sync", "later sync"])
def test_a_failure_after_the_writes_began_and_before_a_line_was_read_fails_the_attempt(
    web: Flask,
    services: Services,
    cloud: CloudState,
    monkeypatch: pytest.MonkeyPatch,
    later: bool,
) -> None:
    """A sync starts writing before it reads a line (a run's first sync opens its copy straight
    into observations, a later one its early merge). Something failing in between (here, the
    line digests cannot be set up) cancels that, so the attempt fails and rolls back instead of
    leaving the worker waiting on the database; the next attempt imports everything."""
    if later:
        notify(web, _finished_job(cloud, n=10))
        drain(services)
    job_id = _finished_job(cloud, n=30)  # the same run
    key = f"job-{job_id}"
    notify(web, job_id)

    class Unavailable(LineDigests):
        def __init__(self, rules: str) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(job_export, "LineDigests", Unavailable)
    failed: list[BaseException] = []

    def attempt() -> None:
        try:
            tasks.run_sync(services, key)
        except RuntimeError as exc:
            failed.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the attempt is stuck"
    assert [str(exc) for exc in failed] == ["can't start new thread"]
    task = task_of(services, key)
    assert (task.state, task.last_error_class) == ("retry_wait", "RuntimeError")
    assert observation_count(services) == (10 if later else 0)
    monkeypatch.undo()
    result = tasks.run_sync(at_time(services, task.next_attempt_at + timedelta(seconds=1)), key)
    assert result.outcome == "committed"
    assert result.counts is not None
    assert result.counts.inserted == (20 if later else 30)
    assert observation_count(services) == 30


def test_a_task_that_keeps_failing_ends_dead(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """When the retry budget is spent the task is dead, with its last error kept."""
    import dataclasses

    job_id = _finished_job(cloud, n=2)
    cloud.inject_fault("status", path_contains=f"scraping-job/{job_id}", times=100, status=500)
    budget = dataclasses.replace(
        services, settings=dataclasses.replace(services.settings, max_sync_attempts=2)
    )
    key = f"job-{job_id}"
    notify(web, job_id)
    first = tasks.run_sync(budget, key)
    assert first.outcome == "retry_wait"
    second = tasks.run_sync(at_time(budget, first.next_attempt_at + timedelta(seconds=1)), key)
    assert second.outcome == "dead"
    assert task_of(services, key).last_error_class == "CloudServerError"


def test_records_without_their_key_fields_are_counted_not_stored(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A record missing its entity key is reported on the attempt, never silently dropped."""
    job_id = cloud.create_job(products_sitemap(cloud))
    records = [{"sku": f"S{i}", "price": "1", "retailer": "a"} for i in range(4)]
    records += [{"sku": "", "price": "2", "retailer": "a"}, {"price": "3", "retailer": "a"}]
    cloud.run_job(job_id, records=records)
    notify(web, job_id)
    drain(services)
    (attempt,) = attempts_of(services, f"job-{job_id}")
    assert (attempt.records_read, attempt.inserted, attempt.missing_key) == (6, 4, 2)


def test_duplicate_entity_keys_in_one_job_are_stored_once_and_counted(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Two records of one entity make one observation; differing payloads are flagged."""
    job_id = cloud.create_job(products_sitemap(cloud))
    records = [
        {"sku": "A", "price": "1", "retailer": "r"},
        {"sku": "A", "price": "2", "retailer": "r"},
        {"sku": "B", "price": "3", "retailer": "r"},
        {"sku": "B", "price": "3", "retailer": "r"},
    ]
    cloud.run_job(job_id, records=records)
    notify(web, job_id)
    drain(services)
    (attempt,) = attempts_of(services, f"job-{job_id}")
    assert (attempt.inserted, attempt.duplicate_keys, attempt.conflicting_duplicates) == (2, 2, 1)
    with services.uow.begin() as session:
        price = session.execute(
            select(Observation.payload).where(Observation.entity_key == "A")
        ).scalar_one()["price"]
    assert price == "2"  # the last record of a key wins


@pytest.mark.parametrize(
    "point", ["mid-download", pytest.param("mid-upsert", marks=pytest.mark.postgres)]
)
def test_a_stale_lease_holder_cannot_commit(
    web: Flask, services: Services, cloud: CloudState, point: str
) -> None:
    """Worker A's lease expires mid-import and worker B claims the task: A's transaction rolls
    back and writes nothing; B's copy is the only one. (SQLite's single writer keeps B out
    while A writes, so there the takeover happens mid-download.)"""
    import dataclasses

    job_id = _finished_job(cloud, n=6000)
    key = f"job-{job_id}"
    notify(web, job_id)
    outcomes: list[str] = []
    later = at_time(services, services.clock() + timedelta(seconds=120))
    b = dataclasses.replace(later, worker_name="worker-b")
    worker_b = threading.Thread(target=lambda: outcomes.append(tasks.run_sync(b, key).outcome))

    class ClaimByB:
        """At A's kill point, B (whose clock says A's lease expired) claims the task."""

        def reached(self, name: str) -> None:
            if name != point:
                return
            worker_b.start()
            for _ in range(500):
                if task_of(services, key).lease_owner == "worker-b":
                    return
                time.sleep(0.01)
            raise AssertionError("worker B never claimed the task")

    a = dataclasses.replace(services, worker_name="worker-a", killpoints=ClaimByB())  # type: ignore[arg-type]
    result = tasks.run_sync(a, key)
    worker_b.join(timeout=30)
    assert outcomes == ["committed"]
    assert result.outcome == "stale"
    assert observation_count(services) == 6000
    by_worker = {x.worker: x for x in attempts_of(services, key)}
    assert by_worker["worker-a"].outcome == "stale"
    assert by_worker["worker-b"].outcome == "committed"
    with services.uow.begin() as session:
        sources = set(session.execute(select(Observation.source_attempt_id)).scalars())
    assert sources == {by_worker["worker-b"].attempt_id}


def test_the_sweeper_requeues_pending_tasks_after_redis_is_flushed(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Redis loses every queued job; the sweeper finds the pending tasks in SQL and queues them;
    sweeping again queues nothing more."""
    jobs = [_finished_job(cloud, n=3, start=3 * k) for k in range(3)]
    for job_id in jobs:
        notify(web, job_id)
    dispatcher = services.dispatcher
    assert isinstance(dispatcher, RQDispatcher)
    dispatcher.redis.flushdb()
    assert dispatcher.queue.count == 0
    report = sweeper.sweep(services)
    assert (report.due, report.enqueued) == (3, 3)
    assert sweeper.sweep(services).enqueued == 0
    with services.uow.begin() as session:
        recorded = store.count_rows(session, MaintenanceRun, MaintenanceRun.kind == "sweep")
    assert recorded == 2  # the two sweeps that found due tasks
    drain(services)
    assert {task_of(services, f"job-{j}").state for j in jobs} == {"committed"}
    assert observation_count(services) == 9
    assert sweeper.sweep(services).due == 0
    with services.uow.begin() as session:
        idle = store.count_rows(session, MaintenanceRun, MaintenanceRun.kind == "sweep")
    assert idle == 2  # an idle sweep leaves no row


def test_the_sweeper_returns_expired_leases_to_the_queue(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A task whose worker died holding the lease is queued again once the lease expires."""
    job_id = _finished_job(cloud, n=3)
    key = f"job-{job_id}"
    notify(web, job_id)
    with services.uow.begin() as session:
        assert store.claim(session, key, owner="dead-worker", lease_seconds=5, now=services.clock())
        session.commit()
    services.dispatcher.redis.flushdb()  # type: ignore[attr-defined]
    assert sweeper.sweep(services).enqueued == 0  # lease still live
    later = at_time(services, services.clock() + timedelta(seconds=10))
    assert sweeper.sweep(later).enqueued == 1
    assert tasks.run_sync(later, key).outcome == "committed"
    outcomes = [a.outcome for a in attempts_of(services, key)]
    assert outcomes == ["abandoned", "committed"]


@pytest.mark.postgres  # heartbeats run on PostgreSQL; SQLite has a single writer
def test_a_long_download_keeps_its_lease_alive_with_heartbeats(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """While a big export streams, the worker pushes its lease out, so no other worker takes a
    task that is still making progress."""
    import dataclasses
    import itertools

    job_id = _finished_job(cloud, n=3000)
    key = f"job-{job_id}"
    notify(web, job_id)
    start = services.clock()
    ticks = itertools.count()
    seen: list[object] = []

    class Watch:
        def reached(self, name: str) -> None:
            if name == "mid-upsert":
                seen.append(task_of(services, key).lease_until)

    stepping = dataclasses.replace(
        services,
        clock=lambda: start + timedelta(seconds=30 * next(ticks)),
        killpoints=Watch(),  # type: ignore[arg-type]
    )
    result = tasks.run_sync(stepping, key)
    assert result.outcome == "committed"
    (lease_until,) = seen
    first_expiry = start + timedelta(seconds=services.settings.lease_seconds)
    assert lease_until > first_expiry + timedelta(seconds=30)


def test_the_sweeper_wakes_retry_wait_tasks_when_they_are_due(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A task parked after a 503 is queued by the sweeper once its time comes, not before."""
    job_id = _finished_job(cloud, n=3)
    cloud.inject_fault("status", path_contains=f"scraping-job/{job_id}", times=3, status=503)
    notify(web, job_id)
    drain(services)
    task = task_of(services, f"job-{job_id}")
    assert task.state == "retry_wait"
    services.dispatcher.redis.flushdb()  # type: ignore[attr-defined]
    # a moment before its time (the wait is jittered, down to a fraction of a second, so the
    # real clock could already have passed it on a busy machine)
    early = at_time(services, task.next_attempt_at - timedelta(seconds=1))
    assert sweeper.sweep(early).enqueued == 0
    due = at_time(services, task.next_attempt_at + timedelta(seconds=1))
    assert sweeper.sweep(due).enqueued == 1


def test_the_sync_command_runs_a_job_in_the_foreground(
    services: Services, cloud: CloudState
) -> None:
    """`scrapesync sync JOB_ID` syncs without a worker and says what it wrote."""
    from click.testing import CliRunner

    from scrapesync.cli import main

    job_id = _finished_job(cloud, n=7)
    result = CliRunner().invoke(main, ["sync", str(job_id)])
    assert result.exit_code == 0, result.output
    assert f"job-{job_id}: committed" in result.output
    assert "inserted=7" in result.output
    assert "run products-" in result.output
    assert "published" in result.output
    again = CliRunner().invoke(main, ["sync", str(job_id)])
    assert again.exit_code == 0, again.output
    assert f"job-{job_id}: unchanged" in again.output
    assert "nothing downloaded" in again.output
    forced = CliRunner().invoke(main, ["sync", str(job_id), "--force"])
    assert forced.exit_code == 0, forced.output
    assert "inserted=0" in forced.output
    assert "unchanged=7" in forced.output
    downloads = [r for r in cloud.requests if r[1].endswith(f"{job_id}/json")]
    assert len(downloads) == 2  # the first sync and the forced one


def _downloads(cloud: CloudState, job_id: int) -> int:
    return cloud.requests.count(("GET", f"/api/v1/scraping-job/{job_id}/json"))


@pytest.mark.slow
def test_a_hundred_duplicate_notifications_for_a_finished_job_download_it_once(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Cloud repeats notifications: 100 of them, arriving in waves while workers run, download
    the job once; every later sync is one API call that finds the job unchanged."""
    job_id = _finished_job(cloud, n=40)
    key = f"job-{job_id}"
    codes: list[int] = []

    def deliver(barrier: threading.Barrier) -> None:
        barrier.wait()
        codes.append(notify(web, job_id).status_code)

    for _wave in range(10):
        barrier = threading.Barrier(10)
        threads = [threading.Thread(target=deliver, args=(barrier,)) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        drain(services)
    assert codes == [200] * 100
    attempts = attempts_of(services, key)
    assert attempts[0].outcome == "committed"
    assert {a.outcome for a in attempts[1:]} == {"unchanged"}
    assert len(attempts) >= 10  # a wave after a commit asks for a new sync, never a no-op
    assert _downloads(cloud, job_id) == 1
    assert cloud.requests.count(("GET", f"/api/v1/scraping-job/{job_id}")) == len(attempts)
    assert task_of(services, key).state == "committed"
    assert observation_count(services) == 40


@pytest.mark.slow
def test_a_notification_racing_a_reconcile_that_claimed_the_job_downloads_it_once(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Reconcile (run when a worker starts) finds the job and a worker claims it; the job's own
    notification lands during that lease and asks for one more sync, which costs one call."""
    import dataclasses

    from sync.operations import reconcile

    job_id = _finished_job(cloud, n=6000)
    key = f"job-{job_id}"
    assert [w.job_id for w in reconcile.reconcile(services).wanted] == [job_id]

    class NotifyMidDownload:
        """Cloud's notification arrives while the worker downloads."""

        def reached(self, name: str) -> None:
            if name == "mid-download":
                assert notify(web, job_id).status_code == 200

    racing = dataclasses.replace(services, killpoints=NotifyMidDownload())  # type: ignore[arg-type]
    first = tasks.run_sync(racing, key)
    assert (first.outcome, first.state) == ("committed", "pending")
    drain(services)
    assert [a.outcome for a in attempts_of(services, key)] == ["committed", "unchanged"]
    assert _downloads(cloud, job_id) == 1
    assert observation_count(services) == 6000


def test_continue_changes_what_cloud_reports_so_the_job_is_downloaded_again(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A job Cloud re-finished with more records (Continue) is not mistaken for a repeat."""
    job_id = _finished_job(cloud, n=10)
    notify(web, job_id)
    drain(services)
    cloud.continue_job(job_id, extra_records=[{"sku": "LATE-1", "price": "2", "retailer": "a"}])
    cloud.finish_job(job_id)
    notify(web, job_id)
    drain(services)
    assert [a.outcome for a in attempts_of(services, f"job-{job_id}")] == ["committed"] * 2
    assert _downloads(cloud, job_id) == 2
    assert observation_count(services) == 11


@pytest.mark.slow
def test_a_shutdown_in_the_middle_of_a_download_hands_the_task_back_at_once(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """RQ's ShutDownImminentException (a BaseException, raised by SIGTERM's grace running out)
    records the attempt abandoned and releases the lease, due now and queued again."""
    import dataclasses

    from rq.exceptions import ShutDownImminentException

    job_id = _finished_job(cloud, n=6000)
    key = f"job-{job_id}"
    notify(web, job_id)

    class Shutdown:
        """SIGTERM's grace runs out mid-download."""

        def reached(self, name: str) -> None:
            if name == "mid-download":
                raise ShutDownImminentException("shut down imminent (signal: SIGALRM)", {})

    stopping = dataclasses.replace(services, killpoints=Shutdown())  # type: ignore[arg-type]
    with pytest.raises(ShutDownImminentException):
        tasks.run_sync(stopping, key)
    task = task_of(services, key)
    assert (task.state, task.lease_owner, task.failure_count) == ("pending", None, 0)
    assert task.next_attempt_at <= services.clock()
    (attempt,) = attempts_of(services, key)
    assert (attempt.outcome, attempt.error_class) == ("abandoned", "ShutDownImminentException")
    assert observation_count(services) == 0
    drain(services)  # queued again at once, not after the lease
    assert [a.outcome for a in attempts_of(services, key)] == ["abandoned", "committed"]
    assert observation_count(services) == 6000


def test_a_429_without_retry_after_backs_off_longer_each_time_and_never_kills_the_task(
    web: Flask, services: Services, cloud: CloudState, sleeps: list[float]
) -> None:
    """Cloud refuses with a bare 429 (no Retry-After, no reset): each attempt waits longer than
    the last, up to the cap, and none of them counts against the failure budget."""
    import dataclasses

    import httpx

    from simulator import create_app as create_simulator
    from sync.bootstrap import worker_retry_policy
    from sync.cloud.client import CloudClient

    job_id = _finished_job(cloud, n=5)
    key = f"job-{job_id}"
    simulated = httpx.WSGITransport(app=create_simulator(cloud))
    refused: list[str] = []

    def bare_429(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith(f"scraping-job/{job_id}"):
            refused.append(request.url.path)
            return httpx.Response(429, json={"success": False, "error": "Too Many Attempts."})
        return simulated.handle_request(request)

    def client() -> CloudClient:
        return CloudClient(
            token=API_TOKEN,
            base_url="http://cloud.test/api/v1/",
            transport=httpx.MockTransport(bare_429),
            retry=worker_retry_policy(),
            sleep=sleeps.append,
        )

    throttled = dataclasses.replace(services, cloud=client)
    notify(web, job_id)
    waits: list[float] = []
    now = services.clock()
    for _ in range(9):
        result = tasks.run_sync(at_time(throttled, now), key)
        assert (result.outcome, result.next_attempt_at is not None) == ("retry_wait", True)
        assert result.next_attempt_at is not None
        waits.append((result.next_attempt_at - now).total_seconds())
        now = result.next_attempt_at + timedelta(seconds=1)
    assert all(later > earlier for earlier, later in itertools.pairwise(waits[:6]))
    assert waits[0] >= failures.BACKOFF_BASE
    assert max(waits) <= failures.BACKOFF_CAP
    assert waits[-1] >= failures.BACKOFF_CAP / 2
    task = task_of(services, key)
    assert (task.state, task.failure_count) == ("retry_wait", 0)
    assert len(refused) == 9 * worker_retry_policy().max_attempts


def test_a_lost_database_connection_is_retried_at_the_next_sweep_then_backed_off() -> None:
    """A connection the database dropped (a restart) makes the task due again at once; lost on
    every try, it backs off and counts, so it cannot download forever."""
    from sqlalchemy.exc import OperationalError

    dropped = OperationalError(
        "SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True
    )
    first = failures.classify(dropped, failures=0, draw=0.5)
    assert (first.state, first.wait, first.count_failure) == ("retry_wait", 0.0, True)
    again = failures.classify(dropped, failures=3, draw=0.5)
    assert again.wait == failures.backoff(3, 0.5) > 0
    assert again.count_failure


def test_a_job_still_scraping_is_polled_on_the_capped_exponential_without_counting() -> None:
    """A job Cloud has not finished is asked about again after min(900, 60 * 2**failures)
    seconds, the same with every draw, and the wait never counts as a failure."""
    still = failures.JobNotFinishedError("running", run_id="products-1")
    for n in range(-1, 80):
        verdict = failures.classify(still, failures=n, draw=0.3)
        expected = min(failures.POLL_CAP, failures.POLL_BASE * 2.0 ** min(n, 10))
        assert (verdict.state, verdict.wait, verdict.count_failure) == (
            "retry_wait",
            expected,
            False,
        )
    assert [failures.poll_wait(n) for n in range(6)] == [60.0, 120.0, 240.0, 480.0, 900.0, 900.0]


@pytest.mark.postgres
def test_a_sync_that_races_another_writer_for_new_keys_still_writes_each_once(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Another transaction inserts one of the job's new observations while the sync merges:
    the sync waits for it, takes that row as it is by then, and commits every record once."""
    job_id = _finished_job(cloud, n=10)
    notify(web, job_id)
    result = _race_for_a_new_key(services, job_id, "SKU-000000")
    assert result.counts is not None
    assert (result.counts.inserted, result.counts.updated) == (9, 1)
    assert observation_count(services) == 10


@pytest.mark.postgres
def test_a_later_sync_that_races_another_writer_for_a_new_key_still_writes_each_once(
    web: Flask, services: Services, cloud: CloudState, caplog: pytest.LogCaptureFixture
) -> None:
    """A later sync of a run merges its records while it downloads them. Another transaction
    inserts one of its new keys meanwhile: the sync waits for it, undoes what it merged so far,
    and the merge after the download takes that row as it is by then and commits every record
    once."""
    notify(web, _finished_job(cloud, n=10))
    drain(services)
    job_id = _finished_job(cloud, n=15)  # the same run: ten keys stored, five new
    notify(web, job_id)
    with caplog.at_level("INFO", logger="scrapesync.staging"):
        result = _race_for_a_new_key(services, job_id, "SKU-000012")
    (undone,) = [r for r in caplog.records if r.getMessage() == "staging.early_merge_undone"]
    assert undone.reason == "UniqueViolation"  # type: ignore[attr-defined]
    assert result.counts is not None
    assert (result.counts.inserted, result.counts.updated, result.counts.unchanged) == (4, 1, 10)
    assert observation_count(services) == 15


@pytest.mark.postgres
def test_only_a_later_sync_of_a_run_reads_the_runs_line_digests(
    web: Flask, services: Services, cloud: CloudState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's first sync has no stored lines to know, so it asks for none; a later sync of the
    run reads them and parses only the lines it does not know."""
    read: list[str] = []
    real = LineDigests.reading.__func__  # type: ignore[attr-defined]

    def counted(
        cls: type[LineDigests], engine: Any, rules: str, run_id: str, **more: Any
    ) -> LineDigests:
        read.append(run_id)
        return real(cls, engine, rules, run_id, **more)  # type: ignore[no-any-return]

    monkeypatch.setattr(LineDigests, "reading", classmethod(counted))
    notify(web, _finished_job(cloud, n=10))
    drain(services)
    assert read == []
    job_id = _finished_job(cloud, n=10)  # the same run, the same records
    notify(web, job_id)
    result = drain_one(services, job_id)
    assert len(read) == 1
    assert result.counts is not None
    assert (result.counts.inserted, result.counts.updated, result.counts.unchanged) == (0, 0, 10)


def _race_for_a_new_key(services: Services, job_id: int, sku: str) -> tasks.SyncResult:
    """Sync the job while another transaction holds an uncommitted row of ``sku``'s key, and
    commit that row once the sync waits for it; the sync's result, checked committed and with
    the raced row rewritten from the export."""
    with services.cloud() as client:
        target = tasks.resolve_target(services, client.get_job(job_id))
    raced = observation_key(target.dataset.name, target.window, sku)
    engine = services.uow.engine
    with engine.connect() as other:
        other.execute(
            text(
                "INSERT INTO observations (observation_key, dataset, entity_key, run_id, "
                "collection_window, payload, payload_hash, source_job_id, source_attempt_id, "
                "first_seen_at, last_changed_at) VALUES (:key, 'products', "
                ":sku, :run, :window, '{}', 'other', 1, 'other', now(), now())"
            ),
            {"key": raced, "sku": sku, "run": target.run_id, "window": target.window},
        )  # not committed yet: the sync's insert of this key has to wait for it
        results: list[tasks.SyncResult] = []
        worker = threading.Thread(target=lambda: results.append(drain_one(services, job_id)))
        worker.start()
        deadline = time.monotonic() + 60
        while not _someone_waits_for_a_lock(engine):
            assert time.monotonic() < deadline, "the sync never reached the raced key"
            time.sleep(0.05)
        other.commit()
        worker.join()
    (result,) = results
    assert result.outcome == "committed"
    with services.uow.begin() as session:
        row = session.execute(
            select(Observation.payload_hash).where(Observation.observation_key == raced)
        ).scalar_one()
    assert row != "other"
    return result


def drain_one(services: Services, job_id: int) -> tasks.SyncResult:
    """Run the job's sync task once, as a worker would."""
    return tasks.run_sync(services, f"job-{job_id}")


def _someone_waits_for_a_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        ).scalar_one()
    return bool(waiting)
