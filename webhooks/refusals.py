"""Notifications refused for a wrong token: logged with the path masked, and counted.

A wrong token is someone probing the URL, or a Cloud account pointed at an old URL after the
token was rotated: either way an operator wants to see it. The count lives in Redis, which every
web process shares (so any process answers ``/metrics`` with the same figure), and in the process
while Redis is away; the token offered is never logged, stored or counted by value.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from sync import logs
from sync.bootstrap import Services

log = logs.get("intake")

COUNTER_KEY = "scrapesync:notifications:wrong_token"
MASKED_PATH = "/webhooks/webscraper/***"
_lock = threading.Lock()
_in_process = 0


def wrong_token(services: Services, *, remote_addr: str | None, method: str) -> None:
    """Log and count one notification whose token did not match."""
    global _in_process
    counted_shared = False
    if services.redis is not None:
        try:
            services.redis.incr(COUNTER_KEY)
            counted_shared = True
        except Exception:  # Redis away: the process keeps the count until it answers again
            log.debug("notification.wrong_token_not_counted", exc_info=True)
    if not counted_shared:
        with _lock:
            _in_process += 1
    log.warning(
        "notification.wrong_token",
        extra={"path": MASKED_PATH, "remote_addr": remote_addr, "method": method},
    )


def count(services: Services) -> int:
    """Notifications refused for a wrong token: every process's (Redis) and this one's own."""
    shared = 0
    if services.redis is not None:
        try:
            shared = int(services.redis.get(COUNTER_KEY) or 0)
        except Exception:  # Redis away: this process's own count still says something
            log.debug("notification.wrong_token_unreadable", exc_info=True)
    return shared + _in_process


def metrics(services: Services) -> Iterator[Metric]:
    """The refused notifications as a Prometheus counter."""
    refused = CounterMetricFamily(
        "scrapesync_notifications_refused",
        "Notifications refused before they were read, by reason",
        labels=["reason"],
    )
    refused.add_metric(["wrong_token"], float(count(services)))
    yield refused
