"""The one backoff and the one Retry-After reading that every retrying caller shares."""

from __future__ import annotations

import email.utils

import pytest

from sync import retry

NOW = 1_700_000_000.0


def test_backoff_grows_with_the_attempt_and_never_passes_the_cap() -> None:
    """Full jitter scales the draw by base * 2**attempt until the cap holds it."""
    waits = [retry.backoff(n, 0.999, base=10.0, cap=900.0) for n in range(12)]
    assert waits == sorted(waits)
    assert waits[0] == pytest.approx(0.999 * 10.0)
    assert max(waits) == pytest.approx(0.999 * 900.0)
    assert retry.backoff(10_000, 0.5, base=10.0, cap=900.0) == 450.0
    assert retry.backoff(3, 0.0, base=10.0, cap=900.0) == 0.0


@pytest.mark.parametrize(
    ("header", "wait"),
    [("7", 7.0), (" 2.5 ", 2.5), ("-3", 0.0), ("", None), (None, None), ("soon", None)],
)
def test_retry_after_in_seconds(header: str | None, wait: float | None) -> None:
    """Delay-seconds are taken as they are, never below zero; a missing or unreadable
    header names no wait."""
    assert retry.retry_after(header, now=NOW) == wait


def test_retry_after_as_an_http_date_counts_from_now() -> None:
    """An HTTP-date is the wait from now until then; a date already past means now."""
    later = email.utils.formatdate(NOW + 30, usegmt=True)
    assert retry.retry_after(later, now=NOW) == pytest.approx(30.0)
    naive = email.utils.formatdate(NOW + 30)  # "-0000": a zone the parser leaves naive
    assert retry.retry_after(naive, now=NOW) == pytest.approx(30.0)
    earlier = email.utils.formatdate(NOW - 30, usegmt=True)
    assert retry.retry_after(earlier, now=NOW) == 0.0
