"""The alerts' write side: a condition fires or recovers inside the transaction of the state it
reports, and the messages it causes are rows of ``alerts`` written in that same transaction, so
a crash never loses one or sends one twice (the sender claims each row once, like the relay).

The rule, per dataset and reason (``''`` is the account: an alert about no one dataset):

- A condition that fires writes one message per channel that covers the dataset, unless a
  message for it was written less than ``alert_interval`` ago: then it is marked firing and
  keeps what it had to say, which the maintenance pass writes once the interval is over if the
  condition still holds (:func:`catch_up`). A condition checked by the maintenance pass (a dead
  delivery, a stale dataset...) fires on every pass while it holds: a reminder per interval.
- A condition that recovers writes a "recovered" message, if its firing was announced.
- Alert ids are derived from dataset, reason and the condition's message count, so writing one
  message twice writes one row.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from config.datasets import Datasets
from sync.db import insert
from sync.models import Alert, AlertCondition
from sync.states import DeliveryState

ACCOUNT = ""  # the dataset column of an alert about the whole account


class AlertReason(StrEnum):
    """Why people are told: ``alerts.reason`` and ``alert_conditions.reason``."""

    RUN_REJECTED = "run_rejected"
    PARTITION_QUARANTINED = "partition_quarantined"
    DELIVERY_DEAD = "delivery_dead"
    TASK_STUCK = "task_stuck"
    BUDGET_SPENT = "budget_spent"
    STALE = "stale"


class AlertStatus(StrEnum):
    """``alerts.status``: whether a message says something is wrong, or that it recovered."""

    FIRING = "firing"
    RECOVERED = "recovered"


@dataclass(frozen=True)
class Notice:
    """What a message says: a line of text, the command that shows more, and the figures."""

    text: str
    command: str
    subject: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def alert_id_for(dataset: str, reason: str, number: int, channel: str) -> str:
    """The stable id of a condition's ``number``-th message to ``channel``."""
    key = f"{dataset}\x1f{reason}\x1f{number}\x1f{channel}"
    return f"alt_{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def _condition(session: Session, dataset: str, reason: str, now: datetime) -> AlertCondition:
    """The condition's row, created if new, locked for this transaction."""
    session.execute(
        insert(session, AlertCondition)
        .values(
            dataset=dataset,
            reason=reason,
            firing=False,
            announced=False,
            messages=0,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=["dataset", "reason"])
    )
    return session.execute(
        select(AlertCondition)
        .where(AlertCondition.dataset == dataset, AlertCondition.reason == reason)
        .with_for_update()
    ).scalar_one()


def _write(
    session: Session,
    datasets: Datasets,
    condition: AlertCondition,
    status: str,
    notice: Notice,
    now: datetime,
) -> int:
    """One message per channel covering the condition's dataset; returns how many."""
    condition.messages += 1
    dataset = condition.dataset or None
    written = 0
    for channel in datasets.alerts:
        if not channel.covers(dataset):
            continue
        session.execute(
            insert(session, Alert)
            .values(
                alert_id=alert_id_for(
                    condition.dataset, condition.reason, condition.messages, channel.key
                ),
                channel=channel.key,
                dataset=dataset,
                reason=condition.reason,
                status=status,
                subject=notice.subject,
                text=notice.text,
                details=notice.details,
                command=notice.command,
                created_at=now,
                state=DeliveryState.UNSENT,
                attempts=0,
                next_attempt_at=now,
            )
            .on_conflict_do_nothing(index_elements=["alert_id"])
        )
        written += 1
    return written


def watched(datasets: Datasets, dataset: str | None) -> bool:
    """Whether any channel is told about ``dataset`` (nothing is written for no one)."""
    return any(channel.covers(dataset) for channel in datasets.alerts)


def fire(
    session: Session,
    datasets: Datasets,
    *,
    dataset: str | None,
    reason: str,
    notice: Notice,
    now: datetime,
) -> int:
    """The condition holds now: message the channels unless they were told within the alert
    interval; returns how many messages were written."""
    if not watched(datasets, dataset):
        return 0
    condition = _condition(session, dataset or ACCOUNT, reason, now)
    if not condition.firing:
        condition.firing = True
        condition.announced = False
        condition.since = now
    condition.subject = notice.subject
    condition.notice = _stored(notice)
    condition.updated_at = now
    last = condition.last_alerted_at
    if last is not None and now - last < timedelta(seconds=datasets.alert_interval):
        return 0
    condition.last_alerted_at = now
    condition.announced = True
    return _write(session, datasets, condition, AlertStatus.FIRING, notice, now)


def _stored(notice: Notice) -> dict[str, Any]:
    return {
        "text": notice.text,
        "command": notice.command,
        "subject": notice.subject,
        "details": notice.details,
    }


def catch_up(session: Session, datasets: Datasets, *, now: datetime) -> int:
    """Write the messages the alert interval held back, for conditions that still fire once it
    is over; returns how many were written."""
    if not datasets.alerts:
        return 0
    due = now - timedelta(seconds=datasets.alert_interval)
    held = session.execute(
        select(AlertCondition)
        .where(
            AlertCondition.firing,
            ~AlertCondition.announced,
            AlertCondition.notice.is_not(None),
            AlertCondition.last_alerted_at <= due,
        )
        .with_for_update(skip_locked=True)
    ).scalars()
    written = 0
    for condition in held:
        stored = dict(condition.notice or {})
        notice = Notice(
            text=str(stored.get("text", "")),
            command=str(stored.get("command", "scrapesync status")),
            subject=stored.get("subject"),
            details=dict(stored.get("details") or {}),
        )
        condition.last_alerted_at = now
        condition.announced = True
        condition.updated_at = now
        written += _write(session, datasets, condition, AlertStatus.FIRING, notice, now)
    return written


def recover(
    session: Session,
    datasets: Datasets,
    *,
    dataset: str | None,
    reason: str,
    notice: Notice,
    now: datetime,
) -> int:
    """The condition no longer holds: say so, if its firing was announced; returns how many
    messages were written."""
    if not watched(datasets, dataset):
        return 0
    condition = session.execute(
        select(AlertCondition)
        .where(AlertCondition.dataset == (dataset or ACCOUNT), AlertCondition.reason == reason)
        .with_for_update()
    ).scalar_one_or_none()
    if condition is None or not condition.firing:
        return 0
    announced = condition.announced
    condition.firing = False
    condition.announced = False
    condition.updated_at = now
    if not announced:
        return 0
    return _write(session, datasets, condition, AlertStatus.RECOVERED, notice, now)


def firing(session: Session, dataset: str | None, reason: str) -> bool:
    """Whether the condition is firing now."""
    return bool(
        session.execute(
            select(AlertCondition.firing).where(
                AlertCondition.dataset == (dataset or ACCOUNT), AlertCondition.reason == reason
            )
        ).scalar_one_or_none()
    )
