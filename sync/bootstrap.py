"""The composition root: builds the wired services that the web app, the worker jobs and the
CLI all use. Tests build the same object with their own parts."""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from redis import Redis

from config.datasets import Datasets, load_datasets
from config.settings import Settings
from sync import secrecy
from sync.cloud.budget import ApiBudget, MemoryApiBudget, RedisApiBudget, account_key_for
from sync.cloud.client import CloudClient
from sync.cloud.policy import RetryPolicy
from sync.db import UnitOfWork, make_engine, require_database
from sync.models import utcnow
from sync.queue import Dispatcher, RecordingDispatcher, RQDispatcher

# Every call of ours to Redis is short (no blocking pop: only the RQ worker's own connection,
# which RQ builds and times itself, waits for jobs), so a Redis that stops answering fails a
# call within seconds: a maintenance pass or a notification never hangs on it.
REDIS_SOCKET_TIMEOUT = 5.0
REDIS_CONNECT_TIMEOUT = 3.0


class KillPoints:
    """Named places where a test may have the process killed (SIGKILL) or held to prove crash
    safety.

    With a marker path the kill (or hold) happens once: the marker is created just before, so
    the restarted process runs through. A hold appends the process id to ``hold_file`` and sleeps
    ``hold_seconds`` there, so that a test can kill the whole worker from outside (as a crashed
    dyno dies), stop a database under it, or send it SIGTERM in the middle of a sync.
    """

    def __init__(
        self,
        kill_at: str | None = None,
        *,
        once_marker: str | None = None,
        hold_at: str | None = None,
        hold_file: str | None = None,
        hold_seconds: float = 600.0,
    ) -> None:
        self.kill_at = kill_at
        self.once_marker = once_marker
        self.hold_at = hold_at
        self.hold_file = hold_file
        self.hold_seconds = hold_seconds

    def reached(self, name: str) -> None:
        """Hold here if this is the hold point; die at once if it is the kill point."""
        if name not in (self.kill_at, self.hold_at):
            return
        if self.once_marker is not None:
            try:
                with open(self.once_marker, "x"):
                    pass
            except FileExistsError:
                return
        if self.hold_at == name:
            if self.hold_file is not None:
                with open(self.hold_file, "a") as marker:
                    marker.write(f"{os.getpid()}\n")
            time.sleep(self.hold_seconds)
            return
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Services:
    """Everything a use case needs, wired once per process (``dataclasses.replace`` makes a
    variant: a stopped clock, a foreground dispatcher, another datasets file)."""

    settings: Settings
    uow: UnitOfWork
    datasets: Datasets
    dispatcher: Dispatcher
    cloud: Callable[[], CloudClient]
    redis: Redis | None = None
    budget: ApiBudget | None = None
    clock: Callable[[], datetime] = utcnow
    random: Callable[[], float] = random.random
    worker_name: str = field(default_factory=lambda: f"{socket.gethostname()}.{os.getpid()}")
    killpoints: KillPoints = field(default_factory=KillPoints)
    delivery_transport: httpx.BaseTransport | None = None  # the outbox relay's HTTP transport


def connect_redis(url: str) -> Redis:
    """A Redis client for our own calls, which gives up on a Redis that does not answer."""
    return Redis.from_url(
        url, socket_timeout=REDIS_SOCKET_TIMEOUT, socket_connect_timeout=REDIS_CONNECT_TIMEOUT
    )


def worker_retry_policy() -> RetryPolicy:
    """Inline retries a worker can afford; longer waits park the task in retry_wait."""
    return RetryPolicy(max_attempts=3, max_elapsed=30.0, max_inline_wait=5.0)


def build(
    settings: Settings,
    *,
    uow: UnitOfWork | None = None,
    datasets: Datasets | None = None,
    redis: Redis | None = None,
    dispatcher: Dispatcher | None = None,
    transport: httpx.BaseTransport | None = None,
    budget: ApiBudget | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    role: str = "cli",
) -> Services:
    """Wire services from settings for a process of ``role`` (``web``, ``worker``,
    ``maintenance`` or ``cli``: it sizes the database pool); any part may be handed in."""
    if uow is None:
        require_database(settings.database_url)
        uow = UnitOfWork(make_engine(settings.database_url, role=role, **(engine_kwargs or {})))
    if redis is None and settings.redis_url:
        redis = connect_redis(settings.redis_url)
    if dispatcher is None:
        dispatcher = RQDispatcher(redis) if redis is not None else RecordingDispatcher()
    if budget is None and settings.api_token:
        key = account_key_for(settings.api_token)
        budget = (
            RedisApiBudget(
                redis,
                account_key=key,
                limit=settings.api_budget_limit,
                window=settings.api_budget_window,
            )
            if redis is not None
            else MemoryApiBudget(limit=settings.api_budget_limit, window=settings.api_budget_window)
        )

    def cloud() -> CloudClient:
        return CloudClient(
            token=settings.require_api_token(),
            base_url=settings.api_url,
            transport=transport,
            budget=budget,
            retry=worker_retry_policy(),
            max_line_bytes=settings.max_record_line_bytes,
            sleep=sleep,
        )

    if datasets is None:
        datasets = load_datasets(settings.datasets_path)
    secrecy.register_settings(settings, datasets)
    return Services(
        settings=settings,
        uow=uow,
        datasets=datasets,
        dispatcher=dispatcher,
        cloud=cloud,
        redis=redis,
        budget=budget,
        killpoints=KillPoints(
            settings.kill_at,
            once_marker=settings.kill_once_marker,
            hold_at=settings.hold_at,
            hold_file=settings.hold_file,
            hold_seconds=settings.hold_seconds,
        ),
    )


_process_services: Services | None = None


def from_env(*, role: str = "worker") -> Services:
    """The services of this process, built from the environment on first use (a work horse's
    unless the first caller names another role)."""
    global _process_services
    if _process_services is None:
        _process_services = build(Settings.from_env(), role=role)
    return _process_services


def use(services: Services | None) -> None:
    """Make ``services`` this process's services (in-process workers, the demo, tests)."""
    global _process_services
    _process_services = services
