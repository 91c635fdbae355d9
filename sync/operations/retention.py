"""Retention: what the maintenance pass deletes, a few small batches at a time.

Observations: a dataset with ``retain_windows = N`` keeps the observations of its last N
collection windows (the windows of its runs, in ``window_order``); older runs' observations go.
Some older runs keep theirs whatever their age, because a reader or a later step needs them:

- the run the dataset's pointer publishes;
- the run the pointer falls back to if that run fails a later evaluation (the newest other
  accepted run), so that a withdrawal never publishes an emptied run;
- any run whose rows the dataset's current table still holds (an entity of a partition
  quarantined under ``publish_passing`` keeps its row from an earlier run);
- a run an outbox event not yet delivered announces (its receivers may come back to it);
- a run not yet judged (collecting or candidate: its evaluation reads them).

The runs, their verdicts and profiles (the history acceptance judges later runs against) and
the dataset's ``_history`` (its ``_closed`` stretches) and ``_changes`` are never touched.

Notifications older than ``SCRAPESYNC_NOTIFICATIONS_RETENTION_DAYS``, attempts older than
``SCRAPESYNC_ATTEMPTS_RETENTION_DAYS`` (except each task's latest, which says how it last went)
and delivered outbox events older than ``SCRAPESYNC_OUTBOX_RETENTION_DAYS`` with their
deliveries are deleted too; 0 days keeps them all.

Every DELETE removes at most ``batch_size`` rows in a transaction of its own, and a pass deletes
at most ``batches`` x ``batch_size`` rows per table: no pass holds locks for long, and the next
pass goes on where this one stopped. Each deletion checks its conditions again inside its own
transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    FromClause,
    and_,
    delete,
    exists,
    inspect,
    null,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import logs
from sync.bootstrap import Services
from sync.datasets.tables import tables_for
from sync.models import (
    Attempt,
    Base,
    Delivery,
    Notification,
    Observation,
    OutboxEvent,
    Publication,
    Run,
    SetAsideRecord,
)
from sync.runs.publication import window_order
from sync.states import OutboxState, RunState

log = logs.get("retention")

BATCH_SIZE = 5000
BATCHES_PER_PASS = 4
LOCK_TIMEOUT = "5s"  # a batch that would wait longer behind a sync gives up until the next pass

UNJUDGED = (RunState.COLLECTING, RunState.CANDIDATE)
FALLBACK_STATES = (RunState.ACCEPTED, RunState.PUBLISHED)


@dataclass(frozen=True)
class Limits:
    """How much one pass may delete: ``batches`` DELETEs of at most ``batch_size`` rows per
    table."""

    batch_size: int = BATCH_SIZE
    batches: int = BATCHES_PER_PASS

    @property
    def per_pass(self) -> int:
        """The most rows one pass deletes from one table."""
        return self.batch_size * self.batches


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class WindowRun:
    """A run as retention sees it: its collection window and when it began."""

    run_id: str
    collection_window: str
    created_at: datetime


def expired(runs: Iterable[WindowRun], keep: int) -> list[str]:
    """The runs whose windows are older than the last ``keep`` windows, oldest first.

    Windows of one kind are ordered by ``window_order``; when the datasets file changed the kind
    of window, the kinds follow each other in the order their first runs began."""
    runs = list(runs)
    began: dict[str, datetime] = {}
    for run in runs:
        kind = window_order(run.collection_window)[0]
        began[kind] = min(began.get(kind, run.created_at), run.created_at)
    kinds = sorted(began, key=lambda kind: (began[kind], kind))

    def place(run: WindowRun) -> tuple[int, tuple[str, int | str]]:
        order = window_order(run.collection_window)
        return (kinds.index(order[0]), order)

    ordered = sorted(runs, key=place)
    return [run.run_id for run in ordered[: max(0, len(ordered) - keep)]]


def _bounded(session: Session) -> None:
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))


def _delete_in(session: Session, model: type[Base], key: str, chosen: Any) -> int:
    """DELETE the rows of ``model`` whose ``key`` ``chosen`` (a bounded SELECT) returns.

    The keys are read first and deleted by their index: a DELETE over ``IN (SELECT ...)`` may be
    planned as a scan of the whole table."""
    keys = list(session.execute(chosen).scalars())
    if not keys:
        return 0
    result = session.execute(
        delete(model)
        .where(model.__table__.c[key].in_(keys))
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


# --- observations -----------------------------------------------------------------------------


def _with_observations(session: Session, dataset: str) -> set[str]:
    """The dataset's runs that still have observations (one index probe per run)."""
    o = Observation.__table__
    return set(
        session.execute(
            select(Run.run_id).where(
                Run.dataset == dataset, exists().where(o.c.run_id == Run.run_id)
            )
        ).scalars()
    )


def candidates(session: Session, dataset: Dataset) -> list[str]:
    """The runs of ``dataset`` outside its last ``retain_windows`` windows that still have
    observations, oldest first (each is checked again for protection before a deletion)."""
    if dataset.retain_windows is None:
        return []
    runs = [
        WindowRun(r.run_id, r.collection_window, r.created_at)
        for r in session.execute(
            select(Run.run_id, Run.collection_window, Run.created_at).where(
                Run.dataset == dataset.name
            )
        )
    ]
    old = expired(runs, dataset.retain_windows)
    if not old:
        return []
    present = _with_observations(session, dataset.name)
    return [run_id for run_id in old if run_id in present]


def _fallback(session: Session, dataset: str, current: str) -> str | None:
    """The run the pointer would go back to if ``current`` failed a later evaluation."""
    return session.execute(
        select(Run.run_id)
        .where(Run.dataset == dataset, Run.run_id != current, Run.state.in_(FALLBACK_STATES))
        .order_by(Run.created_at.desc())
        .limit(1)
    ).scalar_one_or_none()


def protection(session: Session, dataset: Dataset, run_id: str, *, schema: str) -> str | None:
    """Why the observations of ``run_id`` must stay whatever their age, or None if they may go."""
    current = session.execute(
        select(Publication.run_id).where(
            Publication.dataset == dataset.name, Publication.is_current
        )
    ).scalar_one_or_none()
    if current == run_id:
        return "published"
    state = session.execute(select(Run.state).where(Run.run_id == run_id)).scalar_one_or_none()
    if state in UNJUDGED:
        return "unjudged"
    if current is not None and run_id == _fallback(session, dataset.name, current):
        return "fallback"
    announced = session.execute(
        select(OutboxEvent.id)
        .where(OutboxEvent.run_id == run_id, OutboxEvent.state != OutboxState.DELIVERED)
        .limit(1)
    ).first()
    if announced is not None:
        return "undelivered_event"
    dialect = session.get_bind().dialect.name
    current_table = tables_for(dataset.name, (), dialect=dialect, schema=schema).current
    connection = session.connection()
    if inspect(connection).has_table(current_table.name, schema=current_table.schema):
        kept = connection.execute(
            select(current_table.c.run_id).where(current_table.c.run_id == run_id).limit(1)
        ).first()
        if kept is not None:
            return "in_current_table"
    return None


def prune_observations(services: Services, limits: Limits = DEFAULT_LIMITS) -> int:
    """Delete observations of runs older than their dataset's ``retain_windows``, at most
    ``limits.per_pass`` rows in this pass, ``limits.batch_size`` per DELETE; returns how many
    went. A run's last batch is short; the pass then goes on to the next run."""
    left = limits.per_pass
    o = Observation.__table__
    for dataset in services.datasets:
        if dataset.retain_windows is None:
            continue
        with services.uow.begin() as session:
            old = candidates(session, dataset)
        for run_id in old:
            while left > 0:
                size = min(limits.batch_size, left)
                with services.uow.begin() as session:
                    _bounded(session)
                    why = protection(session, dataset, run_id, schema=services.settings.data_schema)
                    if why is not None:
                        log.debug("retention.kept", extra={"run_id": run_id, "reason": why})
                        break
                    picked = o.alias("picked")
                    chosen = select(picked.c.id).where(picked.c.run_id == run_id).limit(size)
                    gone = _delete_in(session, Observation, "id", chosen)
                    # its rows per group, if kept, are no longer the run's
                    session.execute(
                        update(Run).where(Run.run_id == run_id).values(row_groups=null())
                    )
                    if gone < size:  # the run's last rows: its set-aside records go with them
                        session.execute(
                            delete(SetAsideRecord).where(SetAsideRecord.run_id == run_id)
                        )
                    session.commit()
                left -= gone
                if gone < size:
                    break
            if left == 0:
                break
    deleted = limits.per_pass - left
    _said("observations", deleted)
    return deleted


def _said(table: str, rows: int) -> None:
    if rows:
        log.info("retention.pruned", extra={"table": table, "rows": rows})


# --- notifications, attempts, the outbox -------------------------------------------------------


def cutoff(services: Services, days: float) -> datetime | None:
    """The moment before which rows kept for ``days`` may go (None: 0 days, keep all)."""
    return None if days <= 0 else services.clock() - timedelta(days=days)


def _in_batches(services: Services, table: str, limits: Limits, batch: Any) -> int:
    """Run ``batch(session)`` (which deletes at most ``limits.batch_size`` rows) until it
    deletes fewer or the pass's batches are spent; each batch commits on its own."""
    deleted = 0
    for _ in range(limits.batches):
        with services.uow.begin() as session:
            _bounded(session)
            gone = int(batch(session))
            session.commit()
        deleted += gone
        if gone < limits.batch_size:
            break
    _said(table, deleted)
    return deleted


def prune_notifications(services: Services, limits: Limits = DEFAULT_LIMITS) -> int:
    """Delete notifications received before the retention period; returns how many went."""
    before = cutoff(services, services.settings.notifications_retention_days)
    if before is None:
        return 0
    n = Notification.__table__
    picked = n.alias("picked")
    chosen = (
        select(picked.c.id)
        .where(picked.c.received_at < before)
        .order_by(picked.c.received_at)
        .limit(limits.batch_size)
    )
    return _in_batches(
        services,
        "notifications",
        limits,
        lambda session: _delete_in(session, Notification, "id", chosen),
    )


def prune_attempts(services: Services, limits: Limits = DEFAULT_LIMITS) -> int:
    """Delete attempts started before the retention period, except each task's latest attempt;
    returns how many went."""
    before = cutoff(services, services.settings.attempts_retention_days)
    if before is None:
        return 0
    a = Attempt.__table__
    picked, later = a.alias("picked"), a.alias("later")
    superseded = exists().where(
        later.c.task_key == picked.c.task_key,
        or_(
            later.c.started_at > picked.c.started_at,
            and_(
                later.c.started_at == picked.c.started_at,
                later.c.attempt_id > picked.c.attempt_id,
            ),
        ),
    )
    chosen = (
        select(picked.c.attempt_id)
        .where(picked.c.started_at < before, superseded)
        .order_by(picked.c.started_at)
        .limit(limits.batch_size)
    )
    return _in_batches(
        services,
        "attempts",
        limits,
        lambda session: _delete_in(session, Attempt, "attempt_id", chosen),
    )


def _delivered_before(event: FromClause, before: datetime) -> ColumnElement[bool]:
    return and_(event.c.state == OutboxState.DELIVERED, event.c.delivered_at < before)


def prune_outbox(services: Services, limits: Limits = DEFAULT_LIMITS) -> dict[str, int]:
    """Delete outbox events delivered before the retention period, their deliveries first (an
    event goes in the batch after its last delivery); returns how many of each went."""
    counts = {"outbox_pruned": 0, "deliveries_pruned": 0}
    before = cutoff(services, services.settings.outbox_retention_days)
    if before is None:
        return counts
    o, d = OutboxEvent.__table__, Delivery.__table__
    event, delivery = o.alias("event"), d.alias("delivery")
    deliveries = (
        select(delivery.c.id)
        .join(event, event.c.event_id == delivery.c.event_id)
        .where(_delivered_before(event, before))
        .order_by(event.c.delivered_at, delivery.c.id)
        .limit(limits.batch_size)
    )
    events = (
        select(event.c.id)
        .where(
            _delivered_before(event, before),
            ~exists().where(delivery.c.event_id == event.c.event_id),
        )
        .order_by(event.c.delivered_at)
        .limit(limits.batch_size)
    )
    for _ in range(limits.batches):
        with services.uow.begin() as session:
            _bounded(session)
            gone_deliveries = _delete_in(session, Delivery, "id", deliveries)
            gone_events = _delete_in(session, OutboxEvent, "id", events)
            session.commit()
        counts["deliveries_pruned"] += gone_deliveries
        counts["outbox_pruned"] += gone_events
        if gone_deliveries < limits.batch_size and gone_events < limits.batch_size:
            break
    _said("deliveries", counts["deliveries_pruned"])
    _said("outbox", counts["outbox_pruned"])
    return counts
