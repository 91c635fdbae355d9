"""The outbox: announcements written in the same transaction as the change they announce, and
the relay that delivers them to each dataset's destinations.

The contract:

- :func:`write_event` runs inside the use case's transaction. Its ``event_id`` is derived from
  run id, event type and the run's revision, and is unique in the table, so announcing one
  change twice writes one row. One delivery row per destination is written with it.
- The relay claims a delivery that is due (``unsent``, ``failed`` and due, or ``sending`` whose
  lease expired because its worker died) with one conditional UPDATE that bumps ``attempts``;
  ``attempts`` then fences the outcome write, so a relay that lost its claim writes nothing.
- A delivery is an HTTP POST signed per Standard Webhooks (``webhook-id`` = event id,
  ``webhook-timestamp``, ``webhook-signature: v1,<base64 HMAC-SHA256 of id.timestamp.body>``)
  or files in a folder (the published run's export and manifest, and the event itself).
- Failure classes, decided in :func:`classify` alone: 2xx delivered; 408, 429 (honouring
  Retry-After), 5xx, timeouts and connection errors retry with capped full-jitter backoff;
  any other answer is refused for good (``dead``, with the status kept); ``dead`` too once the
  attempt budget is spent. A send whose fate is unknown (a timeout after the request left, a
  worker killed before marking it) is sent again with the same event id, so the receiver
  deduplicates on ``webhook-id``.
- Delivery states: ``unsent -> sending -> delivered``; ``sending -> failed -> sending``;
  ``-> dead``. The event's ``state`` summarises its deliveries (``dead`` wins, then ``failed``,
  ``sending``, ``unsent``; ``delivered`` when all are). Delivering never re-collects or
  re-imports anything.
- Signing secrets come from the environment variable the datasets file names (through
  Settings), as ``whsec_<base64>`` or raw text; they never reach a log line, an error or a row.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from config.datasets import Destination
from sync import export, logs, retry
from sync.bootstrap import Services
from sync.db import insert
from sync.models import Delivery, OutboxEvent

log = logs.get("outbox")

EVENT_TYPES = ("run.accepted", "run.rejected", "dataset.published", "dataset.withdrawn")
MAX_ATTEMPTS = 12
BACKOFF_BASE = 15.0
BACKOFF_CAP = 3600.0
TIMEOUT = 10.0
LEASE_MARGIN = 60.0
USER_AGENT = "scrapesync-webhooks/0.1"
SECRET_PREFIX = "whsec_"  # noqa: S105 - the Standard Webhooks prefix, not a secret


class DeliveryConfigError(Exception):
    """A destination cannot be signed for or reached as configured; the message names the
    destination and the variable, never the secret."""


@dataclass(frozen=True)
class Outcome:
    """How one delivery attempt ended: its next state, the wait before a retry, and why."""

    state: str
    wait: float | None = None
    status: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Claim:
    """A delivery this relay holds while it sends, fenced by ``attempts``."""

    delivery_id: int
    attempts: int
    destination: str
    event_id: str
    event_type: str
    run_id: str | None
    dataset: str | None
    payload: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class RelayReport:
    """What one relay pass did."""

    claimed: int
    delivered: int
    retrying: int
    dead: int


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
) -> str:
    """Write an event and its deliveries in the caller's transaction; a repeat writes nothing."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {event_type!r}; expected one of {EVENT_TYPES}")
    event_id = event_id_for(run_id, event_type, revision)
    session.execute(
        insert(session, OutboxEvent)
        .values(
            event_id=event_id,
            run_id=run_id,
            dataset=dataset,
            event_type=event_type,
            payload=payload,
            created_at=now,
            state="unsent" if destinations else "delivered",
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
                state="unsent",
                attempts=0,
                next_attempt_at=now,
            )
            .on_conflict_do_nothing(index_elements=["event_id", "destination"])
        )
    return event_id


def event_body(event_id: str, event_type: str, created_at: datetime, payload: Any) -> bytes:
    """The bytes POSTed for an event: the same for every attempt, so a re-send is identical."""
    document = {
        "id": event_id,
        "type": event_type,
        "timestamp": created_at.astimezone(UTC).isoformat(),
        "data": payload,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# --- signing ----------------------------------------------------------------------------------


def signing_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (``whsec_<base64>``, ``=`` padding optional)
    or of a raw secret (its UTF-8 bytes)."""
    if secret.startswith(SECRET_PREFIX):
        encoded = secret[len(SECRET_PREFIX) :].rstrip("=")
        try:
            return base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise DeliveryConfigError(
                "the signing secret starts with whsec_ but the rest is not base64"
            ) from None
    return secret.encode()


def sign(key: bytes, event_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,`` and the base64 HMAC-SHA256 of id.timestamp.body."""
    mac = hmac.new(key, f"{event_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signed_headers(secret: str, event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one signed POST."""
    return {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(signing_key(secret), event_id, timestamp, body),
    }


# --- failure classes --------------------------------------------------------------------------


def backoff(attempts: int, draw: float) -> float:
    """The delivery's wait after its ``attempts``-th failed attempt (draw in [0, 1)): capped
    full jitter, never under a second."""
    return max(1.0, retry.backoff(attempts, draw, base=BACKOFF_BASE, cap=BACKOFF_CAP))


def classify(
    status: int | None,
    *,
    attempts: int,
    draw: float,
    retry_after: float | None = None,
    error: str | None = None,
) -> Outcome:
    """The one place that decides what a delivery attempt's answer (or its absence) means."""
    if status is not None and 200 <= status < 300:
        return Outcome("delivered", status=status)
    retryable = status is None or status in (408, 429) or status >= 500
    if not retryable:
        return Outcome(
            "dead",
            status=status,
            error=f"{error or f'HTTP {status}'}: refused by the destination, not retried",
        )
    if attempts >= MAX_ATTEMPTS:
        return Outcome(
            "dead", status=status, error=f"{error or 'failed'}: gave up after {attempts} attempts"
        )
    wait = backoff(attempts, draw)
    if retry_after is not None:
        wait = retry_after if status == 429 else max(wait, retry_after)
    return Outcome("failed", wait=wait, status=status, error=error)


# --- the relay --------------------------------------------------------------------------------


def _due(now: datetime) -> Any:
    d = Delivery.__table__.c
    return or_(
        and_(d.state.in_(("unsent", "failed")), d.next_attempt_at <= now),
        and_(d.state == "sending", d.lease_until < now),
    )


def relay(
    services: Services,
    *,
    event_id: str | None = None,
    transport: httpx.BaseTransport | None = None,
    timeout: float = TIMEOUT,
    limit: int = 100,
) -> RelayReport:
    """Deliver every due delivery (of one event, if given) once; returns what happened."""
    transport = transport or services.extras.get("delivery_transport")
    now = services.clock()
    with services.uow.begin() as session:
        query = select(Delivery.id).where(_due(now)).order_by(Delivery.id).limit(limit)
        if event_id is not None:
            query = query.where(Delivery.event_id == event_id)
        due = list(session.execute(query).scalars())
    counts = {"delivered": 0, "failed": 0, "dead": 0}
    claimed = 0
    if not due:
        return RelayReport(0, 0, 0, 0)
    with httpx.Client(
        transport=transport,
        timeout=timeout,
        follow_redirects=False,
        headers={"user-agent": USER_AGENT},
    ) as client:
        for delivery_id in due:
            claim = _claim(services, delivery_id, lease_seconds=timeout + LEASE_MARGIN)
            if claim is None:
                continue
            claimed += 1
            outcome = _attempt(services, client, claim)
            services.killpoints.reached("after-delivery-send")
            if _settle(services, claim, outcome):
                counts[outcome.state] += 1
    return RelayReport(claimed, counts["delivered"], counts["failed"], counts["dead"])


def _claim(services: Services, delivery_id: int, *, lease_seconds: float) -> Claim | None:
    now = services.clock()
    d = Delivery.__table__.c
    with services.uow.begin() as session:
        row = session.execute(
            update(Delivery)
            .where(d.id == delivery_id, _due(now))
            .values(
                state="sending",
                attempts=d.attempts + 1,
                lease_until=now + timedelta(seconds=lease_seconds),
            )
            .returning(d.attempts, d.event_id, d.destination)
        ).one_or_none()
        if row is None:
            return None
        event = session.execute(
            select(OutboxEvent).where(OutboxEvent.event_id == row.event_id)
        ).scalar_one()
        claim = Claim(
            delivery_id=delivery_id,
            attempts=row.attempts,
            destination=row.destination,
            event_id=event.event_id,
            event_type=event.event_type,
            run_id=event.run_id,
            dataset=event.dataset,
            payload=dict(event.payload),
            created_at=event.created_at,
        )
        _summarise(session, event.event_id, now)
        session.commit()
    return claim


def _destination(services: Services, claim: Claim) -> Destination | None:
    if claim.dataset is None or claim.dataset not in services.datasets.by_name:
        return None
    for destination in services.datasets.get(claim.dataset).destinations:
        if destination.key == claim.destination:
            return destination
    return None


def _attempt(services: Services, client: httpx.Client, claim: Claim) -> Outcome:
    destination = _destination(services, claim)
    draw = services.random()
    if destination is None:
        return Outcome("dead", error="destination is no longer in the datasets file")
    if destination.url is None:
        return _write_files(services, destination, claim, draw)
    secret = services.settings.secret(destination.secret_env or "")
    if secret is None:
        return classify(
            None,
            attempts=claim.attempts,
            draw=draw,
            error=f"DeliveryConfigError: environment variable {destination.secret_env} is not set",
        )
    body = event_body(claim.event_id, claim.event_type, claim.created_at, claim.payload)
    now = services.clock()
    try:
        headers = signed_headers(secret, claim.event_id, int(now.timestamp()), body)
        response = client.post(destination.url, content=body, headers=headers)
    except DeliveryConfigError as exc:
        return classify(None, attempts=claim.attempts, draw=draw, error=f"{exc}")
    except httpx.TransportError as exc:
        sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
        kind = "uncertain" if sent else "not sent"
        detail = _scrub(str(exc), secret)
        return classify(
            None,
            attempts=claim.attempts,
            draw=draw,
            error=f"{type(exc).__name__} ({kind}){': ' + detail if detail else ''}",
        )
    snippet = _scrub(response.text[:200], secret).strip()
    return classify(
        response.status_code,
        attempts=claim.attempts,
        draw=draw,
        retry_after=retry.retry_after(response.headers.get("retry-after"), now=now.timestamp()),
        error=f"HTTP {response.status_code}{': ' + snippet if snippet else ''}",
    )


def _scrub(text: str, secret: str) -> str:
    """Defence in depth: whatever a receiver echoes, the secret never leaves this function."""
    for value in sorted({secret, secret.removeprefix(SECRET_PREFIX)}, key=len, reverse=True):
        if value:
            text = text.replace(value, "***")
    return text


def _write_files(
    services: Services, destination: Destination, claim: Claim, draw: float
) -> Outcome:
    """A file destination: the published run's export and manifest, and the event itself."""
    folder = Path(destination.path or ".")
    try:
        if claim.event_type == "dataset.published" and claim.run_id and claim.dataset:
            export.export_dataset(services, claim.dataset, run_id=claim.run_id, out=folder)
        body = event_body(claim.event_id, claim.event_type, claim.created_at, claim.payload)
        export.write_atomically(folder / "events" / f"{claim.event_id}.json", body)
    except export.ExportError as exc:
        return Outcome("dead", error=f"ExportError: {exc}")
    except OSError as exc:
        return classify(
            None, attempts=claim.attempts, draw=draw, error=f"{type(exc).__name__}: {exc}"
        )
    return Outcome("delivered")


def _settle(services: Services, claim: Claim, outcome: Outcome) -> bool:
    """Record an attempt's outcome, fenced by the claim; False when the claim was lost."""
    now = services.clock()
    d = Delivery.__table__.c
    values: dict[str, Any] = {
        "state": outcome.state,
        "lease_until": None,
        "last_status": outcome.status,
        "last_error": outcome.error,
    }
    if outcome.state == "delivered":
        values["delivered_at"] = now
    next_at = now + timedelta(seconds=outcome.wait or 0.0)
    if outcome.state == "failed":
        values["next_attempt_at"] = next_at
    with services.uow.begin() as session:
        result = session.execute(
            update(Delivery)
            .where(d.id == claim.delivery_id, d.state == "sending", d.attempts == claim.attempts)
            .values(**values)
        )
        settled = bool(result.rowcount)  # type: ignore[attr-defined]
        if settled:
            _summarise(session, claim.event_id, now)
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
    elif outcome.state == "delivered":
        log.info("delivery.delivered", extra=extra)
    else:
        log.warning(f"delivery.{outcome.state}", extra=extra)
    if settled and outcome.state == "failed":
        services.dispatcher.delivery(claim.event_id, at=next_at, suffix=f"a{claim.attempts}")
    return settled


def _summarise(session: Session, event_id: str, now: datetime) -> None:
    """Bring the event's state in line with its deliveries."""
    rows = session.execute(
        select(
            Delivery.state, Delivery.attempts, Delivery.next_attempt_at, Delivery.last_error
        ).where(Delivery.event_id == event_id)
    ).all()
    states = {r.state for r in rows}
    state = next((s for s in ("dead", "failed", "sending", "unsent") if s in states), "delivered")
    waiting = [r.next_attempt_at for r in rows if r.state in ("unsent", "failed")]
    errors = [r.last_error for r in rows if r.last_error and r.state in ("dead", "failed")]
    values: dict[str, Any] = {
        "state": state,
        "attempts": sum(r.attempts for r in rows),
        "last_error": errors[0] if errors else None,
    }
    if waiting:
        values["next_attempt_at"] = min(waiting)
    if state == "delivered":
        values["delivered_at"] = now
    session.execute(update(OutboxEvent).where(OutboxEvent.event_id == event_id).values(**values))


# --- queueing ---------------------------------------------------------------------------------


def due_deliveries(session: Session, *, now: datetime) -> int:
    """How many deliveries are due now, including ``sending`` ones whose worker died."""
    return int(session.execute(select(func.count()).where(_due(now))).scalar_one())


def redrive(services: Services) -> int:
    """Queue a relay pass when deliveries are due (one per sweep interval); returns how many."""
    now = services.clock()
    with services.uow.begin() as session:
        due = due_deliveries(session, now=now)
    if due:
        # a failure is logged; the next sweep asks again
        services.dispatcher.relay(bucket=int(now.timestamp() // services.settings.sweep_interval))
    return due
