"""Handing work to workers through RQ. Redis is a transport, never the system of record: a lost
RQ job is found again by the sweeper from the task rows in SQL.

The dispatcher has one method per job kind (sync, evaluation, delivery, relay, reconcile,
maintenance, alerts); it alone knows the jobs' dotted names (``sync.jobs.*``, which jobs already
waiting in Redis name across a deploy) and their ids. Queueing never raises: a failure is logged and
answered ``None``, because the state in SQL that asked for the job is durable and a sweep asks
again.

RQ job ids are deterministic (``sync-<task key>-g<generation>-a<attempts>``), so repeats of the
same wish coalesce into the job that is already waiting. A job waits only where Redis really
holds it: a ``queued`` job in its queue's list, a ``scheduled`` one in the scheduled registry, a
``deferred`` one in the deferred registry. A job hash that says so without the list or registry
behind it (a worker killed between taking the id off the list and starting the job) is an
orphan that nobody will ever run, so it is queued again under its own id.

A Redis that stopped answering makes every call wait for the client's socket timeout; after one
such failure the dispatcher gives up at once for ``UNREACHABLE_HOLD_OFF`` seconds, so that a
sweep of many tasks, or a burst of notifications, fails in milliseconds instead of one timeout
each. The state in SQL asks again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue
from rq.exceptions import DuplicateJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from sync import logs

QUEUE_NAME = "scrapesync"
SYNC_JOB_TIMEOUT = 3 * 3600  # RQ's default 180 s would kill a big export's sync every time

# after Redis failed to answer, give up at once for this long rather than wait out its timeout
UNREACHABLE_HOLD_OFF = 5.0

log = logs.get("queue")


def sync_job_id(task_key: str, generation: int, attempts: int) -> str:
    """The RQ job id for one wish of one task."""
    return f"sync-{task_key}-g{generation}-a{attempts}"


def evaluation_job_id(run_id: str, suffix: str) -> str:
    """An RQ job id for evaluating ``run_id`` (``[A-Za-z0-9_-]`` whatever the run id holds)."""
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:16]
    return f"evaluate-{digest}-{suffix}"


class Dispatcher(Protocol):
    """Where work is handed to workers: one method per job kind. Each answers True when it
    queued the job, False when that job already waits, None when it could not be queued (the
    failure is logged under ``failure_event``; the durable state in SQL has it queued again)."""

    def sync(
        self,
        task_key: str,
        *,
        generation: int,
        attempts: int,
        at: datetime | None = None,
        failure_event: str = "sync.enqueue_failed",
    ) -> bool | None:
        """Queue a sync of ``task_key`` (at ``at``, if given)."""
        ...

    def evaluation(self, run_id: str, *, suffix: str) -> bool | None:
        """Queue an evaluation of ``run_id``."""
        ...

    def delivery(
        self, event_id: str, *, at: datetime | None = None, suffix: str = "now"
    ) -> bool | None:
        """Queue delivery of one outbox event (at ``at``, if given)."""
        ...

    def relay(self, *, bucket: int) -> bool | None:
        """Queue a relay pass over every due delivery, once per sweep interval ``bucket``."""
        ...

    def reconcile(self, *, bucket: int) -> bool | None:
        """Queue a reconcile pass, once per reconcile interval ``bucket``."""
        ...

    def maintenance(self, *, bucket: int) -> bool | None:
        """Queue a maintenance pass, once per sweep interval ``bucket``."""
        ...

    def alerts(self, *, suffix: str) -> bool | None:
        """Queue a pass of the alert sender over every due alert message."""
        ...


class JobKinds:
    """The six job kinds over one primitive, ``enqueue_call``: the names, the ids, and the
    log-on-failure every caller relies on."""

    def enqueue_call(
        self,
        func: str,
        *args: Any,
        job_id: str,
        at: datetime | None = None,
        job_timeout: int | None = None,
    ) -> bool:
        """Queue ``func(*args)`` (a dotted path) under ``job_id`` unless that job already waits;
        may raise whatever the transport raises."""
        raise NotImplementedError

    def _queue(
        self,
        func: str,
        *args: Any,
        job_id: str,
        failure_event: str,
        extra: dict[str, Any],
        at: datetime | None = None,
        job_timeout: int | None = None,
    ) -> bool | None:
        try:
            return self.enqueue_call(func, *args, job_id=job_id, at=at, job_timeout=job_timeout)
        except Exception:  # the state in SQL that asked for the job is durable; a sweep re-asks
            log.warning(failure_event, extra=extra, exc_info=True)
            return None

    def sync(
        self,
        task_key: str,
        *,
        generation: int,
        attempts: int,
        at: datetime | None = None,
        failure_event: str = "sync.enqueue_failed",
    ) -> bool | None:
        """Queue ``sync.jobs.run_sync(task_key)``."""
        return self._queue(
            "sync.jobs.run_sync",
            task_key,
            job_id=sync_job_id(task_key, generation, attempts),
            at=at,
            job_timeout=SYNC_JOB_TIMEOUT,
            failure_event=failure_event,
            extra={"task_key": task_key},
        )

    def evaluation(self, run_id: str, *, suffix: str) -> bool | None:
        """Queue ``sync.jobs.evaluate_run(run_id)``."""
        return self._queue(
            "sync.jobs.evaluate_run",
            run_id,
            job_id=evaluation_job_id(run_id, suffix),
            failure_event="evaluation.enqueue_failed",
            extra={"run_id": run_id},
        )

    def delivery(
        self, event_id: str, *, at: datetime | None = None, suffix: str = "now"
    ) -> bool | None:
        """Queue ``sync.jobs.deliver(event_id)``."""
        return self._queue(
            "sync.jobs.deliver",
            event_id,
            job_id=f"deliver-{event_id}-{suffix}",
            at=at,
            failure_event="delivery.enqueue_failed",
            extra={"event_id": event_id},
        )

    def relay(self, *, bucket: int) -> bool | None:
        """Queue ``sync.jobs.relay()``."""
        return self._queue(
            "sync.jobs.relay",
            job_id=f"relay-{bucket}",
            failure_event="relay.enqueue_failed",
            extra={},
        )

    def reconcile(self, *, bucket: int) -> bool | None:
        """Queue ``sync.jobs.reconcile()``."""
        return self._queue(
            "sync.jobs.reconcile",
            job_id=f"reconcile-{bucket}",
            failure_event="reconcile.enqueue_failed",
            extra={},
        )

    def maintenance(self, *, bucket: int) -> bool | None:
        """Queue ``sync.jobs.maintain()``."""
        return self._queue(
            "sync.jobs.maintain",
            job_id=f"maintain-{bucket}",
            failure_event="maintenance.enqueue_failed",
            extra={},
        )

    def alerts(self, *, suffix: str) -> bool | None:
        """Queue ``sync.jobs.send_alerts()``."""
        return self._queue(
            "sync.jobs.send_alerts",
            job_id=f"alerts-{suffix}",
            failure_event="alerts.enqueue_failed",
            extra={},
        )


class RedisUnreachableError(Exception):
    """Redis failed to answer a moment ago; the dispatcher does not ask again yet."""


class RQDispatcher(JobKinds):
    """Dispatcher over an RQ queue with the JSON serializer."""

    def __init__(self, redis: Redis, *, queue_name: str = QUEUE_NAME) -> None:
        self.redis = redis
        self.queue = Queue(queue_name, connection=redis, serializer=JSONSerializer)
        self._unreachable_until = 0.0

    def _where(self, job_id: str) -> tuple[str | None, bool, bool, bool]:
        """The status the job's hash holds, and whether its id is in the queue's list, the
        scheduled registry and the deferred registry: one round trip."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(Job.key_for(job_id), "status")
            pipe.lpos(self.queue.key, job_id)
            pipe.zscore(self.queue.scheduled_job_registry.key, job_id)
            pipe.zscore(self.queue.deferred_job_registry.key, job_id)
            status, position, scheduled, deferred = pipe.execute(raise_on_error=False)
        for answer in (status, scheduled, deferred):
            if isinstance(answer, Exception):
                raise answer
        if isinstance(position, ResponseError):  # LPOS came with Redis 6.0.6
            listed = job_id.encode() in self.redis.lrange(self.queue.key, 0, -1)
        elif isinstance(position, Exception):
            raise position
        else:
            listed = position is not None
        text = status.decode() if isinstance(status, bytes) else status
        return text, listed, scheduled is not None, deferred is not None

    def _already_waiting(self, job_id: str, *, now: bool) -> bool:
        """Whether ``job_id`` really waits to run; a job scheduled for later does not satisfy a
        request to run now, so it is taken off the schedule. An orphan (a hash that says queued
        with no list behind it) is taken off RQ's intermediate list, where a worker killed
        before starting it left it, so that RQ's clean-up never fails the job queued again."""
        status, listed, scheduled, deferred = self._where(job_id)
        if status == JobStatus.QUEUED:
            if not listed:
                self.redis.lrem(self.queue.intermediate_queue_key, 0, job_id)
                log.warning("queue.orphan_requeued", extra={"job_id": job_id})
            return listed
        if status == JobStatus.SCHEDULED and scheduled and now:
            self.queue.scheduled_job_registry.remove(job_id)
            return False
        if status == JobStatus.SCHEDULED:
            return scheduled
        return status == JobStatus.DEFERRED and deferred

    def _check_reachable(self, job_id: str) -> None:
        left = self._unreachable_until - time.monotonic()
        if left > 0:
            raise RedisUnreachableError(
                f"job {job_id} not queued: Redis did not answer a moment ago "
                f"(asking again in {left:.1f} s)"
            )

    def enqueue_call(
        self,
        func: str,
        *args: Any,
        job_id: str,
        at: datetime | None = None,
        job_timeout: int | None = None,
    ) -> bool:
        """Queue ``func(*args)`` under ``job_id`` unless that job already waits."""
        self._check_reachable(job_id)
        try:
            return self._enqueue(func, *args, job_id=job_id, at=at, job_timeout=job_timeout)
        except (RedisConnectionError, RedisTimeoutError):
            self._unreachable_until = time.monotonic() + UNREACHABLE_HOLD_OFF
            raise

    def _enqueue(
        self,
        func: str,
        *args: Any,
        job_id: str,
        at: datetime | None,
        job_timeout: int | None,
    ) -> bool:
        if at is None:
            # The usual case, a job id never used: one atomic check-and-enqueue round trip.
            try:
                self.queue.enqueue_call(
                    func,
                    args,
                    timeout=job_timeout,
                    job_id=job_id,
                    result_ttl=3600,
                    failure_ttl=86400,
                    unique=True,
                )
                return True
            except DuplicateJobError:
                pass  # the id exists: whether that job still waits decides below
        if self._already_waiting(job_id, now=at is None):
            return False
        options: dict[str, Any] = {"job_id": job_id, "result_ttl": 3600}
        if job_timeout is not None:
            options["job_timeout"] = job_timeout
        if at is not None:
            self.queue.enqueue_at(at, func, *args, **options)
        else:
            self.queue.enqueue(func, *args, failure_ttl=86400, **options)
        return True


class RecordingDispatcher(JobKinds):
    """A dispatcher that only remembers what it was asked, for use cases run in the foreground."""

    def __init__(self, on_sync: Callable[[str], None] | None = None) -> None:
        self.syncs: list[tuple[str, datetime | None]] = []
        self.calls: list[tuple[str, tuple[Any, ...], datetime | None]] = []
        self.on_sync = on_sync

    def enqueue_call(
        self,
        func: str,
        *args: Any,
        job_id: str,
        at: datetime | None = None,
        job_timeout: int | None = None,
    ) -> bool:
        """Remember the call; a sync is remembered apart (and run now if a callback was given
        and it is due)."""
        if func != "sync.jobs.run_sync":
            self.calls.append((func, args, at))
            return True
        (task_key,) = args
        self.syncs.append((task_key, at))
        if self.on_sync is not None and at is None:
            self.on_sync(task_key)
        return True
