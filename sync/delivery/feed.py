"""The pull feed: the outbox's events for a consumer that fetches them itself.

The contract:

- The events are the pushed ones: same ids, same order (the order they were written in), and
  each carries ``body``, the exact bytes a destination is POSTed, with ``headers``, the
  Standard Webhooks headers signed now (``webhook-id`` = event id), so a consumer verifies a
  pulled event as it verifies a pushed one. ``webhook-signature`` holds one ``v1,`` signature
  per signing secret of the event's dataset's destinations (of one destination, when the
  request names it); an event of a dataset without a signed destination comes unsigned.
- ``after`` is the id of the last event the consumer has; the page holds the events after it,
  at most ``limit``, and ``next`` is the ``after`` of the next page. Each event gets its place
  in the feed (``feed_position``) once it is committed: before a page is read, the events
  committed since the last page are numbered on, in the order they were written, by one
  numbering at a time (an advisory lock on PostgreSQL; SQLite has one writer). So an event
  whose transaction commits late is placed after what was already served, never behind a page
  a consumer already has; events of one transaction keep the order they were written in.
- Events are kept as long as the outbox retention keeps them (delivered ones for
  ``SCRAPESYNC_OUTBOX_RETENTION_DAYS``); every page says where the kept history starts. An
  ``after`` that is not kept is a :class:`FeedError` naming that start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from sync.bootstrap import Services
from sync.delivery import destinations
from sync.models import OutboxEvent

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
FEED_LOCK = 0x5C4A9E  # the advisory lock under which events get their place in the feed


class FeedError(Exception):
    """A page of the feed cannot be served as asked; the message says why and what to ask."""

    def __init__(self, message: str, history: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.history = history


@dataclass(frozen=True)
class Page:
    """One page of the pull feed."""

    events: list[dict[str, Any]]
    next: str | None
    more: bool
    history: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The page as the JSON answer."""
        return {
            "events": self.events,
            "next": self.next,
            "more": self.more,
            "history": self.history,
        }


def page(
    services: Services,
    *,
    after: str | None = None,
    limit: int = DEFAULT_LIMIT,
    destination: str | None = None,
) -> Page:
    """The events after ``after`` (from the start of the kept history without it)."""
    keys = _signing_keys(services, destination)
    limit = max(1, min(limit, MAX_LIMIT))
    number_committed(services)
    o = OutboxEvent
    with services.uow.begin() as session:
        history = _history(session, services)
        query = select(o).where(o.feed_position.is_not(None)).order_by(o.feed_position)
        if after:
            position = session.execute(
                select(o.feed_position).where(o.event_id == after)
            ).scalar_one_or_none()
            if position is None:
                raise FeedError(
                    f"event {after} is not kept (pruned after the retention period, or never "
                    "written); the kept history starts at history.first_event_id: ask without "
                    "`after` to read it from there",
                    history,
                )
            query = query.where(o.feed_position > position)
        if destination is not None:
            query = query.where(o.dataset.in_(sorted(keys)))
        rows = list(session.execute(query.limit(limit + 1)).scalars())
        more = len(rows) > limit
        now = int(services.clock().timestamp())
        events = [_item(row, keys.get(row.dataset or "", []), now) for row in rows[:limit]]
    return Page(events, events[-1]["id"] if events else after, more, history)


def number_committed(services: Services) -> int:
    """Give the committed events that have no place in the feed yet the next places, in the
    order they were written; one numbering at a time. Returns how many were numbered."""
    o = OutboxEvent
    with services.uow.begin() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(select(func.pg_advisory_xact_lock(FEED_LOCK)))
        last = session.execute(select(func.max(o.feed_position))).scalar_one() or 0
        unplaced = (
            select(o.id, (last + func.row_number().over(order_by=o.id)).label("place"))
            .where(o.feed_position.is_(None))
            .subquery()
        )
        result = session.execute(
            update(o).where(o.id == unplaced.c.id).values(feed_position=unplaced.c.place)
        )
        session.commit()
    return int(result.rowcount)  # type: ignore[attr-defined]


def _item(row: OutboxEvent, secrets: list[str], now: int) -> dict[str, Any]:
    """One event as the feed serves it: its fields, the pushed body, the signed headers."""
    body = destinations.event_body(row.event_id, row.event_type, row.created_at, row.payload)
    headers = {"webhook-id": row.event_id, "webhook-timestamp": str(now)}
    signatures = [destinations.signed_headers(s, row.event_id, now, body) for s in secrets]
    if signatures:
        headers["webhook-signature"] = " ".join(h["webhook-signature"] for h in signatures)
    return {
        "id": row.event_id,
        "type": row.event_type,
        "dataset": row.dataset,
        "run_id": row.run_id,
        "created_at": row.created_at.isoformat(),
        "data": row.payload,
        "body": body.decode(),
        "headers": headers,
    }


def _signing_keys(services: Services, destination: str | None) -> dict[str, list[str]]:
    """Each dataset's signing secrets (only the datasets of one destination, and its secret,
    if named), in the datasets file's order."""
    found: dict[str, list[str]] = {}
    for dataset in services.datasets:
        chosen = [
            d
            for d in dataset.destinations
            if destination is None or destination in (d.label, d.key)
        ]
        if destination is not None and not chosen:
            continue
        secrets = [services.settings.secret(d.secret_env or "") for d in chosen]
        found[dataset.name] = list(dict.fromkeys(s for s in secrets if s))
    if destination is not None and not found:
        raise FeedError(f"no destination named {destination!r} in the datasets file")
    return found


def _history(session: Session, services: Services) -> dict[str, Any]:
    """Where the kept history starts, and how long delivered events are kept."""
    first = session.execute(
        select(OutboxEvent.event_id, OutboxEvent.created_at)
        .where(OutboxEvent.feed_position.is_not(None))
        .order_by(OutboxEvent.feed_position)
        .limit(1)
    ).one_or_none()
    total = session.execute(select(func.count()).select_from(OutboxEvent)).scalar_one()
    return {
        "first_event_id": first.event_id if first is not None else None,
        "first_created_at": first.created_at.isoformat() if first is not None else None,
        "events_kept": int(total),
        "retention_days": services.settings.outbox_retention_days or None,
    }
