"""The worker process: RQ's HerokuWorker that also runs the maintenance pass on its own timer.

The maintenance thread lives in the worker's main process only; each work horse is forked
without it and builds its own services (and database pool) on first use. When Redis goes away
RQ's work loop gives up; this worker waits for Redis to answer again and goes back to work, so
a Redis restart or flush never needs a process restart.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from typing import Any

import redis.exceptions
from rq.exceptions import StopRequested
from rq.worker import HerokuWorker

from config.settings import ConfigError, Settings
from sync import bootstrap, logs, warm
from sync.db import require_database
from sync.operations import maintenance

log = logs.get("worker")

REDIS_WAIT_CAP = 5.0


class BoundedUnsubscribe:
    """RQ's ``unsubscribe``, with the wait for its pubsub thread bounded. The thread waits up to
    a minute for a subscription once the channel is unsubscribed, and the client's ``stop()``
    waits for the thread without a limit: a worker told to stop in that minute outlived its
    grace. So the thread is told to stop before the channel is left: reading the confirmation
    then ends its loop (told after, a thread that read it first went on to wait, and the stop
    took the whole second's join). The thread is a daemon and the connection is closed here,
    as RQ does."""

    pubsub: Any
    pubsub_thread: Any
    pubsub_channel_name: str
    name: str
    log: Any

    def unsubscribe(self) -> None:
        """Stop the pubsub thread and unsubscribe from the worker's channel, waiting at most a
        second for the thread."""
        if self.pubsub_thread:
            self.log.info(
                "Worker %s: unsubscribing from channel %s", self.name, self.pubsub_channel_name
            )
            self.pubsub_thread.stop(timeout=0)
            # the thread, told to stop, may end first and close its connection (which leaves
            # the channel), or Redis may be gone: either way there is no channel left to leave
            with contextlib.suppress(
                redis.exceptions.ConnectionError, redis.exceptions.TimeoutError
            ):
                self.pubsub.unsubscribe()
            self.pubsub_thread.join(timeout=1)
            self.pubsub.close()


def check_required(settings: Settings) -> None:
    """Exit at start-up with one line naming the variable that is missing: a worker without
    its Cloud token would only fail every task it takes."""
    try:
        settings.require_api_token()
        settings.require_redis_url()
        require_database(settings.database_url)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


class SyncWorker(BoundedUnsubscribe, HerokuWorker):
    """HerokuWorker (on SIGTERM the horse gets ``shutdown_grace`` seconds to finish, then
    ShutDownImminentException) with a maintenance thread, riding out Redis outages."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            self.settings = Settings.from_env()
        except ConfigError as exc:  # a malformed variable: one line, no traceback
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        self.imminent_shutdown_delay = max(1, round(self.settings.shutdown_grace))
        # RQ waits up to a minute between reconnects; come back within a sweep instead.
        self.max_connection_wait_time = min(REDIS_WAIT_CAP, self.settings.sweep_interval)

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """Start the maintenance thread (or, in burst mode, run one pass first), then work as
        RQ does, starting again whenever RQ's loop ends because Redis went away."""
        check_required(self.settings)
        logs.configure()
        services = bootstrap.build(self.settings, role="maintenance")
        burst = bool(kwargs.get("burst", args[0] if args else False))
        warm.warm()  # once, in the process every work horse is forked from
        loop = maintenance.MaintenanceLoop(services, owner=self.name)
        if burst:
            loop.tick()
        else:
            loop.start()
        bounded = kwargs.get("max_jobs") is not None or kwargs.get("max_idle_time") is not None
        try:
            while True:
                worked = self._work_once(*args, **kwargs)
                if burst or bounded or self._shutdown_requested_date is not None:
                    return worked
                log.warning("worker.loop_ended", extra={"worker": self.name})
                try:
                    self._wait_for_redis()
                except StopRequested:
                    return worked
        finally:
            loop.stop()

    def _work_once(self, *args: Any, **kwargs: Any) -> bool:
        try:
            return bool(super().work(*args, **kwargs))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            log.warning("worker.redis_lost", extra={"worker": self.name}, exc_info=True)
            return False

    def _redis_answers(self) -> bool:
        try:
            return bool(self.connection.ping())
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return False

    def _wait_for_redis(self) -> None:
        """Wait until Redis answers, then come back under a new name (the old one may still be
        registered as alive in a Redis that kept its data)."""
        wait = 0.1
        time.sleep(wait)  # never spin, whatever ended RQ's loop
        while not self._redis_answers():
            time.sleep(wait)
            wait = min(wait * 2, self.max_connection_wait_time)
        self.name = uuid.uuid4().hex
        log.info("worker.redis_back", extra={"worker": self.name})
