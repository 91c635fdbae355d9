"""The operator's hold on deliveries: list them, replay events, enable a disabled destination,
and send a destination one signed ``ping``.

A replay puts deliveries back to ``unsent`` under their original ids, in their original place
in the destination's queue, so the receiver gets the same ``webhook-id`` again and deduplicates
it; it starts the destination's retry window afresh. A delivery being sent right now (``sending``
under a live lease) is left to finish. Nothing here re-collects or re-imports anything.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from config.datasets import Destination
from sync import http, logs
from sync.bootstrap import Services
from sync.datasets import export
from sync.db import insert
from sync.delivery import destinations, relay
from sync.models import Delivery, DestinationState, OutboxEvent
from sync.states import DeliveryState

log = logs.get("outbox")

# what ``--state`` names, as delivery states
STATE_CHOICES: dict[str, tuple[str, ...]] = {
    "dead": (DeliveryState.DEAD,),
    "failed": (DeliveryState.FAILED,),
    "pending": (DeliveryState.UNSENT, DeliveryState.SENDING),
    "delivered": (DeliveryState.DELIVERED,),
}
UNDELIVERED = ("dead", "failed", "pending")
PING_TYPE = "ping"


class BacklogError(Exception):
    """An operator asked for a destination or an event this deployment does not have; the
    message names it and what exists."""


@dataclass(frozen=True)
class Requeued:
    """What a replay put back in the queue: the deliveries, their events, and the disabled
    destinations among them (they wait until enabled)."""

    deliveries: int
    events: tuple[str, ...]
    disabled: tuple[str, ...]


@dataclass(frozen=True)
class Ping:
    """How a destination answered one signed ``ping``."""

    destination: str
    event_id: str
    status: int | None
    answer: str


# --- destinations by name ---------------------------------------------------------------------


def configured(services: Services) -> dict[str, Destination]:
    """Every destination of the datasets file, by its key."""
    found: dict[str, Destination] = {}
    for dataset in services.datasets:
        for destination in dataset.destinations:
            found.setdefault(destination.key, destination)
    return found


def resolve(services: Services, name: str) -> Destination:
    """The destination an operator names (by ``name``, URL, or ``file:PATH``)."""
    known = configured(services)
    matches = [d for d in known.values() if name in (d.label, d.key)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        listed = ", ".join(sorted(d.label for d in known.values())) or "none configured"
        raise BacklogError(f"no destination named {name!r}; the datasets file has: {listed}")
    raise BacklogError(f"{name!r} names {len(matches)} destinations: give each its own name")


def _label(services: Services, key: str) -> str:
    destination = configured(services).get(key)
    return destination.label if destination is not None else key


# --- listing ------------------------------------------------------------------------------------


def listing(
    services: Services,
    *,
    states: Iterable[str] = UNDELIVERED,
    destination: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Deliveries in the chosen states (``dead``, ``failed``, ``pending``, ``delivered``),
    oldest first, each with its event and its last answer."""
    wanted = [s for choice in states for s in STATE_CHOICES[choice]]
    query = (
        select(Delivery, OutboxEvent)
        .join(OutboxEvent, OutboxEvent.event_id == Delivery.event_id)
        .where(Delivery.state.in_(wanted))
        .order_by(Delivery.id)
        .limit(limit)
    )
    if destination is not None:
        query = query.where(Delivery.destination == resolve(services, destination).key)
    with services.uow.begin() as session:
        rows = session.execute(query).all()
        heads = _heads(session)
        return [
            {
                "event_id": event.event_id,
                "type": event.event_type,
                "dataset": event.dataset,
                "run_id": event.run_id,
                "created_at": _iso(event.created_at),
                "destination": _label(services, delivery.destination),
                "state": delivery.state,
                "attempts": delivery.attempts,
                "last_attempt_at": _iso(delivery.last_attempt_at),
                "next_attempt_at": _iso(delivery.next_attempt_at)
                if delivery.state in (DeliveryState.UNSENT, DeliveryState.FAILED)
                else None,
                "last_status": delivery.last_status,
                "last_error": delivery.last_error,
                "waits_behind": heads.get(delivery.destination)
                if delivery.state in relay.WAITING
                and heads.get(delivery.destination) not in (None, event.event_id)
                else None,
            }
            for delivery, event in rows
        ]


def _heads(session: Session) -> dict[str, str]:
    """Each destination's oldest waiting delivery's event: the one the others wait behind."""
    d = Delivery
    oldest = (
        select(d.destination, func.min(d.id).label("id"))
        .where(d.state.in_(relay.WAITING))
        .group_by(d.destination)
        .subquery()
    )
    rows = session.execute(
        select(d.destination, d.event_id).join(oldest, oldest.c.id == d.id)
    ).all()
    return {row.destination: row.event_id for row in rows}


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat(timespec="seconds") if moment is not None else None


def destination_states(services: Services) -> list[dict[str, Any]]:
    """Each destination that failed or was disabled: since when, and why."""
    with services.uow.begin() as session:
        return destination_rows(session, services)


def count_destinations(session: Session, *, disabled: bool) -> int:
    """How many destinations are disabled (or, with ``disabled=False``, failing but enabled)."""
    s = DestinationState
    where = (
        [s.disabled_at.is_not(None)]
        if disabled
        else [s.disabled_at.is_(None), s.failing_since.is_not(None)]
    )
    query = select(func.count()).select_from(DestinationState).where(*where)
    return int(session.execute(query).scalar_one())


def destination_rows(session: Session, services: Services) -> list[dict[str, Any]]:
    """Each destination that keeps failing or is disabled, in the caller's session."""
    rows = session.execute(
        select(DestinationState)
        .where(
            or_(
                DestinationState.disabled_at.is_not(None),
                DestinationState.failing_since.is_not(None),
            )
        )
        .order_by(DestinationState.destination)
    ).scalars()
    return [
        {
            "destination": _label(services, row.destination),
            "disabled_at": _iso(row.disabled_at),
            "disabled_reason": row.disabled_reason,
            "failing_since": _iso(row.failing_since),
        }
        for row in rows
    ]


# --- replay -------------------------------------------------------------------------------------


def replay(
    services: Services, event_ids: Sequence[str], *, destination: str | None = None
) -> Requeued:
    """Re-queue these events (to one destination, if named) under their own ids."""
    key = resolve(services, destination).key if destination is not None else None
    with services.uow.begin() as session:
        found = set(
            session.execute(
                select(OutboxEvent.event_id).where(OutboxEvent.event_id.in_(list(event_ids)))
            ).scalars()
        )
    missing = [e for e in event_ids if e not in found]
    if missing:
        raise BacklogError(
            f"no such event (or no longer kept): {', '.join(missing)}; "
            "`scrapesync deliveries list --state delivered` shows the events kept"
        )
    return _requeue(services, list(dict.fromkeys(event_ids)), key)


def replay_since(
    services: Services, since: datetime, *, destination: str | None = None
) -> Requeued:
    """Re-queue every event written after ``since`` (to one destination, if named)."""
    key = resolve(services, destination).key if destination is not None else None
    with services.uow.begin() as session:
        query = select(OutboxEvent.event_id, OutboxEvent.dataset).where(
            OutboxEvent.created_at > since
        )
        rows = session.execute(query.order_by(OutboxEvent.id)).all()
    if key is not None:
        rows = [r for r in rows if _announced_to(services, r.dataset, key)]
    return _requeue(services, [r.event_id for r in rows], key)


def _announced_to(services: Services, dataset: str | None, key: str) -> bool:
    """Whether an event goes to this destination: its dataset names it (today)."""
    if dataset is None or dataset not in services.datasets.by_name:
        return False
    return any(d.key == key for d in services.datasets.get(dataset).destinations)


def _requeue(services: Services, event_ids: list[str], key: str | None) -> Requeued:
    now = services.clock()
    d = Delivery.__table__.c
    count = 0
    touched: set[str] = set()
    with services.uow.begin() as session:
        for event_id in event_ids:
            if key is not None:  # a destination added after the event gets it too
                session.execute(
                    insert(session, Delivery)
                    .values(
                        event_id=event_id,
                        destination=key,
                        state=DeliveryState.UNSENT,
                        attempts=0,
                        next_attempt_at=now,
                    )
                    .on_conflict_do_nothing(index_elements=["event_id", "destination"])
                )
            mine = [d.event_id == event_id]
            if key is not None:
                mine.append(d.destination == key)
            sending_now = and_(d.state == DeliveryState.SENDING, d.lease_until >= now)
            targets = list(
                session.execute(select(d.destination).where(*mine, ~sending_now)).scalars()
            )
            result = session.execute(
                update(Delivery)
                .where(*mine, ~sending_now)
                .values(
                    state=DeliveryState.UNSENT,
                    next_attempt_at=now,
                    lease_until=None,
                    delivered_at=None,
                )
            )
            count += int(result.rowcount)  # type: ignore[attr-defined]
            touched.update(targets)
            relay.summarise(session, event_id, now)
        _fresh_window(session, touched, now)
        disabled = _disabled(session, touched)
        session.commit()
    for event_id in event_ids:
        services.dispatcher.delivery(event_id, suffix=f"replay{int(now.timestamp())}")
    log.info(
        "delivery.replayed",
        extra={"events": len(event_ids), "deliveries": count, "destination": key},
    )
    return Requeued(count, tuple(event_ids), tuple(_label(services, k) for k in disabled))


def _fresh_window(session: Session, keys: Iterable[str], now: datetime) -> None:
    """A replayed destination's retry window starts again at its next failure."""
    s = DestinationState.__table__.c
    session.execute(
        update(DestinationState)
        .where(s.destination.in_(sorted(keys)))
        .values(failing_since=None, updated_at=now)
    )


def _disabled(session: Session, keys: Iterable[str]) -> list[str]:
    return list(
        session.execute(
            select(DestinationState.destination).where(
                DestinationState.destination.in_(sorted(keys)),
                DestinationState.disabled_at.is_not(None),
            )
        ).scalars()
    )


def enable(services: Services, name: str) -> int:
    """Enable a destination disabled by a 410 (its retry window starts afresh); returns how
    many deliveries wait for it."""
    key = resolve(services, name).key
    now = services.clock()
    with services.uow.begin() as session:
        session.execute(
            update(DestinationState)
            .where(DestinationState.destination == key)
            .values(disabled_at=None, disabled_reason=None, failing_since=None, updated_at=now)
        )
        waiting = list(
            session.execute(
                select(Delivery.event_id)
                .where(Delivery.destination == key, Delivery.state.in_(relay.WAITING))
                .order_by(Delivery.id)
            ).scalars()
        )
        session.commit()
    log.info("destination.enabled", extra={"destination": key, "waiting": len(waiting)})
    if waiting:
        services.dispatcher.delivery(waiting[0], suffix=f"enabled{int(now.timestamp())}")
    return len(waiting)


# --- ping ---------------------------------------------------------------------------------------


def ping(services: Services, name: str, *, timeout: float = relay.TIMEOUT) -> Ping:
    """Send one signed ``ping`` event (a fresh id, kept nowhere) and return the answer."""
    destination = resolve(services, name)
    now = services.clock()
    event_id = f"evt_ping_{secrets.token_hex(12)}"
    payload = {"destination": destination.label, "message": "a test event from scrapesync"}
    body = destinations.event_body(event_id, PING_TYPE, now, payload)
    if destination.url is None:
        path = Path(destination.path or ".") / "events" / f"{event_id}.json"
        try:
            export.write_atomically(path, body)
        except OSError as exc:
            return Ping(destination.label, event_id, None, f"{type(exc).__name__}: {exc}")
        return Ping(destination.label, event_id, None, f"written to {path}")
    with http.client(
        timeout=timeout, user_agent=relay.USER_AGENT, given=services.delivery_transport
    ) as client:
        outcome = destinations.post(
            services,
            client,
            destination,
            event_id,
            body,
            lambda status, **kw: destinations.Outcome(
                DeliveryState.DELIVERED if status and 200 <= status < 300 else DeliveryState.DEAD,
                status=status,
                error=kw.get("error"),
            ),
        )
    answer = outcome.error or ""
    if outcome.status is not None:  # the body's start, after "HTTP 200: "
        answer = answer.removeprefix(f"HTTP {outcome.status}").removeprefix(": ")
    return Ping(destination.label, event_id, outcome.status, answer)
