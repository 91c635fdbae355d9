"""Retries are decided by failure class in RetryPolicy: waits, attempts and elapsed budgets."""

from __future__ import annotations

import email.utils
from collections.abc import Callable

import httpx
import pytest

from sync.cloud.client import CloudClient
from sync.cloud.errors import (
    CloudAuthError,
    CloudError,
    CloudNotFoundError,
    CloudRateLimitedError,
    CloudServerError,
    CloudTransportError,
    CloudValidationError,
)
from sync.cloud.policy import RetryPolicy
from tests.cloud.conftest import FakeClock, Scripted, envelope, failure

MakeClient = Callable[..., tuple[CloudClient, Scripted]]

JOB = {"id": 9, "sitemap_id": 1, "sitemap_name": "products", "status": "finished"}
TOO_MANY = {"success": False, "error": "Too Many Attempts."}


def test_rate_limit_waits_retry_after_seconds(make_client: MakeClient, clock: FakeClock) -> None:
    """A 429 with Retry-After: 3 waits 3 s plus the 1 s margin, then succeeds."""
    client, script = make_client(failure(429, TOO_MANY, {"Retry-After": "3"}), envelope(JOB))
    assert client.get_job(9).id == 9
    assert clock.sleeps == [4.0]
    assert len(script.requests) == 2


def test_rate_limit_waits_retry_after_http_date(make_client: MakeClient, clock: FakeClock) -> None:
    """A 429 whose Retry-After is an HTTP-date waits until that moment (plus the margin)."""
    when = email.utils.formatdate(clock.now + 5, usegmt=True)
    client, _ = make_client(failure(429, TOO_MANY, {"Retry-After": when}), envelope(JOB))
    client.get_job(9)
    assert clock.sleeps == [pytest.approx(6.0)]


def test_rate_limit_falls_back_to_the_reset_timestamp(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """Without Retry-After, X-RateLimit-Reset minus now is the wait."""
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(clock.now) + 7)}
    client, _ = make_client(failure(429, TOO_MANY, headers), envelope(JOB))
    client.get_job(9)
    assert clock.sleeps == [pytest.approx(8.0)]


def test_rate_limit_without_any_hint_uses_jittered_backoff(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """A bare 429 backs off with full jitter: random * min(cap, base * 2**attempt)."""
    client, _ = make_client(
        failure(429, TOO_MANY), envelope(JOB), retry=RetryPolicy(random=lambda: 0.25)
    )
    client.get_job(9)
    assert clock.sleeps == [0.25 * 0.5 * 2]


def test_server_error_then_success(make_client: MakeClient, clock: FakeClock) -> None:
    """500 and 503 are retried with growing capped backoff, then the answer is returned."""
    client, script = make_client(failure(500), failure(503), envelope(JOB))
    assert client.get_job(9).status == "finished"
    assert clock.sleeps == [0.5 * 1.0, 0.5 * 2.0]
    assert len(script.requests) == 3


def test_server_retry_after_is_honoured_when_longer_than_backoff(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """A 503 with Retry-After waits at least that long."""
    client, _ = make_client(failure(503, headers={"Retry-After": "4"}), envelope(JOB))
    client.get_job(9)
    assert clock.sleeps == [4.0]


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("connection refused"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadTimeout("timed out"),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
)
def test_reset_or_timeout_then_success(
    make_client: MakeClient, clock: FakeClock, error: Exception
) -> None:
    """Connection errors, resets and timeouts are retried, then the answer is returned."""
    client, script = make_client(error, envelope(JOB))
    assert client.get_job(9).id == 9
    assert len(clock.sleeps) == 1
    assert len(script.requests) == 2


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, CloudAuthError),
        (403, CloudAuthError),
        (404, CloudNotFoundError),
        (422, CloudValidationError),
        (400, CloudError),
    ],
)
def test_client_errors_are_never_retried(
    make_client: MakeClient, clock: FakeClock, status: int, kind: type[CloudError]
) -> None:
    """401, 403, 404, 422 and other 4xx make exactly one request and no wait."""
    client, script = make_client(failure(status))
    with pytest.raises(kind) as caught:
        client.get_job(9)
    assert len(script.requests) == 1
    assert clock.sleeps == []
    assert caught.value.retry_after is None


def test_attempt_budget_is_spent_then_the_last_error_is_raised(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """After max_attempts the last typed error is raised with a retry_after for the caller."""
    client, script = make_client(
        failure(500),
        failure(502),
        httpx.ReadTimeout("timed out"),
        retry=RetryPolicy(max_attempts=3, random=lambda: 0.5),
    )
    with pytest.raises(CloudTransportError) as caught:
        client.get_job(9)
    assert len(script.requests) == 3
    assert len(clock.sleeps) == 2
    assert caught.value.retry_after == pytest.approx(0.5 * 0.5 * 8)


def test_elapsed_budget_stops_retries(make_client: MakeClient, clock: FakeClock) -> None:
    """When the next wait would pass max_elapsed, the error is raised instead of waiting."""
    client, script = make_client(
        failure(503, headers={"Retry-After": "8"}),
        failure(503, headers={"Retry-After": "8"}),
        retry=RetryPolicy(max_attempts=10, max_elapsed=12.0, random=lambda: 0.5),
    )
    with pytest.raises(CloudServerError) as caught:
        client.get_job(9)
    assert clock.sleeps == [8.0]
    assert len(script.requests) == 2
    assert caught.value.retry_after == 8.0


def test_long_rate_limit_wait_is_handed_to_the_caller(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """A Retry-After beyond max_inline_wait raises at once with retry_after, never sleeping."""
    client, script = make_client(
        failure(429, TOO_MANY, {"Retry-After": "20"}),
        retry=RetryPolicy(max_inline_wait=10.0, max_elapsed=600.0),
    )
    with pytest.raises(CloudRateLimitedError) as caught:
        client.get_job(9)
    assert clock.sleeps == []
    assert len(script.requests) == 1
    assert caught.value.retry_after == 21.0
    assert "retry after 21.0 s" in str(caught.value)


def test_jitter_never_exceeds_the_cap() -> None:
    """Full jitter stays within [0, cap] however many attempts and whatever the random draw."""
    policy = RetryPolicy(base=0.5, cap=30.0, random=lambda: 0.999999)
    error = CloudServerError("GET x: HTTP 500", status=500)
    waits = [policy.delay(error, attempt) for attempt in range(1, 200)]
    assert all(w is not None and 0 <= w <= 30.0 for w in waits)
    assert waits[-1] == pytest.approx(30.0, rel=1e-5)
    low = RetryPolicy(random=lambda: 0.0)
    assert low.delay(error, 3) == 0.0


def test_create_job_is_not_resent_after_a_server_error(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """A 5xx or lost answer on create may have created the job: no blind resend, no retry hint."""
    client, script = make_client(failure(500))
    with pytest.raises(CloudServerError) as server:
        client.create_job(sitemap_id=3)
    assert server.value.retry_after is None
    assert len(script.requests) == 1

    client, script = make_client(httpx.ReadTimeout("timed out"))
    with pytest.raises(CloudTransportError) as lost:
        client.create_job(sitemap_id=3)
    assert lost.value.request_sent is True
    assert len(script.requests) == 1
    assert clock.sleeps == []


def test_create_job_is_retried_when_cloud_never_saw_it(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """A refused connection or a 429 on create is safe to repeat."""
    client, script = make_client(
        httpx.ConnectError("refused"),
        failure(429, TOO_MANY, {"Retry-After": "1"}),
        envelope({"id": 77, "custom_id": None}),
    )
    assert client.create_job(sitemap_id=3) == 77
    assert len(script.requests) == 3
    assert clock.sleeps == [0.5, 2.0]
