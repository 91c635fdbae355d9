"""The outbox's write side: announcements written in the same transaction as the change they
announce.

The contract:

- :func:`write_event` runs inside the use case's transaction. Its ``event_id`` is derived from
  run id, event type and the run's revision, and is unique in the table, so announcing one
  change twice writes one row. One delivery row per destination is written with it.
- Delivering the events is the relay's business (:mod:`sync.delivery.relay`); delivering never
  re-collects or re-imports anything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from sync.db import insert
from sync.models import Delivery, OutboxEvent
from sync.states import DeliveryState, EventType, OutboxState

EVENT_TYPES = tuple(EventType)


# --- writing events ---------------------------------------------------------------------------


def event_id_for(run_id: str, event_type: str, revision: int) -> str:
    """The stable id of the event announcing ``event_type`` for revision ``revision`` of a run."""
    digest = hashlib.sha256(f"{run_id}\x1f{event_type}\x1f{revision}".encode()).hexdigest()
    return f"evt_{digest[:32]}"


def write_event(
    session: Session,
    *,
    event_type: str,
    run_id: str,
    dataset: str,
    revision: int,
    payload: dict[str, Any],
    destinations: Sequence[str],
    now: datetime,
    event_key: str | None = None,
) -> str:
    """Write an event and its deliveries in the caller's transaction; a repeat writes nothing.
    ``event_key`` stands for the event type in the id when one revision announces several
    events of a type (the pages of ``dataset.changed``)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {event_type!r}; expected one of {EVENT_TYPES}")
    event_id = event_id_for(run_id, event_key or event_type, revision)
    session.execute(
        insert(session, OutboxEvent)
        .values(
            event_id=event_id,
            run_id=run_id,
            dataset=dataset,
            event_type=event_type,
            payload=payload,
            created_at=now,
            state=OutboxState.UNSENT if destinations else OutboxState.DELIVERED,
            attempts=0,
            next_attempt_at=now,
            delivered_at=None if destinations else now,
        )
        .on_conflict_do_nothing(index_elements=["event_id"])
    )
    for destination in destinations:
        session.execute(
            insert(session, Delivery)
            .values(
                event_id=event_id,
                destination=destination,
                state=DeliveryState.UNSENT,
                attempts=0,
                next_attempt_at=now,
            )
            .on_conflict_do_nothing(index_elements=["event_id", "destination"])
        )
    return event_id
