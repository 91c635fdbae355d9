"""Handing work to workers through RQ. Redis is a transport, never the system of record: a lost
RQ job is found again by the sweeper from the task rows in SQL.

RQ job ids are deterministic (``sync-<task key>-g<generation>-a<attempts>``), so repeats of the
same wish coalesce into the job that is already waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from redis import Redis
from rq import Queue
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

QUEUE_NAME = "scrapesync"
SYNC_JOB_TIMEOUT = 3 * 3600  # RQ's default 180 s would kill a big export's sync every time
WAITING = {JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED}


def sync_job_id(task_key: str, generation: int, attempts: int) -> str:
    """The RQ job id for one wish of one task."""
    return f"sync-{task_key}-g{generation}-a{attempts}"


class Dispatcher(Protocol):
    """Where sync tasks are handed to workers."""

    def enqueue_sync(
        self, task_key: str, *, generation: int, attempts: int, at: datetime | None = None
    ) -> bool:
        """Queue a sync of ``task_key`` (at ``at``, if given); False when one already waits."""
        ...

    def enqueue_call(self, func: str, *args: Any, job_id: str, at: datetime | None = None) -> bool:
        """Queue a maintenance or delivery job by dotted path; False when it already waits."""
        ...


class RQDispatcher:
    """Dispatcher over an RQ queue with the JSON serializer."""

    def __init__(self, redis: Redis, *, queue_name: str = QUEUE_NAME) -> None:
        self.redis = redis
        self.queue = Queue(queue_name, connection=redis, serializer=JSONSerializer)

    def _already_waiting(self, job_id: str, *, now: bool) -> bool:
        """Whether ``job_id`` already waits to run; a job scheduled for later does not satisfy
        a request to run now, so it is taken off the schedule."""
        try:
            job = Job.fetch(job_id, connection=self.redis, serializer=JSONSerializer)
        except NoSuchJobError:
            return False
        status = job.get_status(refresh=False)
        if status == JobStatus.SCHEDULED and now:
            self.queue.scheduled_job_registry.remove(job)
            return False
        return status in WAITING

    def enqueue_call(
        self,
        func: str,
        *args: Any,
        job_id: str,
        at: datetime | None = None,
        job_timeout: int | None = None,
    ) -> bool:
        """Queue ``func(*args)`` under ``job_id`` unless that job already waits."""
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

    def enqueue_sync(
        self, task_key: str, *, generation: int, attempts: int, at: datetime | None = None
    ) -> bool:
        """Queue ``sync.jobs.run_sync(task_key)``."""
        return self.enqueue_call(
            "sync.jobs.run_sync",
            task_key,
            job_id=sync_job_id(task_key, generation, attempts),
            at=at,
            job_timeout=SYNC_JOB_TIMEOUT,
        )


class RecordingDispatcher:
    """A dispatcher that only remembers what it was asked, for use cases run in the foreground."""

    def __init__(self, on_sync: Callable[[str], None] | None = None) -> None:
        self.syncs: list[tuple[str, datetime | None]] = []
        self.calls: list[tuple[str, tuple[Any, ...], datetime | None]] = []
        self.on_sync = on_sync

    def enqueue_sync(
        self, task_key: str, *, generation: int, attempts: int, at: datetime | None = None
    ) -> bool:
        """Remember the sync (and run it now if a callback was given and it is due)."""
        self.syncs.append((task_key, at))
        if self.on_sync is not None and at is None:
            self.on_sync(task_key)
        return True

    def enqueue_call(self, func: str, *args: Any, job_id: str, at: datetime | None = None) -> bool:
        """Remember the call."""
        self.calls.append((func, args, at))
        return True
