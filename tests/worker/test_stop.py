"""A worker told to stop leaves in its grace, whatever its pubsub thread is doing."""

from __future__ import annotations

import threading
import time
from typing import Any

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


def _subscribed() -> tuple[SyncWorker, Any, threading.Thread]:
    """A worker subscribed to its channel: it, its pubsub and the pubsub's thread."""
    worker = SyncWorker(["scrapesync"], connection=redis.Redis.from_url(REDIS_URL))
    worker.subscribe()
    pubsub, thread = worker.pubsub, worker.pubsub_thread
    assert pubsub is not None
    assert thread is not None
    deadline = time.monotonic() + 10
    while not pubsub.subscribed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pubsub.subscribed
    return worker, pubsub, thread


def test_a_subscribed_worker_leaves_its_channel_with_its_pubsub_thread_ended() -> None:
    """The usual stop: the worker is still subscribed. Its pubsub thread is told to stop before
    the channel is left, so reading the confirmation ends it. (Told after, a thread that read
    the confirmation first went on to wait for a subscription, and every stop took the whole
    second's join: a busy machine did so often.) The unsubscribe here returns only once the
    thread has read the confirmation, the order a busy machine makes likely."""
    worker, pubsub, thread = _subscribed()
    deadline = time.monotonic() + 10
    leave = pubsub.unsubscribe

    def unsubscribe_and_wait_for_the_thread() -> object:
        sent = leave()
        while pubsub.subscribed and time.monotonic() < deadline:
            time.sleep(0.01)
        return sent

    pubsub.unsubscribe = unsubscribe_and_wait_for_the_thread  # type: ignore[method-assign]
    worker.unsubscribe()
    assert not pubsub.subscribed
    assert not thread.is_alive()


def test_a_worker_whose_pubsub_thread_closed_its_connection_first_still_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Told to stop, the pubsub thread may end and close its connection (which leaves the
    channel) while the worker sends its unsubscribe, which then fails on the closed socket (a
    busy machine makes it happen): the stop goes on, the thread ends and nothing is raised.
    (The thread ends only once a reply wakes it from its minute's wait: the subscription's
    confirmation, in the stop that raced; a ping's reply here.)"""
    worker, pubsub, thread = _subscribed()

    def closed_first() -> None:
        pubsub.ping()  # its reply wakes the thread, which ends and closes its connection first
        thread.join(timeout=10)
        assert not thread.is_alive()
        raise redis.exceptions.ConnectionError(
            "Error 9 while writing to socket. Bad file descriptor."
        )

    monkeypatch.setattr(pubsub, "unsubscribe", closed_first)
    worker.unsubscribe()
    assert not thread.is_alive()
    assert not pubsub.subscribed
