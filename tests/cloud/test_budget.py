"""One API budget for the account, shared by every process, reconciled with Cloud's headers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from sync.cloud.budget import ApiBudget, MemoryApiBudget, RedisApiBudget, account_key_for
from sync.cloud.client import CloudClient
from sync.cloud.errors import ApiBudgetExhaustedError
from sync.cloud.policy import RetryPolicy
from tests.cloud.conftest import REDIS_URL, TOKEN, FakeClock, Scripted, download, envelope, jsonl

MakeClient = Callable[..., tuple[CloudClient, Scripted]]
BudgetFactory = Callable[..., ApiBudget]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def new_budget(request: pytest.FixtureRequest, clock: FakeClock) -> Iterator[BudgetFactory]:
    """Build budgets of one kind; Redis ones share one account key, as processes would."""
    if request.param == "memory":
        shared: dict[str, MemoryApiBudget] = {}

        def memory(limit: int = 5, window: float = 900.0) -> ApiBudget:
            return shared.setdefault(
                "budget", MemoryApiBudget(limit=limit, window=window, clock=clock)
            )

        yield memory
        return
    conn = request.getfixturevalue("redis_client")

    def shared_redis(limit: int = 5, window: float = 900.0) -> ApiBudget:
        return RedisApiBudget(
            conn, account_key=account_key_for(TOKEN), limit=limit, window=window, clock=clock
        )

    yield shared_redis


def test_acquire_counts_down_then_says_when_the_window_frees(
    new_budget: BudgetFactory, clock: FakeClock
) -> None:
    """After limit calls the budget raises with retry_after = time left in the window."""
    budget = new_budget(limit=3, window=900.0)
    assert budget.remaining() == 3
    for left in (2, 1, 0):
        budget.acquire()
        assert budget.remaining() == left
    clock.now += 100.0
    with pytest.raises(ApiBudgetExhaustedError) as caught:
        budget.acquire()
    assert caught.value.retry_after == pytest.approx(800.0)
    assert "next call in 800.0 s" in str(caught.value)
    clock.now += 800.0
    budget.acquire()
    assert budget.remaining() == 2


def test_observe_believes_cloud_when_fewer_calls_remain(
    new_budget: BudgetFactory, clock: FakeClock
) -> None:
    """Cloud's X-RateLimit-Remaining lowers our count; a higher figure never raises it."""
    budget = new_budget(limit=200)
    budget.acquire()
    budget.observe(remaining=12, limit=200, reset_at=None)
    assert budget.remaining() == 12
    budget.observe(remaining=150, limit=200, reset_at=None)
    assert budget.remaining() == 12


def test_observe_adopts_clouds_reset_when_the_limit_is_hit(
    new_budget: BudgetFactory, clock: FakeClock
) -> None:
    """Cloud's 429 headers (0 left, reset in 30 s) make acquire wait exactly until that reset."""
    budget = new_budget(limit=200)
    budget.acquire()
    budget.observe(remaining=0, limit=200, reset_at=clock.now + 30.0)
    with pytest.raises(ApiBudgetExhaustedError) as caught:
        budget.acquire()
    assert caught.value.retry_after == pytest.approx(30.0)
    clock.now += 30.0
    budget.acquire()


@pytest.mark.redis
def test_two_redis_budgets_share_one_counter(redis_client: Any, clock: FakeClock) -> None:
    """Two processes' budgets (separate connections, same account) count the same calls."""
    other = redis.Redis.from_url(REDIS_URL)
    try:
        key = account_key_for(TOKEN)
        first = RedisApiBudget(redis_client, account_key=key, limit=4, clock=clock)
        second = RedisApiBudget(other, account_key=key, limit=4, clock=clock)
        first.acquire()
        second.acquire()
        first.acquire()
        assert second.remaining() == 1
        second.acquire()
        with pytest.raises(ApiBudgetExhaustedError):
            first.acquire()
        second.observe(remaining=0, limit=4, reset_at=clock.now + 10)
        with pytest.raises(ApiBudgetExhaustedError) as caught:
            first.acquire()
        assert caught.value.retry_after == pytest.approx(10.0)
        stranger = RedisApiBudget(other, account_key=account_key_for("other-token"), limit=4)
        assert stranger.remaining() == 4
    finally:
        other.close()


@pytest.mark.redis
def test_concurrent_acquires_never_overspend(redis_client: Any) -> None:
    """Eight threads with their own connections racing for 50 calls get exactly 50."""
    granted: list[int] = []
    lock = threading.Lock()

    def spend() -> None:
        conn = redis.Redis.from_url(REDIS_URL)
        budget = RedisApiBudget(conn, account_key="race", limit=50)
        mine = 0
        for _ in range(20):
            try:
                budget.acquire()
                mine += 1
            except ApiBudgetExhaustedError:
                pass
        with lock:
            granted.append(mine)
        conn.close()

    threads = [threading.Thread(target=spend) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(granted) == 50


@pytest.mark.redis
def test_redis_holds_a_hash_of_the_account_never_the_token(
    redis_client: Any, clock: FakeClock
) -> None:
    """The Redis key is derived from sha256(token); the token is nowhere in Redis."""
    key = account_key_for(TOKEN)
    assert len(key) == 16
    assert TOKEN not in key
    budget = RedisApiBudget(redis_client, account_key=key, clock=clock)
    budget.acquire()
    keys = [k.decode() for k in redis_client.keys("*")]
    assert keys == [budget.key]
    assert key in budget.key
    dump = repr(redis_client.hgetall(budget.key)) + repr(keys) + repr(budget)
    assert TOKEN not in dump
    assert redis_client.ttl(budget.key) > 0


def test_the_client_spends_one_call_per_request_downloads_included(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """Every request, retries and downloads included, takes one call from the budget."""
    budget = MemoryApiBudget(limit=10, clock=clock)
    job = {"id": 1, "sitemap_id": 1, "sitemap_name": "p", "status": "finished"}
    client, script = make_client(
        httpx.Response(503, json={"success": False, "error": "down"}),
        httpx.Response(200, json={"success": True, "data": job}),
        download(jsonl([{"a": 1}])),
        budget=budget,
    )
    client.get_job(1)
    list(client.iter_records(1))
    assert len(script.requests) == 3
    assert budget.remaining() == 7


def test_the_client_reconciles_the_budget_from_response_headers(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """X-RateLimit-Remaining on a response lowers the shared budget."""
    budget = MemoryApiBudget(limit=200, clock=clock)
    client, _ = make_client(envelope({"email": "x"}), budget=budget)
    client.get_account()
    assert budget.remaining() == 150


def test_a_spent_budget_stops_the_call_before_it_reaches_cloud(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """A budget spent beyond max_inline_wait sends nothing and hands back the wait."""
    budget = MemoryApiBudget(limit=1, window=900.0, clock=clock)
    client, script = make_client(envelope({"email": "x"}), budget=budget)
    client.get_account()
    with pytest.raises(ApiBudgetExhaustedError) as caught:
        client.get_account()
    assert len(script.requests) == 1
    assert clock.sleeps == []
    assert caught.value.retry_after == pytest.approx(900.0)


def test_a_short_budget_wait_is_slept_inline(make_client: MakeClient, clock: FakeClock) -> None:
    """When the window frees within max_inline_wait the client waits, then calls."""
    budget = MemoryApiBudget(limit=1, window=5.0, clock=clock)
    client, script = make_client(
        envelope({"email": "x"}),
        envelope({"email": "y"}),
        budget=budget,
        retry=RetryPolicy(max_inline_wait=10.0),
    )
    client.get_account()
    assert client.get_account() == {"email": "y"}
    assert clock.sleeps == [5.0]
    assert len(script.requests) == 2
