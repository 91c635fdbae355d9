"""A worker told to stop leaves in its grace, whatever its pubsub thread is doing."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from sync.worker import SyncWorker
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


def test_unsubscribing_never_waits_out_the_pubsub_threads_minute() -> None:
    """Once the worker's channel is unsubscribed, RQ's pubsub thread waits up to a minute for a
    new subscription, and the Redis client's ``stop()`` joins it without a limit: the worker's
    teardown must return at once all the same (it hung for up to 60 s, past a dyno's grace)."""
    worker = SyncWorker(["scrapesync"], connection=redis.Redis.from_url(REDIS_URL))
    worker.subscribe()
    pubsub = worker.pubsub
    assert pubsub is not None
    deadline = time.monotonic() + 10
    while not pubsub.subscribed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pubsub.subscribed
    pubsub.unsubscribe()  # the thread reads the confirmation and then waits for a subscription
    while pubsub.subscribed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pubsub.subscribed
    time.sleep(0.2)  # let the thread go round to its wait

    stopping = threading.Thread(target=worker.unsubscribe, daemon=True)
    stopping.start()
    stopping.join(timeout=15)
    assert not stopping.is_alive(), "unsubscribe waited for the pubsub thread's minute"
