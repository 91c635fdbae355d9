"""The relay: delivers the outbox's events to each dataset's destinations.

The contract:

- The relay claims a delivery that is due (``unsent``, ``failed`` and due, or ``sending`` whose
  lease expired because its worker died) with one conditional UPDATE that bumps ``attempts``;
  ``attempts`` then fences the outcome write, so a relay that lost its claim writes nothing.
- What one attempt sends (a signed POST or files in a folder) and what its answer means are
  :mod:`sync.delivery.destinations`' business; the relay records the outcome it returns.
- Deliveries queue up per destination: only the oldest waiting one (``unsent``, ``failed`` or
  ``sending``) of a destination is claimed, so a receiver gets its events in order, and while a
  destination keeps failing only that one spends attempts; the rest wait behind it and follow
  as soon as it is settled. A destination disabled by a 410 Gone gets nothing until an
  operator enables it (``scrapesync deliveries enable``).
- Each destination's failing streak (``destination_states.failing_since``) starts at its first
  failed attempt since it last answered; the retry schedule counts from it.
- Delivery states: ``unsent -> sending -> delivered``; ``sending -> failed -> sending``;
  ``-> dead``. The event's ``state`` summarises its deliveries (``dead`` wins, then ``failed``,
  ``sending``, ``unsent``; ``delivered`` when all are). Delivering never re-collects or
  re-imports anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.orm import Session

from sync import http, logs
from sync.bootstrap import Services
from sync.db import insert
from sync.delivery import destinations
from sync.models import Delivery, DestinationState, OutboxEvent
from sync.states import DeliveryState, OutboxState

log = logs.get("outbox")

TIMEOUT = 10.0
LEASE_MARGIN = 60.0
USER_AGENT = "scrapesync-webhooks/0.1"


@dataclass(frozen=True)
class RelayReport:
    """What one relay pass did."""

    claimed: int
    delivered: int
    retrying: int
    dead: int


# --- the relay --------------------------------------------------------------------------------

WAITING = (DeliveryState.UNSENT, DeliveryState.FAILED, DeliveryState.SENDING)


def _ready(now: datetime) -> Any:
    """A delivery whose time has come (or whose sending worker died)."""
    d = Delivery.__table__.c
    return or_(
        and_(d.state.in_((DeliveryState.UNSENT, DeliveryState.FAILED)), d.next_attempt_at <= now),
        and_(d.state == DeliveryState.SENDING, d.lease_until < now),
    )


def _enabled() -> Any:
    """A delivery whose destination is not disabled."""
    disabled = select(DestinationState.destination).where(DestinationState.disabled_at.is_not(None))
    return Delivery.__table__.c.destination.not_in(disabled)


def _behind(states: tuple[str, ...]) -> Any:
    """A delivery with an older one of its destination in one of ``states``."""
    d = Delivery.__table__
    earlier = d.alias("earlier")
    return exists(
        select(earlier.c.id).where(
            earlier.c.destination == d.c.destination,
            earlier.c.state.in_(states),
            earlier.c.id < d.c.id,
        )
    )


def _due(now: datetime) -> Any:
    """A delivery the relay may claim now: ready, its destination enabled, and the oldest one
    waiting at its destination."""
    return and_(_ready(now), _enabled(), ~_behind(WAITING))


def relay(
    services: Services,
    *,
    event_id: str | None = None,
    transport: httpx.BaseTransport | None = None,
    timeout: float = TIMEOUT,
    limit: int = 100,
    follow: bool | None = None,
) -> RelayReport:
    """Deliver every due delivery (of one event, if given) once; returns what happened. With
    ``follow`` (the default without an event) a destination whose delivery was settled goes
    on with the deliveries that waited behind it, up to ``limit`` in all."""
    transport = transport or services.delivery_transport
    follow = event_id is None if follow is None else follow
    counts = {"delivered": 0, "failed": 0, "dead": 0}
    claimed = 0
    only: set[str] | None = None
    with http.client(timeout=timeout, user_agent=USER_AGENT, given=transport) as client:
        while claimed < limit:
            due = _due_ids(services, event_id=event_id, only=only, limit=limit - claimed)
            moved: set[str] = set()
            for delivery_id in due:
                claim = _claim(services, delivery_id, lease_seconds=timeout + LEASE_MARGIN)
                if claim is None:
                    continue
                claimed += 1
                outcome = destinations.send(services, client, claim)
                services.killpoints.reached("after-delivery-send")
                if _settle(services, claim, outcome):
                    counts[outcome.state] += 1
                    if outcome.state != DeliveryState.FAILED:
                        moved.add(claim.destination)
            if not (follow and moved):
                break
            event_id, only = None, moved
    return RelayReport(claimed, counts["delivered"], counts["failed"], counts["dead"])


def _due_ids(
    services: Services, *, event_id: str | None, only: set[str] | None, limit: int
) -> list[int]:
    """The deliveries due now (of one event, or of some destinations), oldest first."""
    with services.uow.begin() as session:
        query = select(Delivery.id).where(_due(services.clock())).order_by(Delivery.id).limit(limit)
        if event_id is not None:
            query = query.where(Delivery.event_id == event_id)
        if only is not None:
            query = query.where(Delivery.destination.in_(sorted(only)))
        return list(session.execute(query).scalars())


def _claim(
    services: Services, delivery_id: int, *, lease_seconds: float
) -> destinations.Claim | None:
    now = services.clock()
    d = Delivery.__table__.c
    with services.uow.begin() as session:
        row = session.execute(
            update(Delivery)
            .where(d.id == delivery_id, _due(now))
            .values(
                state=DeliveryState.SENDING,
                attempts=d.attempts + 1,
                lease_until=now + timedelta(seconds=lease_seconds),
                last_attempt_at=now,
            )
            .returning(d.attempts, d.event_id, d.destination)
        ).one_or_none()
        if row is None:
            return None
        event = session.execute(
            select(OutboxEvent).where(OutboxEvent.event_id == row.event_id)
        ).scalar_one()
        claim = destinations.Claim(
            delivery_id=delivery_id,
            attempts=row.attempts,
            destination=row.destination,
            event_id=event.event_id,
            event_type=event.event_type,
            run_id=event.run_id,
            dataset=event.dataset,
            payload=dict(event.payload),
            created_at=event.created_at,
            failing_since=session.execute(
                select(DestinationState.failing_since).where(
                    DestinationState.destination == row.destination
                )
            ).scalar_one_or_none(),
        )
        summarise(session, event.event_id, now)
        session.commit()
    return claim


def _settle(services: Services, claim: destinations.Claim, outcome: destinations.Outcome) -> bool:
    """Record an attempt's outcome, fenced by the claim; False when the claim was lost."""
    now = services.clock()
    d = Delivery.__table__.c
    values: dict[str, Any] = {
        "state": outcome.state,
        "lease_until": None,
        "last_status": outcome.status,
        "last_error": outcome.error,
    }
    if outcome.state == DeliveryState.DELIVERED:
        values["delivered_at"] = now
    next_at = now + timedelta(seconds=outcome.wait or 0.0)
    if outcome.state == DeliveryState.FAILED:
        values["next_attempt_at"] = next_at
    with services.uow.begin() as session:
        result = session.execute(
            update(Delivery)
            .where(
                d.id == claim.delivery_id,
                d.state == DeliveryState.SENDING,
                d.attempts == claim.attempts,
            )
            .values(**values)
        )
        settled = bool(result.rowcount)  # type: ignore[attr-defined]
        if settled:
            summarise(session, claim.event_id, now)
            _note_destination(session, claim.destination, outcome, now)
        session.commit()
    extra = {
        "event_id": claim.event_id,
        "destination": claim.destination,
        "attempt": claim.attempts,
        "state": outcome.state,
        "status": outcome.status,
        "error": outcome.error,
    }
    if not settled:
        log.warning("delivery.claim_lost", extra=extra)
    elif outcome.state == DeliveryState.DELIVERED:
        log.info("delivery.delivered", extra=extra)
    else:
        log.warning(f"delivery.{outcome.state}", extra=extra)
    if settled and outcome.disables:
        log.warning("destination.disabled", extra=extra)
    if settled and outcome.state == DeliveryState.FAILED:
        services.dispatcher.delivery(claim.event_id, at=next_at, suffix=f"a{claim.attempts}")
    return settled


def _note_destination(
    session: Session, destination: str, outcome: destinations.Outcome, now: datetime
) -> None:
    """Keep the destination's failing streak (and a 410's disabling) in line with an outcome."""
    session.execute(
        insert(session, DestinationState)
        .values(destination=destination, updated_at=now)
        .on_conflict_do_nothing(index_elements=["destination"])
    )
    s = DestinationState.__table__.c
    values: dict[str, Any] = {"updated_at": now}
    if outcome.answered:
        values["failing_since"] = None
    else:
        values["failing_since"] = func.coalesce(s.failing_since, now)
    if outcome.disables:
        values["disabled_at"] = now
        values["disabled_reason"] = outcome.error
    session.execute(update(DestinationState).where(s.destination == destination).values(**values))


def summarise(session: Session, event_id: str, now: datetime) -> None:
    """Bring the event's state in line with its deliveries."""
    rows = session.execute(
        select(
            Delivery.state, Delivery.attempts, Delivery.next_attempt_at, Delivery.last_error
        ).where(Delivery.event_id == event_id)
    ).all()
    states = {r.state for r in rows}
    state = next(
        (
            s
            for s in (OutboxState.DEAD, OutboxState.FAILED, OutboxState.SENDING, OutboxState.UNSENT)
            if s in states
        ),
        OutboxState.DELIVERED,
    )
    waiting = [
        r.next_attempt_at for r in rows if r.state in (DeliveryState.UNSENT, DeliveryState.FAILED)
    ]
    errors = [
        r.last_error
        for r in rows
        if r.last_error and r.state in (DeliveryState.DEAD, DeliveryState.FAILED)
    ]
    values: dict[str, Any] = {
        "state": state,
        "attempts": sum(r.attempts for r in rows),
        "last_error": errors[0] if errors else None,
    }
    if waiting:
        values["next_attempt_at"] = min(waiting)
    if state == OutboxState.DELIVERED:
        values["delivered_at"] = now
    session.execute(update(OutboxEvent).where(OutboxEvent.event_id == event_id).values(**values))


# --- queueing ---------------------------------------------------------------------------------


def due_deliveries(session: Session, *, now: datetime) -> int:
    """How many deliveries are due now, including ``sending`` ones whose worker died and those
    queued behind an older one that is not waiting out a failure."""
    waiting = and_(_ready(now), _enabled(), ~_behind((DeliveryState.FAILED,)))
    return int(session.execute(select(func.count()).where(waiting)).scalar_one())


def redrive(services: Services) -> int:
    """Queue a relay pass when deliveries are due (one per sweep interval); returns how many."""
    now = services.clock()
    with services.uow.begin() as session:
        due = due_deliveries(session, now=now)
    if due:
        # a failure is logged; the next sweep asks again
        services.dispatcher.relay(bucket=int(now.timestamp() // services.settings.sweep_interval))
    return due
