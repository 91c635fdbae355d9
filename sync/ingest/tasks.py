"""The sync task: one Cloud scraping job becomes exactly one correct copy of its data in SQL.

A worker claims the task's lease, records an attempt, asks Cloud for the job (the notification
is never trusted), streams the JSON Lines export into a staging table and merges it into
observations in the SAME transaction that marks the task committed under the current lease
token. A stale worker's commit matches no task row and rolls back whole. Commit comes first; the
RQ job is acknowledged only after it. Every failure is classified in one place
(:func:`sync.ingest.failures.classify`) into retry_wait, quarantined, gone or dead.

A lease ends with its holder: when the worker is told to shut down (SIGTERM turns into RQ's
ShutDownImminentException in the work horse) or the attempt is otherwise interrupted, the
attempt is recorded ``abandoned`` and the task handed back (``pending``, due now) at once, so
the next worker starts it without waiting out the lease.

A repeat costs one API call: when the job Cloud describes now (status, page counters, stored
record count, scraping duration) has the fingerprint of the last committed sync, the attempt
commits as ``unchanged`` without downloading. Cloud's "Continue" changes the fingerprint, so
it syncs again; ``force`` re-imports anyway (after the datasets file changed), except that an
export byte for byte the one last imported under the same rules repeats that import's outcome
when it provably would (see :mod:`sync.ingest.repeat`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from sync import logs
from sync.bootstrap import Services
from sync.cloud.client import CloudClient
from sync.cloud.errors import CloudError
from sync.cloud.jobs import CloudJob
from sync.ingest import cloud_facts, job_changes, job_export, run_rows, set_aside, staging, store
from sync.ingest.failures import (
    PERMANENT,
    JobNotFinishedError,
    UnusableJobError,
    classify,
    failure_message,
    throttled_in_a_row,
)
from sync.ingest.staging import UpsertCounts
from sync.ingest.store import Lease, StaleLeaseError
from sync.ingest.targets import Target, resolve_target
from sync.models import SyncTask
from sync.states import AttemptOutcome, ClaimOutcome, TaskState

log = logs.get("sync")


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
    invalid: int = 0
    error: str | None = None


def _check_job(services: Services, lease: Lease, job: CloudJob) -> None:
    """Refuse a job Cloud describes in a way no sync can use."""
    if job.problems:
        raise UnusableJobError(
            f"scraping job {job.id}: Cloud's answer cannot be stored: {'; '.join(job.problems)}"
        )
    if job.is_terminal or job.is_running:
        return
    with services.uow.begin() as session:
        since = store.first_attempt_at(session, lease.task_key, lease.generation)
    waited = (services.clock() - since).total_seconds() if since is not None else 0.0
    if waited >= services.settings.unknown_status_seconds:
        raise UnusableJobError(
            f"scraping job {job.id}: Cloud has reported the unknown status {job.status!r} for "
            f"{waited:.0f} s (limit {services.settings.unknown_status_seconds:.0f} s)"
        )


def run_sync(services: Services, task_key: str, *, force: bool = False) -> SyncResult:
    """Run the sync task ``task_key`` once, whatever state it is in; ``force`` downloads and
    merges the job's data even when Cloud reports it unchanged since the last sync."""
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
    try:
        services.killpoints.reached("after-lease")
        with services.cloud() as cloud:
            job = cloud.get_job(lease.job_id)
            _check_job(services, lease, job)
            target = resolve_target(services, job)
            if not job.is_terminal:
                raise JobNotFinishedError(
                    f"scraping job {job.id} is {job.status!r}; its data is not final yet",
                    run_id=target.run_id,
                )
            fingerprint = job_changes.job_fingerprint(job, target.run_id)
            synced = _synced_fingerprint(services, task_key)
            same_job = not job_changes.changed_since(job, synced, run_id=target.run_id)
            if not force and same_job:
                result = _commit_unchanged(services, lease, job, target, fingerprint)
            else:
                result = _import(
                    services,
                    cloud,
                    lease,
                    job,
                    target,
                    fingerprint=fingerprint,
                    repeat_of_same_job=same_job,
                )
    except StaleLeaseError as exc:
        _finish_attempt(
            services, lease, outcome=AttemptOutcome.STALE, error_class="StaleLease", error=str(exc)
        )
        log.warning("attempt.stale", extra=bound)
        return SyncResult(task_key, AttemptOutcome.STALE, None, error=str(exc))
    except Exception as exc:
        result = _settle_failure(services, lease, exc)
        log.info(
            "attempt.settled", extra={**bound, "outcome": result.outcome, "error": result.error}
        )
        if not isinstance(exc, (CloudError, JobNotFinishedError, *PERMANENT)):
            raise
        return result
    except BaseException as exc:  # SIGTERM's ShutDownImminentException, an interrupt
        _abandon(services, lease, exc)
        log.warning("attempt.abandoned", extra={**bound, "error": type(exc).__name__})
        raise
    log.info(
        f"attempt.{result.outcome}",
        extra={
            **bound,
            "run_id": result.run_id,
            "records": result.records_read,
            "invalid": result.invalid,
        },
    )
    return result


def _synced_fingerprint(services: Services, task_key: str) -> str | None:
    with services.uow.begin() as session:
        return session.execute(
            select(SyncTask.synced_fingerprint).where(SyncTask.task_key == task_key)
        ).scalar_one_or_none()


def _commit_unchanged(
    services: Services, lease: Lease, job: CloudJob, target: Target, fingerprint: str
) -> SyncResult:
    """Cloud reports the job as it was at the last committed sync: commit without downloading."""
    now = services.clock()
    with services.uow.begin() as session:
        state = store.commit_task(session, lease, run_id=target.run_id, now=now)
        _record_fingerprint(session, lease, fingerprint)
        store.finish_attempt(
            session,
            lease.attempt_id,
            now=now,
            outcome=AttemptOutcome.UNCHANGED,
            cloud_status=job.status,
        )
        session.commit()
    if state == TaskState.PENDING:
        _enqueue(services, lease.task_key)
    return SyncResult(lease.task_key, AttemptOutcome.UNCHANGED, state, run_id=target.run_id)


def _record_fingerprint(session: Session, lease: Lease, fingerprint: str) -> None:
    session.execute(
        update(SyncTask)
        .where(SyncTask.task_key == lease.task_key, SyncTask.lease_token == lease.token)
        .values(synced_fingerprint=fingerprint)
    )


def _abandon(services: Services, lease: Lease, exc: BaseException) -> None:
    """The attempt was interrupted (its worker is shutting down): record it abandoned and hand
    the task back, due now, so the next worker need not wait for the lease to run out. An
    attempt that had already committed (the interruption came after its commit) stays so."""
    now = services.clock()
    reason = str(exc) or type(exc).__name__
    try:
        with services.uow.begin() as session:
            released = store.settle_task(
                session,
                lease,
                state=TaskState.PENDING,
                error_class=type(exc).__name__,
                error=reason,
                next_attempt_at=now,
                count_failure=False,
                now=now,
            )
            if released:
                store.finish_attempt(
                    session,
                    lease.attempt_id,
                    now=now,
                    outcome=AttemptOutcome.ABANDONED,
                    error_class=type(exc).__name__,
                    error=reason,
                )
            session.commit()
        if released:
            _enqueue(services, lease.task_key)
    except Exception:  # the database is away too: the lease runs out and the sweep takes it
        log.warning("attempt.abandon_failed", extra={"task_key": lease.task_key}, exc_info=True)


def _import(
    services: Services,
    cloud: CloudClient,
    lease: Lease,
    job: CloudJob,
    target: Target,
    *,
    fingerprint: str | None = None,
    repeat_of_same_job: bool = False,
) -> SyncResult:
    """Download the export and merge it into observations, or, when it is byte for byte what
    the task last imported (``repeat_of_same_job``: Cloud reports the job as it was), commit
    that import's outcome (see :mod:`sync.ingest.repeat`)."""
    tick = _ticker(services, lease)
    # Cloud's facts about the job, which its run's verdict reads, asked for beside the download
    facts = cloud_facts.FactsAhead.start(services, target.dataset, job)
    with services.uow.begin() as session:
        found = job_export.read_export(
            services,
            session,
            cloud,
            lease,
            job,
            target,
            tick,
            repeat_of_same_job=repeat_of_same_job,
        )
        if facts is not None:
            facts.wait()
        now = services.clock()
        _save_run_and_job(session, job, target, now=now)
        imported = found.merge(now) if isinstance(found, job_export.Staged) else found
        services.killpoints.reached("mid-upsert")
        state = store.commit_task(session, lease, run_id=target.run_id, now=now)
        version = run_rows.count_import(session, target.run_id)
        change = (
            found.groups_change(version)
            if isinstance(found, job_export.Staged)
            else run_rows.GroupsChange(version - 1, replaces_all=False, wrote={}, ids=[])
        )  # an import repeated byte for byte writes no row: as if it began at the version before
        run_rows.record_import(
            session,
            target.run_id,
            lease.attempt_id,
            version,
            written=None if change is None else change.ids,
        )
        run_rows.keep_row_groups(session, target.run_id, lease.attempt_id, version, change)
        if fingerprint is not None:
            _record_fingerprint(session, lease, fingerprint)
        _finish_import(session, lease, job, target, imported, now=now)
        if facts is not None:
            facts.store(session)
        session.commit()
    services.killpoints.reached("after-commit")
    if state == TaskState.PENDING:
        _enqueue(services, lease.task_key)
    else:  # the run's data changed: judge it (a lost job is found again by the maintenance sweep)
        services.dispatcher.evaluation(target.run_id, suffix=run_rows.evaluation_suffix(version))
    read = imported.read
    return SyncResult(
        lease.task_key,
        AttemptOutcome.COMMITTED,
        state,
        run_id=target.run_id,
        counts=imported.counts,
        records_read=read.read,
        missing_key=read.missing_key,
        invalid=imported.invalid_count,
    )


def _ticker(services: Services, lease: Lease) -> Callable[[int], None]:
    """What the download tells of its progress (lines read): it keeps the lease alive, and
    passes the mid-download kill point."""
    heartbeat_every = timedelta(seconds=services.settings.lease_seconds / 3)
    postgres = services.uow.dialect == "postgresql"
    last_beat = services.clock()

    def tick(read: int) -> None:
        nonlocal last_beat
        if read == staging.BATCH_SIZE:
            services.killpoints.reached("mid-download")
        if postgres and services.clock() - last_beat >= heartbeat_every:
            last_beat = _heartbeat(services, lease)

    return tick


def _save_run_and_job(session: Session, job: CloudJob, target: Target, *, now: datetime) -> None:
    """Make sure the run exists, and keep the scraping job's row as Cloud describes the job
    (before the merge: observations name their run)."""
    run_rows.ensure_run(
        session,
        run_id=target.run_id,
        dataset=target.dataset.name,
        window=target.window,
        sitemap_id=job.sitemap_id,
        sitemap_name=job.sitemap_name,
        now=now,
    )
    run_rows.save_scraping_job(
        session, job, run_id=target.run_id, recovery_batch=target.recovery_batch, now=now
    )


def _finish_import(
    session: Session,
    lease: Lease,
    job: CloudJob,
    target: Target,
    imported: job_export.Imported,
    *,
    now: datetime,
) -> None:
    """Record the attempt committed, with what its import read and wrote."""
    read, counts, digest = imported.read, imported.counts, imported.digest
    store.finish_attempt(
        session,
        lease.attempt_id,
        now=now,
        outcome=AttemptOutcome.COMMITTED,
        cloud_status=job.status,
        recovery_batch=target.recovery_batch,
        records_read=read.read,
        inserted=counts.inserted,
        updated=counts.updated,
        unchanged=counts.unchanged,
        missing_key=read.missing_key,
        protected=read.protected,
        duplicate_keys=counts.duplicate_keys,
        conflicting_duplicates=counts.conflicting_duplicates,
        invalid_records=imported.invalid_count,
        invalid_detail=imported.invalid_detail,
        export_digest=digest.recorded(),
        export_prefix=digest.prefix(),
        repeat_of=imported.origin,
    )
    if read.invalid.entities:
        set_aside.keep(
            session,
            run_id=target.run_id,
            dataset=target.dataset.name,
            job_id=job.id,
            entities=read.invalid.entities,
            now=now,
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
    throttled = throttled_in_a_row(services, lease) if isinstance(exc, CloudError) else 0
    verdict = classify(
        exc, failures=lease.failure_count, draw=services.random(), throttled=throttled
    )
    state = verdict.state
    if verdict.count_failure and lease.failure_count + 1 >= services.settings.max_sync_attempts:
        state = TaskState.DEAD
    next_at = now + timedelta(seconds=verdict.wait or 0.0)
    error_class = type(exc).__name__
    message = failure_message(exc)
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
            outcome=state if settled else AttemptOutcome.STALE,
            error_class=error_class,
            error=message,
            http_status=status,
        )
        session.commit()
    if settled and state == TaskState.RETRY_WAIT:
        _enqueue(services, lease.task_key, at=next_at)
    return SyncResult(
        lease.task_key,
        state if settled else AttemptOutcome.STALE,
        state if settled else None,
        next_attempt_at=next_at if state == TaskState.RETRY_WAIT else None,
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
            return SyncResult(task_key, ClaimOutcome.UNKNOWN, None)
        state, next_at = task.state, task.next_attempt_at
    if state in store.CLAIMABLE and next_at > services.clock():
        _enqueue(services, task_key, at=next_at)
    return SyncResult(task_key, ClaimOutcome.NOT_CLAIMED, state, next_attempt_at=next_at)


def _enqueue(services: Services, task_key: str, *, at: datetime | None = None) -> None:
    with services.uow.begin() as session:
        task = session.execute(
            select(SyncTask.requested_generation, SyncTask.attempt_count).where(
                SyncTask.task_key == task_key
            )
        ).one()
    # a failure is logged; the task row is durable and the sweeper queues it again
    services.dispatcher.sync(task_key, generation=task[0], attempts=task[1], at=at)
