"""How often and how long a failed Cloud call is retried, decided by failure class.

`RetryPolicy` alone decides. A retryable failure is retried inline while attempts, the elapsed
budget and `max_inline_wait` allow; otherwise the last typed error is raised with `retry_after`
set to the wait it needed, so a sync task can park in retry_wait instead of blocking its worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from random import random as _unit_random

from sync import retry
from sync.cloud.errors import (
    ApiBudgetExhaustedError,
    CloudError,
    CloudRateLimitedError,
    CloudServerError,
    CloudTransportError,
    DownloadIncompleteError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often a Cloud call is retried inline, decided by failure class."""

    max_attempts: int = 4
    max_elapsed: float = 60.0
    base: float = 0.5
    cap: float = 30.0
    max_inline_wait: float = 10.0
    rate_limit_margin: float = 1.0
    random: Callable[[], float] = field(default=_unit_random, repr=False, compare=False)

    def delay(self, error: CloudError, attempt: int, *, idempotent: bool = True) -> float | None:
        """Seconds to wait before retrying after error on 1-based attempt; None: never retry."""
        if isinstance(error, ApiBudgetExhaustedError):
            return error.retry_after if error.retry_after is not None else self.backoff(attempt)
        if isinstance(error, CloudRateLimitedError):
            # Cloud rejects a throttled call before acting on it, so even a create may repeat.
            if error.retry_after is not None:
                return error.retry_after + self.rate_limit_margin
            return self.backoff(attempt)
        if isinstance(error, CloudServerError):
            if not idempotent:
                return None
            wait = self.backoff(attempt)
            return wait if error.retry_after is None else max(wait, error.retry_after)
        if isinstance(error, CloudTransportError):
            if not idempotent and error.request_sent:
                return None
            return self.backoff(attempt)
        if isinstance(error, DownloadIncompleteError):
            return self.backoff(attempt)
        return None

    def backoff(self, attempt: int) -> float:
        """Capped full-jitter backoff: uniform(0, min(cap, base * 2**attempt))."""
        return retry.backoff(attempt, self.random(), base=self.base, cap=self.cap)

    def retry_inline(self, wait: float, *, attempt: int, elapsed: float) -> bool:
        """Whether to sleep wait seconds and try again now, rather than hand the wait back."""
        return (
            attempt < self.max_attempts
            and wait <= self.max_inline_wait
            and elapsed + wait <= self.max_elapsed
        )
