"""The rate limit: a fixed window of calls per token, with Cloud's headers and 429."""

from __future__ import annotations

import email.utils

import httpx

from simulator import CloudState
from tests.fakes import START, FakeClock


def test_every_api_response_carries_limit_and_remaining(
    client: httpx.Client, state: CloudState
) -> None:
    """X-RateLimit-Limit and X-RateLimit-Remaining count down with each call."""
    remaining = [client.get("account").headers["x-ratelimit-remaining"] for _ in range(3)]
    assert remaining == ["199", "198", "197"]
    response = client.get("scraping-job/404404")
    assert response.headers["x-ratelimit-limit"] == "200"
    assert response.headers["x-ratelimit-remaining"] == "196"
    assert "x-ratelimit-reset" not in response.headers
    assert state.calls == 4


def test_the_call_past_the_limit_gets_429_with_retry_after_seconds(
    client: httpx.Client, state: CloudState, clock: FakeClock
) -> None:
    """Once the window is spent Cloud answers 429 with Retry-After and X-RateLimit-Reset."""
    state.rate_limit = 3
    for _ in range(3):
        assert client.get("account").status_code == 200
    clock.advance(100)
    refused = client.get("account")
    assert refused.status_code == 429
    assert refused.json() == {"success": False, "error": "Too Many Attempts."}
    assert refused.headers["retry-after"] == "800"
    assert refused.headers["x-ratelimit-reset"] == str(int(START + 900))
    assert refused.headers["x-ratelimit-remaining"] == "0"
    assert state.calls == 3


def test_retry_after_can_be_an_http_date(
    client: httpx.Client, state: CloudState, clock: FakeClock
) -> None:
    """With retry_after_format "http-date" Retry-After names the moment the window reopens."""
    state.rate_limit, state.retry_after_format = 1, "http-date"
    client.get("account")
    refused = client.get("account")
    assert refused.status_code == 429
    when = email.utils.parsedate_to_datetime(refused.headers["retry-after"])
    assert when.timestamp() == START + 900


def test_a_new_window_opens_when_the_old_one_ends(
    client: httpx.Client, state: CloudState, clock: FakeClock
) -> None:
    """After rate_window seconds the token has its full allowance again."""
    state.rate_limit, state.rate_window = 2, 60.0
    client.get("account")
    client.get("account")
    assert client.get("account").status_code == 429
    clock.advance(60)
    response = client.get("account")
    assert response.status_code == 200
    assert response.headers["x-ratelimit-remaining"] == "1"


def test_refused_tokens_do_not_spend_the_allowance(client: httpx.Client, state: CloudState) -> None:
    """401s are not counted against the account's window."""
    state.rate_limit = 1
    for _ in range(5):
        assert client.get("account", params={"api_token": "stolen"}).status_code == 401
    assert client.get("account").status_code == 200
