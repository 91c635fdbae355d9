"""The alert sender: sends the ``alerts`` rows that are due, as the relay sends deliveries.

- A row is claimed (``unsent``, ``failed`` and due, or ``sending`` whose lease expired because
  its worker died) by one conditional UPDATE that bumps ``attempts``; ``attempts`` then fences
  the outcome, so a sender that lost its claim writes nothing.
- States: ``unsent -> sending -> delivered``; ``sending -> failed -> sending``; ``-> dead``
  when the channel refuses for good or after ``MAX_ATTEMPTS``. A send whose fate is unknown (a
  worker killed after sending, before marking it) is sent again: at least once, and the signed
  webhook's ``webhook-id`` and the e-mail's Message-ID let a receiver see the repeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update

from sync import http, logs, retry
from sync.alerts import channels
from sync.bootstrap import Services
from sync.models import Alert
from sync.states import DeliveryState

log = logs.get("alerts")

TIMEOUT = 10.0
LEASE_MARGIN = 60.0
MAX_ATTEMPTS = 10
BACKOFF_BASE = 30.0
BACKOFF_CAP = 3600.0


@dataclass(frozen=True)
class SendReport:
    """What one pass of the sender did."""

    claimed: int
    delivered: int
    retrying: int
    dead: int


def _due(now: datetime) -> Any:
    a = Alert.__table__.c
    return or_(
        and_(a.state.in_((DeliveryState.UNSENT, DeliveryState.FAILED)), a.next_attempt_at <= now),
        and_(a.state == DeliveryState.SENDING, a.lease_until < now),
    )


def due_alerts(services: Services) -> int:
    """How many alert messages are due now, including ``sending`` ones whose worker died."""
    with services.uow.begin() as session:
        return int(session.execute(select(func.count()).where(_due(services.clock()))).scalar_one())


def send_due(services: Services, *, timeout: float = TIMEOUT, limit: int = 100) -> SendReport:
    """Send every due alert message once; returns what happened."""
    now = services.clock()
    with services.uow.begin() as session:
        due = list(
            session.execute(
                select(Alert.id).where(_due(now)).order_by(Alert.id).limit(limit)
            ).scalars()
        )
    if not due:
        return SendReport(0, 0, 0, 0)
    counts = {DeliveryState.DELIVERED: 0, DeliveryState.FAILED: 0, DeliveryState.DEAD: 0}
    claimed = 0
    by_key = {channel.key: channel for channel in services.datasets.alerts}
    with http.client(timeout=timeout, user_agent=channels.USER_AGENT) as client:
        for alert_id in due:
            claim = _claim(services, alert_id, lease_seconds=timeout * 3 + LEASE_MARGIN)
            if claim is None:
                continue
            claimed += 1
            attempts, channel_key, message = claim
            channel = by_key.get(channel_key)
            if channel is None:
                sent = channels.Sent(
                    DeliveryState.DEAD, error="channel no longer in the datasets file"
                )
            else:
                sent = channels.send(services.settings, client, channel, message)
            services.killpoints.reached("after-alert-send")
            state = _settle(services, alert_id, attempts, sent)
            if state is not None:
                counts[DeliveryState(state)] += 1
                _log(message, channel_key, attempts, state, sent)
    return SendReport(
        claimed,
        counts[DeliveryState.DELIVERED],
        counts[DeliveryState.FAILED],
        counts[DeliveryState.DEAD],
    )


def _claim(
    services: Services, alert_id: int, *, lease_seconds: float
) -> tuple[int, str, channels.Message] | None:
    now = services.clock()
    a = Alert.__table__.c
    with services.uow.begin() as session:
        row = session.execute(
            update(Alert)
            .where(a.id == alert_id, _due(now))
            .values(
                state=DeliveryState.SENDING,
                attempts=a.attempts + 1,
                lease_until=now + timedelta(seconds=lease_seconds),
            )
            .returning(
                a.attempts,
                a.channel,
                a.alert_id,
                a.dataset,
                a.reason,
                a.status,
                a.text,
                a.command,
                a.details,
                a.created_at,
            )
        ).one_or_none()
        session.commit()
    if row is None:
        return None
    message = channels.Message(
        alert_id=row.alert_id,
        dataset=row.dataset,
        reason=row.reason,
        status=row.status,
        text=row.text,
        command=row.command,
        details=dict(row.details or {}),
        created_at=row.created_at,
    )
    return row.attempts, row.channel, message


def _settle(services: Services, alert_id: int, attempts: int, sent: channels.Sent) -> str | None:
    """Record an attempt's outcome, fenced by the claim; its state, or None if the claim was
    lost."""
    now = services.clock()
    state = sent.state
    values: dict[str, Any] = {"lease_until": None, "last_error": sent.error}
    if state == DeliveryState.FAILED and attempts >= MAX_ATTEMPTS:
        state = DeliveryState.DEAD
        values["last_error"] = f"{sent.error}: gave up after {attempts} attempts"
    values["state"] = state
    if state == DeliveryState.DELIVERED:
        values["sent_at"] = now
    if state == DeliveryState.FAILED:
        wait = max(
            1.0, retry.backoff(attempts, services.random(), base=BACKOFF_BASE, cap=BACKOFF_CAP)
        )
        values["next_attempt_at"] = now + timedelta(seconds=wait)
    a = Alert.__table__.c
    with services.uow.begin() as session:
        result = session.execute(
            update(Alert)
            .where(a.id == alert_id, a.state == DeliveryState.SENDING, a.attempts == attempts)
            .values(**values)
        )
        session.commit()
    if not result.rowcount:  # type: ignore[attr-defined]
        log.warning("alert.claim_lost", extra={"alert_id": alert_id, "attempt": attempts})
        return None
    return str(state)


def _log(
    message: channels.Message, channel: str, attempts: int, state: str, sent: channels.Sent
) -> None:
    extra = {
        "alert_id": message.alert_id,
        "channel": channel,
        "dataset": message.dataset,
        "reason": message.reason,
        "status": message.status,
        "attempt": attempts,
        "state": state,
        "error": sent.error,
    }
    if state == DeliveryState.DELIVERED:
        log.info("alert.sent", extra=extra)
    else:
        log.warning(f"alert.{state}", extra=extra)


PRUNE_BATCH = 1000


def prune(services: Services) -> int:
    """Delete alert messages sent before the outbox's retention period (one bounded batch per
    pass; unsent, failed and dead ones stay); returns how many went."""
    days = services.settings.outbox_retention_days
    if not days:
        return 0
    before = services.clock() - timedelta(days=days)
    a = Alert.__table__.c
    with services.uow.begin() as session:
        batch = (
            select(a.id)
            .where(a.state == DeliveryState.DELIVERED, a.sent_at < before)
            .order_by(a.id)
            .limit(PRUNE_BATCH)
        )
        ids = list(session.execute(batch).scalars())
        if ids:
            session.execute(delete(Alert).where(a.id.in_(ids)))
        session.commit()
    return len(ids)
