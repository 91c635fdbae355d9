"""The sync task: one Cloud scraping job becomes exactly one correct copy of its data in SQL.

A worker claims the task's lease, records an attempt, asks Cloud for the job (the notification
is never trusted), streams the JSON Lines export into a staging table and merges it into
observations in the SAME transaction that marks the task committed under the current lease
token. A stale worker's commit matches no task row and rolls back whole. Commit comes first; the
RQ job is acknowledged only after it. Every failure is classified in one place
(:func:`classify`) into retry_wait, quarantined, gone or dead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

from config.datasets import Dataset
from sync import logs, runs, store
from sync.bootstrap import Services
from sync.client import (
    ApiBudgetExhaustedError,
    CloudAuthError,
    CloudClient,
    CloudError,
    CloudNotFoundError,
    CloudRateLimitedError,
    CloudValidationError,
    ScrapingJob,
)
from sync.identity import RecordIdentity
from sync.models import Launch, Run, SyncTask
from sync.store import Lease, StaleLeaseError, UpsertCounts

log = logs.get("sync")

BACKOFF_BASE = 10.0
BACKOFF_CAP = 900.0
POLL_BASE = 60.0
POLL_CAP = 900.0


class JobNotFinishedError(Exception):
    """Cloud is still scraping the job; its data is not final. The run it belongs to is known,
    so the run waits for it."""

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class NoDatasetError(Exception):
    """The job's sitemap feeds no configured dataset."""


@dataclass(frozen=True)
class Target:
    """Where a scraping job's records go: dataset, run and collection window."""

    dataset: Dataset
    run_id: str
    window: str
    recovery_batch: str | None
    frozen_partitions: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SyncResult:
    """What one run of the sync task did."""

    task_key: str
    outcome: str
    state: str | None
    run_id: str | None = None
    next_attempt_at: datetime | None = None
    counts: UpsertCounts | None = None
    records_read: int = 0
    missing_key: int = 0
    error: str | None = None


@dataclass(frozen=True)
class Verdict:
    """How a failure is handled: the task's next state, when to try again, whether it counts
    against the retry budget."""

    state: str
    wait: float | None
    count_failure: bool


def backoff(failures: int, draw: float) -> float:
    """Capped full-jitter backoff for the task's ``failures``-th failure (draw in [0, 1))."""
    return draw * min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(failures, 30))


def classify(exc: BaseException, *, failures: int, draw: float) -> Verdict:
    """The one place that decides what a failure of the sync task means."""
    if isinstance(exc, JobNotFinishedError):
        return Verdict("retry_wait", min(POLL_CAP, POLL_BASE * 2.0 ** min(failures, 10)), False)
    if isinstance(exc, CloudAuthError | CloudValidationError | NoDatasetError):
        return Verdict("quarantined", None, False)
    if isinstance(exc, CloudNotFoundError):
        return Verdict("gone", None, False)
    if isinstance(exc, CloudRateLimitedError | ApiBudgetExhaustedError):
        wait = exc.retry_after if exc.retry_after is not None else backoff(failures, draw)
        return Verdict("retry_wait", wait + draw, False)
    if isinstance(exc, CloudError):
        wait = backoff(failures, draw)
        if exc.retry_after is not None:
            wait = max(wait, exc.retry_after)
        return Verdict("retry_wait", wait, True)
    return Verdict("retry_wait", backoff(failures, draw), True)


def resolve_target(services: Services, job: ScrapingJob) -> Target:
    """Map a scraping job to its run: custom_id names a launch or a run; otherwise the dataset
    whose sitemap matches, with the window from the job's creation time."""
    with services.uow.begin() as session:
        if job.custom_id:
            launch = session.get(Launch, job.custom_id)
            run_id = launch.run_id if launch is not None else job.custom_id
            run = session.get(Run, run_id)
            if run is not None and run.dataset in services.datasets.by_name:
                recovery = launch if launch is not None and launch.kind == "rerun" else None
                frozen = (recovery.manifest or {}).get("partitions", {}) if recovery else {}
                return Target(
                    dataset=services.datasets.get(run.dataset),
                    run_id=run.run_id,
                    window=run.collection_window,
                    recovery_batch=recovery.batch_id if recovery is not None else None,
                    frozen_partitions=frozenset(frozen),
                )
    dataset = services.datasets.for_sitemap(job.sitemap_id, job.sitemap_name)
    if dataset is None:
        raise NoDatasetError(
            f"scraping job {job.id}: sitemap {job.sitemap_name!r} (id {job.sitemap_id}) feeds no "
            "dataset in the datasets file"
        )
    created = (
        datetime.fromtimestamp(job.time_created, UTC)
        if job.time_created is not None
        else services.clock()
    )
    window = dataset.window_for(created, job.id)
    return Target(dataset, dataset.run_id_for(window), window, None)


def run_sync(services: Services, task_key: str) -> SyncResult:
    """Run the sync task ``task_key`` once, whatever state it is in."""
    now = services.clock()
    with services.uow.begin() as session:
        lease = store.claim(
            session,
            task_key,
            owner=services.worker_name,
            lease_seconds=services.settings.lease_seconds,
            now=now,
        )
        session.commit()
    if lease is None:
        return _not_claimed(services, task_key)
    bound = {"task_key": task_key, "attempt_id": lease.attempt_id, "job_id": lease.job_id}
    log.info("attempt.started", extra={**bound, "lease_token": lease.token})
    services.killpoints.reached("after-lease")
    try:
        with services.cloud() as cloud:
            job = cloud.get_job(lease.job_id)
            target = resolve_target(services, job)
            if not job.is_terminal:
                raise JobNotFinishedError(
                    f"scraping job {job.id} is {job.status!r}; its data is not final yet",
                    run_id=target.run_id,
                )
            result = _import(services, cloud, lease, job, target)
    except StaleLeaseError as exc:
        _finish_attempt(services, lease, outcome="stale", error_class="StaleLease", error=str(exc))
        log.warning("attempt.stale", extra=bound)
        return SyncResult(task_key, "stale", None, error=str(exc))
    except Exception as exc:
        result = _settle_failure(services, lease, exc)
        log.info(
            "attempt.settled", extra={**bound, "outcome": result.outcome, "error": result.error}
        )
        if not isinstance(exc, CloudError | JobNotFinishedError | NoDatasetError):
            raise
        return result
    log.info(
        "attempt.committed",
        extra={**bound, "run_id": result.run_id, "records": result.records_read},
    )
    return result


def _import(
    services: Services, cloud: CloudClient, lease: Lease, job: ScrapingJob, target: Target
) -> SyncResult:
    dataset = target.dataset
    settings = services.settings
    heartbeat_every = timedelta(seconds=settings.lease_seconds / 3)
    read = missing = protected = 0
    with services.uow.begin() as session:
        postgres = services.uow.dialect == "postgresql"
        stager = store.ObservationStager(session)
        last_beat = services.clock()
        identify = RecordIdentity(dataset, target.window)
        frozen = target.frozen_partitions
        for record in cloud.iter_records(job.id):
            read += 1
            staged = identify(record)
            if staged is None:
                missing += 1
                continue
            if frozen and staged[2] in frozen:
                protected += 1  # a recovery batch never rewrites a partition that passed
                continue
            stager.add(*staged)
            if read == stager.batch_size:
                services.killpoints.reached("mid-download")
            if postgres and read % 1000 == 0 and services.clock() - last_beat >= heartbeat_every:
                last_beat = _heartbeat(services, lease)
        now = services.clock()
        store.ensure_run(
            session,
            run_id=target.run_id,
            dataset=dataset.name,
            window=target.window,
            sitemap_id=job.sitemap_id,
            sitemap_name=job.sitemap_name,
            now=now,
        )
        store.save_scraping_job(
            session, job, run_id=target.run_id, recovery_batch=target.recovery_batch, now=now
        )
        counts = stager.merge(
            dataset=dataset.name,
            run_id=target.run_id,
            window=target.window,
            job_id=job.id,
            attempt_id=lease.attempt_id,
            now=now,
        )
        services.killpoints.reached("mid-upsert")
        state = store.commit_task(session, lease, run_id=target.run_id, now=now)
        store.finish_attempt(
            session,
            lease.attempt_id,
            now=now,
            outcome="committed",
            cloud_status=job.status,
            recovery_batch=target.recovery_batch,
            records_read=read,
            inserted=counts.inserted,
            updated=counts.updated,
            unchanged=counts.unchanged,
            missing_key=missing,
            protected=protected,
            duplicate_keys=counts.duplicate_keys,
            conflicting_duplicates=counts.conflicting_duplicates,
        )
        session.commit()
    services.killpoints.reached("after-commit")
    if state == "pending":
        _enqueue(services, lease.task_key)
    else:  # the run's data changed: judge it (a lost job is found again by the maintenance sweep)
        runs.enqueue_evaluation(
            services, target.run_id, suffix=f"{lease.task_key}-g{lease.generation}"
        )
    return SyncResult(
        lease.task_key,
        "committed",
        state,
        run_id=target.run_id,
        counts=counts,
        records_read=read,
        missing_key=missing,
    )


def _heartbeat(services: Services, lease: Lease) -> datetime:
    now = services.clock()
    with services.uow.begin() as session:
        alive = store.extend_lease(
            session, lease, lease_seconds=services.settings.lease_seconds, now=now
        )
        session.commit()
    if not alive:
        raise StaleLeaseError(lease.task_key, lease.token)
    return now


def _settle_failure(services: Services, lease: Lease, exc: BaseException) -> SyncResult:
    now = services.clock()
    verdict = classify(exc, failures=lease.failure_count, draw=services.random())
    state = verdict.state
    if verdict.count_failure and lease.failure_count + 1 >= services.settings.max_sync_attempts:
        state = "dead"
    next_at = now + timedelta(seconds=verdict.wait or 0.0)
    error_class = type(exc).__name__
    message = str(exc)
    status = exc.status if isinstance(exc, CloudError) else None
    with services.uow.begin() as session:
        settled = store.settle_task(
            session,
            lease,
            state=state,
            error_class=error_class,
            error=message,
            next_attempt_at=next_at,
            count_failure=verdict.count_failure,
            run_id=exc.run_id if isinstance(exc, JobNotFinishedError) else None,
            now=now,
        )
        store.finish_attempt(
            session,
            lease.attempt_id,
            now=now,
            outcome=state if settled else "stale",
            error_class=error_class,
            error=message,
            http_status=status,
        )
        session.commit()
    if settled and state == "retry_wait":
        _enqueue(services, lease.task_key, at=next_at)
    return SyncResult(
        lease.task_key,
        state if settled else "stale",
        state if settled else None,
        next_attempt_at=next_at if state == "retry_wait" else None,
        error=f"{error_class}: {message}",
    )


def _finish_attempt(services: Services, lease: Lease, **values: Any) -> None:
    with services.uow.begin() as session:
        store.finish_attempt(session, lease.attempt_id, now=services.clock(), **values)
        session.commit()


def _not_claimed(services: Services, task_key: str) -> SyncResult:
    """Nothing to do now; if the task waits for a later time, make sure a job is scheduled."""
    with services.uow.begin() as session:
        task = session.execute(
            select(SyncTask).where(SyncTask.task_key == task_key)
        ).scalar_one_or_none()
        if task is None:
            return SyncResult(task_key, "unknown", None)
        state, next_at = task.state, task.next_attempt_at
    if state in store.CLAIMABLE and next_at > services.clock():
        _enqueue(services, task_key, at=next_at)
    return SyncResult(task_key, "not_claimed", state, next_attempt_at=next_at)


def _enqueue(services: Services, task_key: str, *, at: datetime | None = None) -> None:
    with services.uow.begin() as session:
        task = session.execute(
            select(SyncTask.requested_generation, SyncTask.attempt_count).where(
                SyncTask.task_key == task_key
            )
        ).one()
    try:
        services.dispatcher.enqueue_sync(task_key, generation=task[0], attempts=task[1], at=at)
    except Exception:  # the task row is durable; the sweeper queues it again
        log.warning("enqueue.failed", extra={"task_key": task_key}, exc_info=True)
