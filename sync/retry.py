"""How long scrapesync waits before trying again, for every caller that retries.

- :func:`backoff` is the one backoff: capped full jitter. Each caller passes its own base and
  cap (the Cloud client, the sync task's failure classes, the outbox relay, reconcile).
- :func:`retry_after` is the one reading of a ``Retry-After`` header: delay-seconds or an
  HTTP-date, as seconds from now.
"""

from __future__ import annotations

import email.utils
from datetime import UTC


def backoff(attempt: int, draw: float, *, base: float, cap: float) -> float:
    """Capped full jitter, ``draw * min(cap, base * 2**attempt)`` for a draw in [0, 1] (a draw
    of 1 is the capped exponential without jitter): it grows with ``attempt`` and never passes
    ``cap``."""
    return draw * min(cap, base * 2.0 ** min(attempt, 64))


def retry_after(value: str | None, *, now: float) -> float | None:
    """A Retry-After header (seconds or an HTTP-date) as seconds from ``now`` (unix seconds),
    never negative; None when it is missing or neither."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # "-0000" parses naive; HTTP-dates are GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)
