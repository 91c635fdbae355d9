"""Destinations: where a delivery goes and how one attempt at it ends.

- A delivery is an HTTP POST signed per Standard Webhooks (``webhook-id`` = event id,
  ``webhook-timestamp``, ``webhook-signature: v1,<base64 HMAC-SHA256 of id.timestamp.body>``)
  or files in a folder (the published run's export and manifest, and the event itself).
- Failure classes, decided in :func:`classify` alone: 2xx delivered; 408, 429 (honouring
  Retry-After), 5xx, timeouts and connection errors retry on the schedule below; 410 Gone is
  ``dead`` and disables the destination until an operator enables it again; any other answer is
  refused for good (``dead``, with the status kept). A send whose fate is unknown (a timeout
  after the request left, a worker killed before marking it) is sent again with the same event
  id, so the receiver deduplicates on ``webhook-id``.
- The retry schedule: after its n-th failed attempt a delivery waits
  ``min(max_wait, 15 s * 2**(n-1))`` with equal jitter (a random point of the upper half of
  that wait): 15 s, 30 s, 1, 2, 4, 8, 16 and 32 min, then every 30 to 60 min (``max_wait``
  defaults to 60 min). Retries go on while the destination's failing streak (from its first
  failed attempt since it last answered) is younger than ``retry_days`` (default 3); the last
  attempt is made at that mark exactly, and if it fails the delivery is ``dead``, keeping its
  last answer. Both are set per destination in the datasets file.
- Signing secrets come from the environment variable the datasets file names (through
  Settings), as ``whsec_<base64>`` or raw text; they never reach a log line, an error or a row.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from config.datasets import Destination
from sync import retry
from sync.bootstrap import Services
from sync.datasets import export
from sync.states import DeliveryState, EventType

BACKOFF_BASE = 15.0
BACKOFF_CAP = 3600.0  # the default max_wait
GONE = 410
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
    # whether this ends the destination's failing streak: it answered (a refusal too), or the
    # attempt failed for a reason of ours, not of the destination
    answered: bool = False
    # 410 Gone: the destination is disabled until an operator enables it again
    disables: bool = False


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
    # since when the destination keeps failing (None: it answered its last attempt)
    failing_since: datetime | None = None


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


def backoff(attempts: int, draw: float, *, cap: float = BACKOFF_CAP) -> float:
    """The wait after a delivery's ``attempts``-th failed attempt (draw in [0, 1)): the nominal
    ``min(cap, 15 s * 2**(attempts-1))`` with equal jitter, never under a second."""
    nominal = min(cap, BACKOFF_BASE * 2.0 ** min(max(attempts, 1) - 1, 40))
    return max(1.0, nominal / 2 + draw * nominal / 2)


@dataclass(frozen=True)
class Patience:
    """How long and how patiently a failing delivery is retried (one destination's settings)."""

    retry_days: float = 3.0
    max_wait: float = BACKOFF_CAP

    @classmethod
    def of(cls, destination: Destination) -> Patience:
        """A destination's retry settings from the datasets file."""
        return cls(destination.retry_days, destination.max_wait_minutes * 60.0)


def classify(
    status: int | None,
    *,
    attempts: int,
    draw: float,
    retry_after: float | None = None,
    error: str | None = None,
    now: datetime | None = None,
    failing_since: datetime | None = None,
    patience: Patience = Patience(),
) -> Outcome:
    """The one place that decides what a delivery attempt's answer (or its absence) means."""
    if status is not None and 200 <= status < 300:
        return Outcome(DeliveryState.DELIVERED, status=status, answered=True)
    if status == GONE:
        return Outcome(
            DeliveryState.DEAD,
            status=status,
            error=f"{error or 'HTTP 410'}: the destination is gone; disabled until enabled again",
            answered=True,
            disables=True,
        )
    retryable = status is None or status in (408, 429) or status >= 500
    if not retryable:
        return Outcome(
            DeliveryState.DEAD,
            status=status,
            error=f"{error or f'HTTP {status}'}: refused by the destination, not retried",
            answered=True,
        )
    wait = backoff(attempts, draw, cap=patience.max_wait)
    if retry_after is not None:
        wait = retry_after if status == 429 else max(wait, retry_after)
    if now is not None:
        give_up_at = (failing_since or now) + timedelta(days=patience.retry_days)
        left = (give_up_at - now).total_seconds()
        if left <= 0:
            return Outcome(
                DeliveryState.DEAD,
                status=status,
                error=f"{error or 'failed'}: gave up after {attempts} attempts, the destination "
                f"failing for {patience.retry_days:g} days",
            )
        wait = min(wait, left)  # the last attempt is made at the mark exactly
    return Outcome(DeliveryState.FAILED, wait=wait, status=status, error=error)


# --- sending ----------------------------------------------------------------------------------


def _destination(services: Services, claim: Claim) -> Destination | None:
    """The destination a claimed delivery goes to, if the datasets file still names it."""
    if claim.dataset is None or claim.dataset not in services.datasets.by_name:
        return None
    for destination in services.datasets.get(claim.dataset).destinations:
        if destination.key == claim.destination:
            return destination
    return None


def send(services: Services, client: httpx.Client, claim: Claim) -> Outcome:
    """Make one delivery attempt of a claimed delivery: a signed POST or files in a folder."""
    destination = _destination(services, claim)
    if destination is None:
        return Outcome(
            DeliveryState.DEAD,
            error="destination is no longer in the datasets file",
            answered=True,
        )
    now = services.clock()
    judge = partial(
        classify,
        attempts=claim.attempts,
        draw=services.random(),
        now=now,
        failing_since=claim.failing_since,
        patience=Patience.of(destination),
    )
    if destination.url is None:
        return _write_files(services, destination, claim, judge)
    body = event_body(claim.event_id, claim.event_type, claim.created_at, claim.payload)
    return post(services, client, destination, claim.event_id, body, judge)


def post(
    services: Services,
    client: httpx.Client,
    destination: Destination,
    event_id: str,
    body: bytes,
    judge: Callable[..., Outcome],
) -> Outcome:
    """POST one signed event body to an HTTP destination; ``judge`` (:func:`classify` with the
    attempt's facts) says what the answer means."""
    secret = services.settings.secret(destination.secret_env or "")
    if secret is None:
        return judge(
            None,
            error=f"DeliveryConfigError: environment variable {destination.secret_env} is not set",
        )
    now = services.clock()
    try:
        headers = signed_headers(secret, event_id, int(now.timestamp()), body)
        response = client.post(destination.url or "", content=body, headers=headers)
    except DeliveryConfigError as exc:
        return judge(None, error=f"{exc}")
    except httpx.TransportError as exc:
        sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
        kind = "uncertain" if sent else "not sent"
        detail = _scrub(str(exc), secret)
        return judge(None, error=f"{type(exc).__name__} ({kind}){': ' + detail if detail else ''}")
    snippet = _scrub(response.text[:200], secret).strip()
    return judge(
        response.status_code,
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
    services: Services, destination: Destination, claim: Claim, judge: Callable[..., Outcome]
) -> Outcome:
    """A file destination: the published run's export and manifest, and the event itself."""
    folder = Path(destination.path or ".")
    try:
        if claim.event_type == EventType.DATASET_PUBLISHED and claim.run_id and claim.dataset:
            export.export_dataset(services, claim.dataset, run_id=claim.run_id, out=folder)
        body = event_body(claim.event_id, claim.event_type, claim.created_at, claim.payload)
        export.write_atomically(folder / "events" / f"{claim.event_id}.json", body)
    except export.ExportError as exc:
        return Outcome(DeliveryState.DEAD, error=f"ExportError: {exc}", answered=True)
    except OSError as exc:
        return judge(None, error=f"{type(exc).__name__}: {exc}")
    return Outcome(DeliveryState.DELIVERED, answered=True)
