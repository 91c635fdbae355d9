"""The pull feed: the outbox's events for a consumer that fetches them itself.

The contract:

- The events are the pushed ones: same ids, same order (the order they were written in), and
  each carries ``body``, the exact bytes a destination is POSTed, with ``headers``, the
  Standard Webhooks headers signed now (``webhook-id`` = event id), so a consumer verifies a
  pulled event as it verifies a pushed one. ``webhook-signature`` holds one ``v1,`` signature
  per signing secret of the event's dataset's destinations (of one destination, when the
  request names it); an event of a dataset without a signed destination comes unsigned.
- ``after`` is the id of the last event the consumer has; the page holds the events written
  after it, at most ``limit``, and ``next`` is the ``after`` of the next page. On PostgreSQL an
  event is served only once every transaction that began before it was written has ended, so
  an event committed late never lands behind a page the consumer already has.
- Events are kept as long as the outbox retention keeps them (delivered ones for
  ``SCRAPESYNC_OUTBOX_RETENTION_DAYS``); every page says where the kept history starts. An
  ``after`` that is not kept is a :class:`FeedError` naming that start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, cast, func, or_, select, text
from sqlalchemy.orm import Session

from sync.bootstrap import Services
from sync.delivery import destinations
from sync.models import OutboxEvent

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


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
    """The events written after ``after`` (from the start of the kept history without it)."""
    keys = _signing_keys(services, destination)
    limit = max(1, min(limit, MAX_LIMIT))
    with services.uow.begin() as session:
        history = _history(session, services)
        query = select(OutboxEvent).order_by(OutboxEvent.id).limit(limit + 1)
        if after:
            position = session.execute(
                select(OutboxEvent.id).where(OutboxEvent.event_id == after)
            ).scalar_one_or_none()
            if position is None:
                raise FeedError(
                    f"event {after} is not kept (pruned after the retention period, or never "
                    "written); the kept history starts at history.first_event_id: ask without "
                    "`after` to read it from there",
                    history,
                )
            query = query.where(OutboxEvent.id > position)
        if session.get_bind().dialect.name == "postgresql":
            query = query.where(or_(OutboxEvent.txid.is_(None), OutboxEvent.txid < _horizon()))
        if destination is not None:
            query = query.where(OutboxEvent.dataset.in_(sorted(keys)))
        rows = list(session.execute(query).scalars())
        more = len(rows) > limit
        now = int(services.clock().timestamp())
        events = [_item(row, keys.get(row.dataset or "", []), now) for row in rows[:limit]]
    return Page(events, events[-1]["id"] if events else after, more, history)


def _horizon() -> Any:
    """The oldest transaction still running: every one before it has ended (PostgreSQL)."""
    return cast(text("pg_snapshot_xmin(pg_current_snapshot())::text"), BigInteger)


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
        select(OutboxEvent.event_id, OutboxEvent.created_at).order_by(OutboxEvent.id).limit(1)
    ).one_or_none()
    total = session.execute(select(func.count()).select_from(OutboxEvent)).scalar_one()
    return {
        "first_event_id": first.event_id if first is not None else None,
        "first_created_at": first.created_at.isoformat() if first is not None else None,
        "events_kept": int(total),
        "retention_days": services.settings.outbox_retention_days or None,
    }
