"""SQL access for the sync path. Functions take a session and never commit: only use cases do.

The lease protocol: a worker claims a task with one conditional UPDATE that bumps
``lease_token``; every later write of that attempt (heartbeat, outcome, the data itself) is
fenced by ``WHERE lease_token = :token AND state = 'leased'``. A stale worker's fenced write
matches no row, so its transaction rolls back and writes nothing.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
import psycopg
from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from sync.db import insert
from sync.models import Attempt, Notification, SyncTask, UTCDateTime
from sync.states import AttemptOutcome, TaskState

REVIVABLE = (
    TaskState.COMMITTED,
    TaskState.QUARANTINED,
    TaskState.DEAD,
    TaskState.GONE,
    TaskState.IGNORED,
)
CLAIMABLE = (TaskState.PENDING, TaskState.RETRY_WAIT)


class StaleLeaseError(Exception):
    """A worker tried to write under a lease that another worker has since taken."""

    def __init__(self, task_key: str, lease_token: int) -> None:
        super().__init__(f"lease {lease_token} on task {task_key} is no longer current")
        self.task_key = task_key
        self.lease_token = lease_token


@dataclass(frozen=True)
class Wish:
    """A sync task's state right after a notification asked for it."""

    task_key: str
    job_id: int
    state: str
    requested_generation: int
    attempt_count: int
    next_attempt_at: datetime


@dataclass(frozen=True)
class Lease:
    """A worker's claim on one sync task, valid while ``token`` is the task's lease token."""

    task_key: str
    job_id: int
    token: int
    generation: int
    attempt_id: str
    attempt_count: int
    failure_count: int
    owner: str
    until: datetime


def task_key_for(job_id: int) -> str:
    """The task key of the sync of one Cloud job."""
    return f"job-{job_id}"


def record_notification(
    session: Session,
    *,
    form: dict[str, Any],
    remote_addr: str | None,
    job_id: int | None,
    status: str | None,
    outcome: str,
    now: datetime,
) -> int:
    """Store a notification in the inbox, exactly as it came."""
    row = Notification(
        received_at=now,
        remote_addr=remote_addr,
        form=form,
        job_id=job_id,
        status=status,
        task_key=task_key_for(job_id) if job_id is not None else None,
        outcome=outcome,
    )
    session.add(row)
    session.flush()
    return row.id


def want_sync(session: Session, job_id: int, *, now: datetime) -> Wish:
    """Create the job's sync task, or ask an existing one for one more sync.

    Repeats while a sync is pending coalesce; a notification after a commit (Cloud's
    "Continue") asks for a new generation; one during a lease asks for the one after it.
    """
    t = SyncTask.__table__.c
    key = task_key_for(job_id)
    new = insert(session, SyncTask).values(
        task_key=key,
        job_id=job_id,
        state=TaskState.PENDING,
        requested_generation=1,
        claimed_generation=0,
        synced_generation=0,
        attempt_count=0,
        failure_count=0,
        lease_token=0,
        next_attempt_at=now,
        created_at=now,
        updated_at=now,
    )
    revive = t.state.in_(REVIVABLE)
    waiting_for_finish = and_(
        t.state == TaskState.RETRY_WAIT, t.last_error_class == "JobNotFinishedError"
    )
    stmt = new.on_conflict_do_update(
        index_elements=["task_key"],
        set_={
            "requested_generation": case(
                (t.state == TaskState.LEASED, t.claimed_generation + 1),
                (t.state.in_(CLAIMABLE), t.requested_generation),
                else_=t.synced_generation + 1,
            ),
            "state": case((or_(revive, waiting_for_finish), TaskState.PENDING), else_=t.state),
            "failure_count": case((revive, 0), else_=t.failure_count),
            "next_attempt_at": case(
                (or_(revive, waiting_for_finish), now), else_=t.next_attempt_at
            ),
            "updated_at": now,
        },
    ).returning(t.state, t.requested_generation, t.attempt_count, t.next_attempt_at)
    row = session.execute(stmt).one()
    return Wish(key, job_id, row.state, row.requested_generation, row.attempt_count, row[3])


@dataclass(frozen=True)
class Acceptance:
    """A stored notification and the wish it made: whether it created the task, or found a
    sync already pending and coalesced into it without writing the task row."""

    wish: Wish
    created: bool
    coalesced: bool


_REVIVABLE_SQL = ", ".join(f"'{state}'" for state in REVIVABLE)
_ACCEPT = text(
    "WITH cur AS (SELECT state, requested_generation, attempt_count, next_attempt_at "  # noqa: S608 - constants only
    f"FROM sync_tasks WHERE task_key = :key AND state = '{TaskState.PENDING}'), "
    "up AS (INSERT INTO sync_tasks (task_key, job_id, state, requested_generation, "
    "claimed_generation, synced_generation, attempt_count, failure_count, lease_token, "
    "next_attempt_at, created_at, updated_at) "
    f"SELECT :key, :job_id, '{TaskState.PENDING}', 1, 0, 0, 0, 0, 0, :now, :now, :now "
    "WHERE NOT EXISTS (SELECT 1 FROM cur) "
    "ON CONFLICT (task_key) DO UPDATE SET "
    f"requested_generation = CASE WHEN sync_tasks.state = '{TaskState.LEASED}' "
    "THEN sync_tasks.claimed_generation + 1 "
    f"WHEN sync_tasks.state IN ('{TaskState.PENDING}', '{TaskState.RETRY_WAIT}') "
    "THEN sync_tasks.requested_generation "
    "ELSE sync_tasks.synced_generation + 1 END, "
    f"state = CASE WHEN sync_tasks.state IN ({_REVIVABLE_SQL}) "
    f"OR (sync_tasks.state = '{TaskState.RETRY_WAIT}' "
    "AND sync_tasks.last_error_class = 'JobNotFinishedError') "
    f"THEN '{TaskState.PENDING}' ELSE sync_tasks.state END, "
    f"failure_count = CASE WHEN sync_tasks.state IN ({_REVIVABLE_SQL}) "
    "THEN 0 ELSE sync_tasks.failure_count END, "
    f"next_attempt_at = CASE WHEN sync_tasks.state IN ({_REVIVABLE_SQL}) "
    f"OR (sync_tasks.state = '{TaskState.RETRY_WAIT}' "
    "AND sync_tasks.last_error_class = 'JobNotFinishedError') "
    "THEN excluded.next_attempt_at ELSE sync_tasks.next_attempt_at END, "
    "updated_at = excluded.updated_at "
    "RETURNING state, requested_generation, attempt_count, next_attempt_at, "
    "xmax = 0 AS created), "
    "wish AS (SELECT state, requested_generation, attempt_count, next_attempt_at, created, "
    "false AS coalesced FROM up UNION ALL SELECT state, requested_generation, "
    "attempt_count, next_attempt_at, false, true FROM cur), "
    "note AS (INSERT INTO notifications (received_at, remote_addr, form, job_id, status, "
    "task_key, outcome) SELECT :now, :addr, CAST(:form AS jsonb), :job_id, :status, :key, "
    "'task ' || state || ' (generation ' || requested_generation || ')' FROM wish "
    "RETURNING id) "
    "SELECT state, requested_generation, attempt_count, next_attempt_at, created, "
    "coalesced FROM wish"
).bindparams(bindparam("now", type_=UTCDateTime()))
_UTC = UTCDateTime()


def accept_notification(
    conn: Connection,
    *,
    form: dict[str, Any],
    remote_addr: str | None,
    job_id: int,
    status: str | None,
    now: datetime,
) -> Acceptance:
    """Store a notification and want its job's sync in ONE statement (PostgreSQL), which on an
    autocommit connection is one round trip and one transaction: what :func:`want_sync` and
    :func:`record_notification` do together. A repeat that finds the sync already pending
    coalesces into it without writing (or locking) the task row.

    The statement goes to the driver's connection itself, past SQLAlchemy's execution and
    result layers, which cost more CPU than the statement on a request this short. A database
    error comes out as SQLAlchemy's, as it would from there, and a connection it broke is
    invalidated, so that the pool opens a fresh one."""
    key = task_key_for(job_id)
    sql = _accept_sql(conn.dialect)
    raw = conn.connection.driver_connection
    assert raw is not None
    try:
        with raw.cursor() as cursor:
            cursor.execute(
                sql,
                {
                    "key": key,
                    "job_id": job_id,
                    "now": _UTC.process_bind_param(now, conn.dialect),
                    "addr": remote_addr,
                    "form": orjson.dumps(form).decode(),
                    "status": status,
                },
            )
            row = cursor.fetchone()
    except psycopg.Error as exc:
        gone = bool(raw.broken or raw.closed)
        if gone:
            conn.invalidate(exc)
        error = DBAPIError.instance(
            sql, None, exc, psycopg.Error, hide_parameters=True, connection_invalidated=gone
        )
        raise error from exc
    assert row is not None, "the statement returns the wish"
    state, generation, attempts, next_attempt_at, created, coalesced = row
    due = _UTC.process_result_value(next_attempt_at, conn.dialect)
    assert due is not None, "a task row always has its next attempt time"
    wish = Wish(key, job_id, state, generation, attempts, due)
    return Acceptance(wish, created=bool(created), coalesced=bool(coalesced))


@functools.cache
def _accept_sql(dialect: Dialect) -> str:
    """The accept statement as the driver takes it (named parameters, the dialect's casts)."""
    return str(_ACCEPT.compile(dialect=dialect))


def claim(
    session: Session, task_key: str, *, owner: str, lease_seconds: float, now: datetime
) -> Lease | None:
    """Take the task's lease if it is due or its last lease expired; record a new attempt."""
    t = SyncTask.__table__.c
    due = or_(
        and_(t.state.in_(CLAIMABLE), t.next_attempt_at <= now),
        and_(t.state == TaskState.LEASED, t.lease_until < now),
    )
    target = (
        select(t.id)
        .where(t.task_key == task_key, due)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    until = now + timedelta(seconds=lease_seconds)
    row = session.execute(
        update(SyncTask)
        .where(t.id == target)
        .values(
            state=TaskState.LEASED,
            lease_owner=owner,
            lease_until=until,
            lease_token=t.lease_token + 1,
            attempt_count=t.attempt_count + 1,
            claimed_generation=t.requested_generation,
            updated_at=now,
        )
        .returning(t.job_id, t.lease_token, t.claimed_generation, t.attempt_count, t.failure_count)
    ).one_or_none()
    if row is None:
        return None
    session.execute(
        update(Attempt)
        .where(Attempt.task_key == task_key, Attempt.outcome == AttemptOutcome.RUNNING)
        .values(outcome=AttemptOutcome.ABANDONED, finished_at=now, error_class="LeaseExpired")
    )
    attempt = Attempt(
        attempt_id=_new_id(),
        task_key=task_key,
        job_id=row.job_id,
        generation=row.claimed_generation,
        lease_token=row.lease_token,
        worker=owner,
        started_at=now,
    )
    session.add(attempt)
    session.flush()
    return Lease(
        task_key=task_key,
        job_id=row.job_id,
        token=row.lease_token,
        generation=row.claimed_generation,
        attempt_id=attempt.attempt_id,
        attempt_count=row.attempt_count,
        failure_count=row.failure_count,
        owner=owner,
        until=until,
    )


def _new_id() -> str:
    return str(uuid.uuid4())


def _fenced(lease: Lease) -> Any:
    t = SyncTask.__table__.c
    return and_(
        t.task_key == lease.task_key, t.lease_token == lease.token, t.state == TaskState.LEASED
    )


def extend_lease(session: Session, lease: Lease, *, lease_seconds: float, now: datetime) -> bool:
    """Push the lease's expiry out; False when the lease is no longer ours."""
    result = session.execute(
        update(SyncTask)
        .where(_fenced(lease))
        .values(lease_until=now + timedelta(seconds=lease_seconds), updated_at=now)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def commit_task(session: Session, lease: Lease, *, run_id: str | None, now: datetime) -> str:
    """Mark the task's claimed generation synced, fenced by the lease; returns the new state
    (``pending`` again when a newer notification arrived during the lease)."""
    t = SyncTask.__table__.c
    row = session.execute(
        update(SyncTask)
        .where(_fenced(lease))
        .values(
            state=case(
                (t.requested_generation > lease.generation, TaskState.PENDING),
                else_=TaskState.COMMITTED,
            ),
            synced_generation=lease.generation,
            run_id=run_id,
            lease_owner=None,
            lease_until=None,
            failure_count=0,
            next_attempt_at=now,
            last_error_class=None,
            last_error=None,
            updated_at=now,
        )
        .returning(t.state)
    ).one_or_none()
    if row is None:
        raise StaleLeaseError(lease.task_key, lease.token)
    return str(row.state)


def settle_task(
    session: Session,
    lease: Lease,
    *,
    state: str,
    error_class: str | None,
    error: str | None,
    next_attempt_at: datetime,
    count_failure: bool,
    run_id: str | None = None,
    now: datetime,
) -> bool:
    """Put a leased task into retry_wait, quarantined, gone or dead, fenced by the lease."""
    t = SyncTask.__table__.c
    values: dict[str, Any] = {
        "state": state,
        "lease_owner": None,
        "lease_until": None,
        "last_error_class": error_class,
        "last_error": error,
        "next_attempt_at": next_attempt_at,
        "failure_count": t.failure_count + 1 if count_failure else t.failure_count,
        "updated_at": now,
    }
    if run_id is not None:
        values["run_id"] = run_id
    result = session.execute(update(SyncTask).where(_fenced(lease)).values(**values))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def first_attempt_at(session: Session, task_key: str, generation: int) -> datetime | None:
    """When the task's first attempt at this generation started."""
    return session.execute(
        select(func.min(Attempt.started_at)).where(
            Attempt.task_key == task_key, Attempt.generation == generation
        )
    ).scalar_one_or_none()


def finish_attempt(session: Session, attempt_id: str, *, now: datetime, **values: Any) -> None:
    """Write an attempt's outcome, error class and counts."""
    session.execute(
        update(Attempt).where(Attempt.attempt_id == attempt_id).values(finished_at=now, **values)
    )


def count_rows(session: Session, model: type[Any], *where: Any) -> int:
    """How many rows of ``model`` match ``where``."""
    return int(session.execute(select(func.count()).select_from(model).where(*where)).scalar_one())


def due_tasks(session: Session, *, now: datetime, limit: int = 1000) -> list[tuple[str, int, int]]:
    """Tasks a worker should be running now: due pending or retry_wait tasks and expired leases
    (task key, requested generation, attempts so far)."""
    t = SyncTask.__table__.c
    rows = session.execute(
        select(t.task_key, t.requested_generation, t.attempt_count)
        .where(
            or_(
                and_(t.state.in_(CLAIMABLE), t.next_attempt_at <= now),
                and_(t.state == TaskState.LEASED, t.lease_until < now),
            )
        )
        .order_by(t.next_attempt_at)
        .limit(limit)
    ).all()
    return [(r.task_key, r.requested_generation, r.attempt_count) for r in rows]
