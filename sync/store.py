"""SQL access for the sync path. Functions take a session and never commit: only use cases do.

The lease protocol: a worker claims a task with one conditional UPDATE that bumps
``lease_token``; every later write of that attempt (heartbeat, outcome, the data itself) is
fenced by ``WHERE lease_token = :token AND state = 'leased'``. A stale worker's fenced write
matches no row, so its transaction rolls back and writes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    func,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sync.client import InvalidRecord
from sync.client import ScrapingJob as CloudJob
from sync.models import Attempt, Notification, Run, ScrapingJob, SyncTask, UTCDateTime

REVIVABLE = ("committed", "quarantined", "dead", "gone")
CLAIMABLE = ("pending", "retry_wait")


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


def _insert(session: Session) -> Any:
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


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
    stmt = _insert(session)(SyncTask).values(
        task_key=key,
        job_id=job_id,
        state="pending",
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
    waiting_for_finish = and_(t.state == "retry_wait", t.last_error_class == "JobNotFinishedError")
    literal(now, UTCDateTime())
    stmt = stmt.on_conflict_do_update(
        index_elements=["task_key"],
        set_={
            "requested_generation": case(
                (t.state == "leased", t.claimed_generation + 1),
                (t.state.in_(CLAIMABLE), t.requested_generation),
                else_=t.synced_generation + 1,
            ),
            "state": case((or_(revive, waiting_for_finish), "pending"), else_=t.state),
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
_ACCEPT = (
    text(
        "WITH cur AS (SELECT state, requested_generation, attempt_count, next_attempt_at "  # noqa: S608 - constants only
        "FROM sync_tasks WHERE task_key = :key AND state = 'pending'), "
        "up AS (INSERT INTO sync_tasks (task_key, job_id, state, requested_generation, "
        "claimed_generation, synced_generation, attempt_count, failure_count, lease_token, "
        "next_attempt_at, created_at, updated_at) "
        "SELECT :key, :job_id, 'pending', 1, 0, 0, 0, 0, 0, :now, :now, :now "
        "WHERE NOT EXISTS (SELECT 1 FROM cur) "
        "ON CONFLICT (task_key) DO UPDATE SET "
        "requested_generation = CASE WHEN sync_tasks.state = 'leased' "
        "THEN sync_tasks.claimed_generation + 1 "
        "WHEN sync_tasks.state IN ('pending', 'retry_wait') "
        "THEN sync_tasks.requested_generation "
        "ELSE sync_tasks.synced_generation + 1 END, "
        f"state = CASE WHEN sync_tasks.state IN ({_REVIVABLE_SQL}) "
        "OR (sync_tasks.state = 'retry_wait' "
        "AND sync_tasks.last_error_class = 'JobNotFinishedError') "
        "THEN 'pending' ELSE sync_tasks.state END, "
        f"failure_count = CASE WHEN sync_tasks.state IN ({_REVIVABLE_SQL}) "
        "THEN 0 ELSE sync_tasks.failure_count END, "
        f"next_attempt_at = CASE WHEN sync_tasks.state IN ({_REVIVABLE_SQL}) "
        "OR (sync_tasks.state = 'retry_wait' "
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
    )
    .bindparams(bindparam("now", type_=UTCDateTime()))
    .columns(next_attempt_at=UTCDateTime())
)


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
    coalesces into it without writing (or locking) the task row."""
    key = task_key_for(job_id)
    row = conn.execute(
        _ACCEPT,
        {
            "key": key,
            "job_id": job_id,
            "now": now,
            "addr": remote_addr,
            "form": orjson.dumps(form).decode(),
            "status": status,
        },
    ).one()
    wish = Wish(
        key, job_id, row.state, row.requested_generation, row.attempt_count, row.next_attempt_at
    )
    return Acceptance(wish, created=bool(row.created), coalesced=bool(row.coalesced))


def claim(
    session: Session, task_key: str, *, owner: str, lease_seconds: float, now: datetime
) -> Lease | None:
    """Take the task's lease if it is due or its last lease expired; record a new attempt."""
    t = SyncTask.__table__.c
    due = or_(
        and_(t.state.in_(CLAIMABLE), t.next_attempt_at <= now),
        and_(t.state == "leased", t.lease_until < now),
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
            state="leased",
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
        .where(Attempt.task_key == task_key, Attempt.outcome == "running")
        .values(outcome="abandoned", finished_at=now, error_class="LeaseExpired")
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
    return and_(t.task_key == lease.task_key, t.lease_token == lease.token, t.state == "leased")


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
            state=case((t.requested_generation > lease.generation, "pending"), else_="committed"),
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


def save_scraping_job(
    session: Session,
    job: CloudJob,
    *,
    run_id: str | None,
    recovery_batch: str | None,
    now: datetime,
) -> None:
    """Insert or refresh the scraping job's row from what Cloud said."""
    values: dict[str, Any] = {
        "run_id": run_id,
        "recovery_batch": recovery_batch,
        "sitemap_id": job.sitemap_id,
        "sitemap_name": job.sitemap_name,
        "custom_id": job.custom_id,
        "status": job.status,
        "jobs_scheduled": job.jobs_scheduled,
        "jobs_executed": job.jobs_executed,
        "jobs_failed": job.jobs_failed,
        "jobs_empty": job.jobs_empty,
        "jobs_no_value": job.jobs_no_value,
        "stored_record_count": job.stored_record_count,
        "time_created": (
            datetime.fromtimestamp(job.time_created, UTC) if job.time_created is not None else None
        ),
        "last_seen_at": now,
    }
    stmt = _insert(session)(ScrapingJob).values(job_id=job.id, first_seen_at=now, **values)
    session.execute(stmt.on_conflict_do_update(index_elements=["job_id"], set_=values))


# --- observations -------------------------------------------------------------------------------


# --- records that cannot be stored ---------------------------------------------------------------

PARTITION_LIMIT = 200  # the width of observations.partition and partition_verdicts.partition
INVALID_SAMPLES = 20  # lines kept, with their numbers, in an attempt's invalid_detail


def record_problem(
    record: Mapping[str, Any],
    *,
    partition: str | None,
    canonical: str,
    start_url: str | None,
    max_record_bytes: int,
) -> tuple[str, str] | None:
    """Why a parsed record cannot be staged (reason code, detail), or None when it can: a NUL
    character in a key or value (no database text holds one), a partition value wider than its
    column, or a record over the size limit. (Unreadable lines are caught while the export is
    read.)"""
    if ("\\u0000" in canonical or "\x00" in (start_url or "")) and _has_nul(record):
        return "nul_character", "a key or value holds a NUL character"
    if partition is not None and len(partition) > PARTITION_LIMIT:
        return (
            "partition_too_long",
            f"partition value has {len(partition)} characters; at most {PARTITION_LIMIT} fit",
        )
    if len(canonical) > max_record_bytes // 4:
        size = len(canonical.encode())
        if size > max_record_bytes:
            return "record_too_large", f"{size} bytes; the limit is {max_record_bytes} bytes"
    return None


def _has_nul(value: Any) -> bool:
    """Whether a NUL character hides in any key or string of a parsed record."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in str(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


class SetAside:
    """The records one sync set aside as invalid, counted per partition and reason (records
    whose partition is unknown or unusable are "unplaced"), with the first few lines."""

    def __init__(self) -> None:
        self.count = 0
        self.partitions: dict[str, dict[str, int]] = {}
        self.unplaced: dict[str, int] = {}
        self.lines: list[dict[str, Any]] = []

    def add(self, item: InvalidRecord) -> None:
        """Count one invalid record."""
        self.count += 1
        usable = item.partition is not None and len(item.partition) <= PARTITION_LIMIT
        bucket = self.partitions.setdefault(str(item.partition), {}) if usable else self.unplaced
        bucket[item.reason] = bucket.get(item.reason, 0) + 1
        if len(self.lines) < INVALID_SAMPLES:
            self.lines.append(
                {
                    "line": item.line,
                    "reason": item.reason,
                    "detail": item.detail,
                    "partition": item.partition if usable else None,
                }
            )

    def as_detail(self) -> dict[str, Any] | None:
        """What the attempt stores in invalid_detail (None when nothing was set aside)."""
        if not self.count:
            return None
        return {"partitions": self.partitions, "unplaced": self.unplaced, "lines": self.lines}


@dataclass(frozen=True)
class UpsertCounts:
    """What one sync did to the observations table."""

    staged: int
    inserted: int
    updated: int
    unchanged: int
    duplicate_keys: int
    conflicting_duplicates: int


_STAGING = (
    "CREATE TEMP TABLE IF NOT EXISTS obs_staging (ord integer, observation_key text, "
    "payload_hash text, entity_key text, partition text, start_url text, payload text)"
)
_STAGED_COLUMNS = "ord, observation_key, payload_hash, entity_key, partition, start_url, payload"


class ObservationStager:
    """Collects one job's records in a temporary table (COPY on PostgreSQL), then merges them
    into observations: new keys inserted, changed payloads updated, unchanged payloads neither
    written nor locked. Memory stays flat however many records the job has.

    The staged payload is text: only the rows that are written get parsed as JSON. One
    statement merges: it joins the staged hashes with the stored ones and writes only what is
    new or changed (nothing is copied into a change table first), and counts what it wrote.
    """

    def __init__(self, session: Session, *, batch_size: int = 5000) -> None:
        self.session = session
        self.conn: Connection = session.connection()
        self.postgres = self.conn.dialect.name == "postgresql"
        self.batch_size = batch_size
        self.count = 0
        self._batch: list[tuple[Any, ...]] = []
        self.conn.exec_driver_sql(_STAGING + (" ON COMMIT DROP" if self.postgres else ""))
        self.conn.exec_driver_sql("DELETE FROM obs_staging")

    def add(
        self,
        observation_key: str,
        entity_key: str,
        partition: str | None,
        start_url: str | None,
        canonical_payload: str,
        payload_hash: str,
    ) -> None:
        """Stage one record."""
        self.count += 1
        self._batch.append(
            (
                self.count,
                observation_key,
                payload_hash,
                entity_key,
                partition,
                start_url,
                canonical_payload,
            )
        )
        if len(self._batch) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        """Write the buffered records to the staging table."""
        if not self._batch:
            return
        if self.postgres:
            raw = self.conn.connection.driver_connection
            assert raw is not None
            with (
                raw.cursor() as cursor,
                cursor.copy(f"COPY obs_staging ({_STAGED_COLUMNS}) FROM STDIN") as copy,
            ):
                for row in self._batch:
                    copy.write_row(row)
        else:
            self.conn.exec_driver_sql(
                f"INSERT INTO obs_staging ({_STAGED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",  # noqa: S608 - constant SQL
                self._batch,
            )
        self._batch.clear()

    def merge(
        self,
        *,
        dataset: str,
        run_id: str,
        window: str,
        job_id: int,
        attempt_id: str,
        now: datetime,
    ) -> UpsertCounts:
        """Merge the staged records into observations; the last record of a key wins."""
        self.flush()
        conn = self.conn
        dup = conn.execute(
            text(
                "SELECT count(*) AS keys, coalesce(sum(n), 0) AS n, "
                "count(*) FILTER (WHERE first_hash <> last_hash) AS conflicting "
                "FROM (SELECT count(*) AS n, min(payload_hash) AS first_hash, "
                "max(payload_hash) AS last_hash FROM obs_staging "
                "GROUP BY observation_key HAVING count(*) > 1) AS d"
            )
        ).one()
        duplicates = int(dup.n) - int(dup.keys)
        if duplicates:
            conn.execute(
                text(
                    "DELETE FROM obs_staging WHERE ord IN (SELECT s.ord FROM obs_staging s "
                    "JOIN (SELECT observation_key, max(ord) AS last FROM obs_staging "
                    "GROUP BY observation_key HAVING count(*) > 1) AS d "
                    "ON d.observation_key = s.observation_key WHERE s.ord < d.last)"
                )
            )
        # One join finds what is new or changed; only those rows are written (or even locked).
        # The conflict clause keeps a payload that another sync made the same from a rewrite.
        payload = "CAST(c.payload AS jsonb)" if self.postgres else "c.payload"
        upsert = (
            "INSERT INTO observations (observation_key, dataset, entity_key, run_id, "  # noqa: S608 - constant SQL
            "collection_window, partition, start_url, payload, payload_hash, "
            "source_job_id, source_attempt_id, validation_state, first_seen_at, "
            "last_changed_at) "
            "SELECT c.observation_key, :dataset, c.entity_key, :run_id, :window, "
            f"c.partition, c.start_url, {payload}, c.payload_hash, :job_id, :attempt_id, "
            "'pending', :now, :now FROM obs_staging c "
            "LEFT JOIN observations o ON o.observation_key = c.observation_key "
            "WHERE o.observation_key IS NULL OR o.payload_hash <> c.payload_hash "
            "ON CONFLICT (observation_key) DO UPDATE SET "
            "payload = excluded.payload, payload_hash = excluded.payload_hash, "
            "partition = excluded.partition, start_url = excluded.start_url, "
            "entity_key = excluded.entity_key, source_job_id = excluded.source_job_id, "
            "source_attempt_id = excluded.source_attempt_id, "
            "validation_state = 'pending', last_changed_at = excluded.last_changed_at "
            "WHERE observations.payload_hash <> excluded.payload_hash"
        )
        params = {
            "dataset": dataset,
            "run_id": run_id,
            "window": window,
            "job_id": job_id,
            "attempt_id": attempt_id,
            "now": now,
        }
        if self.postgres:
            inserted, updated = self._write_changes(upsert, params)
        else:  # one writer at a time: what the join finds is what the upsert writes
            written = conn.execute(
                text(
                    "SELECT count(*) AS written, "
                    "count(*) FILTER (WHERE o.observation_key IS NULL) AS new "
                    "FROM obs_staging c LEFT JOIN observations o "
                    "ON o.observation_key = c.observation_key "
                    "WHERE o.observation_key IS NULL OR o.payload_hash <> c.payload_hash"
                )
            ).one()
            if written.written:
                conn.execute(text(upsert).bindparams(bindparam("now", type_=UTCDateTime())), params)
            inserted = int(written.new)
            updated = int(written.written) - inserted
        if self.postgres:
            conn.exec_driver_sql("DROP TABLE obs_staging")
        else:
            conn.exec_driver_sql("DELETE FROM obs_staging")
        return UpsertCounts(
            staged=self.count,
            inserted=inserted,
            updated=updated,
            unchanged=self.count - duplicates - inserted - updated,
            duplicate_keys=duplicates,
            conflicting_duplicates=int(dup.conflicting),
        )

    def _write_changes(self, upsert: str, params: dict[str, Any]) -> tuple[int, int]:
        """Write new and changed rows on PostgreSQL; (inserted, updated).

        One join counts what is new and what changed; a plain UPDATE of the changed keys and a
        plain INSERT of the new ones, each run only when needed, cost about half of one
        INSERT ... ON CONFLICT. If another sync inserted one of the new keys meanwhile,
        the INSERT fails on the unique key: it is undone to its savepoint and the upsert,
        which takes such rows as they are by now, writes what is left.
        """
        conn = self.conn
        now = bindparam("now", type_=UTCDateTime())
        todo = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE o.observation_key IS NULL) AS new, "
                "count(*) FILTER (WHERE o.payload_hash <> c.payload_hash) AS changed "
                "FROM obs_staging c LEFT JOIN observations o "
                "ON o.observation_key = c.observation_key"
            )
        ).one()
        updated = 0
        if todo.changed:
            updated = conn.execute(
                text(
                    "UPDATE observations o SET payload = CAST(c.payload AS jsonb), "
                    "payload_hash = c.payload_hash, partition = c.partition, "
                    "start_url = c.start_url, entity_key = c.entity_key, source_job_id = :job_id, "
                    "source_attempt_id = :attempt_id, validation_state = 'pending', "
                    "last_changed_at = :now FROM obs_staging c "
                    "WHERE o.observation_key = c.observation_key "
                    "AND o.payload_hash <> c.payload_hash"
                ).bindparams(now),
                params,
            ).rowcount
        if not todo.new:
            return 0, int(updated)
        conn.exec_driver_sql("SAVEPOINT obs_insert")
        try:
            inserted = conn.execute(
                text(
                    upsert.partition(" LEFT JOIN ")[0]  # noqa: S608 - constant SQL
                    + " WHERE NOT EXISTS (SELECT 1 FROM observations o "
                    "WHERE o.observation_key = c.observation_key)"
                ).bindparams(now),
                params,
            ).rowcount
            conn.exec_driver_sql("RELEASE SAVEPOINT obs_insert")
            return int(inserted), int(updated)
        except IntegrityError:
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT obs_insert")
            written = conn.execute(
                text(
                    f"WITH w AS ({upsert} RETURNING xmax = 0 AS is_new) "  # noqa: S608 - constant SQL
                    "SELECT count(*) AS written, count(*) FILTER (WHERE is_new) AS new FROM w"
                ).bindparams(now),
                params,
            ).one()
            return int(written.new), int(updated) + int(written.written) - int(written.new)


def task_row(session: Session, task_key: str) -> dict[str, Any] | None:
    """The task as plain values, for status and tests."""
    row = session.execute(
        select(SyncTask).where(SyncTask.task_key == task_key)
    ).scalar_one_or_none()
    if row is None:
        return None
    return {c.name: getattr(row, c.key) for c in SyncTask.__table__.columns}


def count_rows(session: Session, model: type[Any], *where: Any) -> int:
    """How many rows of ``model`` match ``where``."""
    return int(session.execute(select(func.count()).select_from(model).where(*where)).scalar_one())


def ensure_run(
    session: Session,
    *,
    run_id: str,
    dataset: str,
    window: str,
    sitemap_id: int | None,
    sitemap_name: str | None,
    now: datetime,
) -> None:
    """Create the run if it does not exist yet; an existing run is left as it is."""
    stmt = _insert(session)(Run).values(
        run_id=run_id,
        dataset=dataset,
        collection_window=window,
        sitemap_id=sitemap_id,
        sitemap_name=sitemap_name,
        state="collecting",
        reasons=[],
        created_at=now,
        updated_at=now,
    )
    session.execute(stmt.on_conflict_do_nothing(index_elements=["run_id"]))


def due_tasks(session: Session, *, now: datetime, limit: int = 1000) -> list[tuple[str, int, int]]:
    """Tasks a worker should be running now: due pending or retry_wait tasks and expired leases
    (task key, requested generation, attempts so far)."""
    t = SyncTask.__table__.c
    rows = session.execute(
        select(t.task_key, t.requested_generation, t.attempt_count)
        .where(
            or_(
                and_(t.state.in_(CLAIMABLE), t.next_attempt_at <= now),
                and_(t.state == "leased", t.lease_until < now),
            )
        )
        .order_by(t.next_attempt_at)
        .limit(limit)
    ).all()
    return [(r.task_key, r.requested_generation, r.attempt_count) for r in rows]
