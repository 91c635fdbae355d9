"""Alerts the maintenance pass raises or settles from the states that already exist: sync tasks
``dead`` or ``quarantined``, deliveries ``dead``, the Cloud API budget spent, a dataset without an
accepted run for longer than its ``stale_after``. Each holds while its state does: one message
per alert interval while it lasts, and one when it ends. The pass then queues the sender when
messages are due (a message written by a verdict whose worker died is sent from here)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from config.datasets import Datasets
from sync import logs
from sync.alerts import messages, sender
from sync.alerts.conditions import AlertReason, Notice, catch_up, fire, recover
from sync.bootstrap import Services
from sync.models import Delivery, OutboxEvent, Run, SyncTask
from sync.states import DeliveryState, TaskState

log = logs.get("alerts")

STUCK = (TaskState.DEAD, TaskState.QUARANTINED)


def _grouped(rows: Sequence[Any]) -> dict[str | None, list[dict[str, Any]]]:
    groups: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        values = dict(row)
        groups[values.pop("dataset")].append(values)
    return groups


def _level(
    session: Session,
    datasets: Datasets,
    reason: str,
    groups: Mapping[str | None, list[dict[str, Any]]],
    firing: Callable[[str | None, list[dict[str, Any]]], Notice],
    recovered: Callable[[str | None], Notice],
    now: datetime,
) -> int:
    """Fire ``reason`` for each dataset (None: the account) with rows, recover it for the rest."""
    written = 0
    for dataset in {None, *datasets.by_name, *groups}:
        rows = groups.get(dataset, [])
        if rows:
            written += fire(
                session,
                datasets,
                dataset=dataset,
                reason=reason,
                notice=firing(dataset, rows),
                now=now,
            )
        else:
            written += recover(
                session,
                datasets,
                dataset=dataset,
                reason=reason,
                notice=recovered(dataset),
                now=now,
            )
    return written


def _stuck_tasks(session: Session, datasets: Datasets, now: datetime) -> int:
    t, r = SyncTask.__table__.c, Run.__table__.c
    rows = (
        session.execute(
            select(
                t.job_id,
                t.state,
                t.last_error_class.label("error_class"),
                t.last_error.label("error"),
                r.dataset,
            )
            .select_from(SyncTask.__table__.outerjoin(Run.__table__, r.run_id == t.run_id))
            .where(t.state.in_(STUCK))
            .order_by(t.updated_at.desc())
        )
        .mappings()
        .all()
    )
    return _level(
        session,
        datasets,
        AlertReason.TASK_STUCK,
        _grouped(rows),
        lambda dataset, found: messages.tasks_stuck(
            dataset, found[: messages.MAX_LISTED], len(found)
        ),
        messages.tasks_recovered,
        now,
    )


def _dead_deliveries(session: Session, datasets: Datasets, now: datetime) -> int:
    d, o = Delivery.__table__.c, OutboxEvent.__table__.c
    rows = (
        session.execute(
            select(
                d.event_id,
                o.event_type,
                d.destination,
                d.last_status.label("status"),
                d.last_error.label("error"),
                o.dataset,
            )
            .select_from(Delivery.__table__.join(OutboxEvent.__table__, o.event_id == d.event_id))
            .where(d.state == DeliveryState.DEAD)
            .order_by(d.id)
        )
        .mappings()
        .all()
    )
    return _level(
        session,
        datasets,
        AlertReason.DELIVERY_DEAD,
        _grouped(rows),
        lambda dataset, found: messages.deliveries_dead(
            dataset, found[: messages.MAX_LISTED], len(found)
        ),
        messages.deliveries_recovered,
        now,
    )


def _stale(session: Session, datasets: Datasets, now: datetime) -> int:
    written = 0
    for dataset in datasets:
        last = session.execute(
            select(Run.run_id, Run.accepted_at)
            .where(Run.dataset == dataset.name, Run.accepted_at.is_not(None))
            .order_by(Run.accepted_at.desc())
            .limit(1)
        ).one_or_none()
        since = (
            last.accepted_at
            if last is not None
            else session.execute(
                select(func.min(Run.created_at)).where(Run.dataset == dataset.name)
            ).scalar_one_or_none()
        )
        last_run_id = last.run_id if last is not None else None
        limit = dataset.stale_after
        if since is not None and limit is not None and now - since > timedelta(seconds=limit):
            notice = messages.stale(
                dataset.name, stale_after=limit, since=since, last_run_id=last_run_id, now=now
            )
            written += fire(
                session,
                datasets,
                dataset=dataset.name,
                reason=AlertReason.STALE,
                notice=notice,
                now=now,
            )
        else:
            notice = messages.stale_recovered(dataset.name, last_run_id=last_run_id)
            written += recover(
                session,
                datasets,
                dataset=dataset.name,
                reason=AlertReason.STALE,
                notice=notice,
                now=now,
            )
    return written


def _budget(services: Services, session: Session, now: datetime) -> int:
    if services.budget is None:
        return 0
    try:
        spent = services.budget.remaining() <= 0
    except Exception:  # Redis did not answer: the next pass asks again
        log.warning("alerts.budget_unknown", exc_info=True)
        return 0
    settings = services.settings
    if spent:
        notice = messages.budget_spent(settings.api_budget_limit, settings.api_budget_window)
        return fire(
            session,
            services.datasets,
            dataset=None,
            reason=AlertReason.BUDGET_SPENT,
            notice=notice,
            now=now,
        )
    return recover(
        session,
        services.datasets,
        dataset=None,
        reason=AlertReason.BUDGET_SPENT,
        notice=messages.budget_recovered(),
        now=now,
    )


def check(services: Services) -> dict[str, int]:
    """Raise and settle the alerts the maintenance pass watches (each check in a transaction of
    its own), write what the alert interval held back, and queue the sender if messages are
    due."""
    datasets = services.datasets
    written = 0
    if datasets.alerts:
        checks: tuple[Callable[[Session, datetime], int], ...] = (
            lambda s, now: _stuck_tasks(s, datasets, now),
            lambda s, now: _dead_deliveries(s, datasets, now),
            lambda s, now: _stale(s, datasets, now),
            lambda s, now: _budget(services, s, now),
            lambda s, now: catch_up(s, datasets, now=now),
        )
        for step in checks:
            with services.uow.begin() as session:
                written += step(session, services.clock())
                session.commit()
    due = sender.due_alerts(services)
    if due:
        bucket = int(services.clock().timestamp() // services.settings.sweep_interval)
        services.dispatcher.alerts(suffix=f"b{bucket}")
    return {"alerts_written": written, "alerts_due": due}
