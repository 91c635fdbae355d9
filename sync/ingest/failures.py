"""What a failure of the sync task means: the task's next state, when it is tried again and
whether the failure counts against its retry budget, decided in :func:`classify` alone."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import DataError, DBAPIError, SQLAlchemyError

from sync.bootstrap import Services
from sync.cloud.errors import (
    ApiBudgetExhaustedError,
    CloudAuthError,
    CloudError,
    CloudNotFoundError,
    CloudRateLimitedError,
    CloudValidationError,
)
from sync.ingest.store import Lease
from sync.models import Attempt
from sync.retry import backoff as jittered
from sync.states import TaskState

BACKOFF_BASE = 10.0
BACKOFF_CAP = 900.0
POLL_BASE = 60.0
POLL_CAP = 900.0


class JobNotFinishedError(Exception):
    """Cloud is still scraping the job; its data is not final. The run it belongs to is known,
    so the run waits for it."""

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class NoDatasetError(Exception):
    """The job's sitemap feeds no configured dataset."""


class UnusableJobError(Exception):
    """What Cloud says about the job cannot be used (a counter or time out of range, a status
    nobody knows for too long), and asking again will not change that."""


PERMANENT = (CloudAuthError, CloudValidationError, NoDatasetError, UnusableJobError, DataError)


@dataclass(frozen=True)
class Verdict:
    """How a failure is handled: the task's next state, when to try again, whether it counts
    against the retry budget."""

    state: str
    wait: float | None
    count_failure: bool


THROTTLED = ("CloudRateLimitedError", "ApiBudgetExhaustedError")


def backoff(failures: int, draw: float) -> float:
    """The task's wait after its ``failures``-th failure in a row (draw in [0, 1))."""
    return jittered(failures, draw, base=BACKOFF_BASE, cap=BACKOFF_CAP)


def poll_wait(failures: int) -> float:
    """The wait before asking again about a job Cloud is still scraping, after ``failures``
    failures in a row: the capped backoff without jitter (a draw of 1)."""
    return jittered(failures, 1.0, base=POLL_BASE, cap=POLL_CAP)


def classify(exc: BaseException, *, failures: int, draw: float, throttled: int = 0) -> Verdict:
    """The one place that decides what a failure of the sync task means (``throttled``: how
    many attempts in a row before this one Cloud or the budget refused)."""
    if isinstance(exc, JobNotFinishedError):
        return Verdict(TaskState.RETRY_WAIT, poll_wait(failures), False)
    if isinstance(exc, NoDatasetError):  # another sitemap of the account: not a failure
        return Verdict(TaskState.IGNORED, None, False)
    if isinstance(exc, PERMANENT):  # retrying cannot fix these: quarantined at once
        return Verdict(TaskState.QUARANTINED, None, False)
    if isinstance(exc, CloudNotFoundError):
        return Verdict(TaskState.GONE, None, False)
    if isinstance(exc, CloudRateLimitedError | ApiBudgetExhaustedError):
        if exc.retry_after is not None:
            return Verdict(TaskState.RETRY_WAIT, exc.retry_after + draw, False)
        # Cloud named no wait: wait longer each time in a row (half of the ceiling at least),
        # never spending the failure budget
        return Verdict(TaskState.RETRY_WAIT, backoff(throttled + 1, 0.5 + draw / 2), False)
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        # The database went away (a restart, a failover): the first time, the next sweep
        # retries as soon as it answers; a connection lost on every try backs off and counts,
        # so a proxy that cuts long transactions cannot make the job download forever.
        return Verdict(TaskState.RETRY_WAIT, backoff(failures, draw) if failures else 0.0, True)
    if isinstance(exc, CloudError):
        wait = backoff(failures, draw)
        if exc.retry_after is not None:
            wait = max(wait, exc.retry_after)
        return Verdict(TaskState.RETRY_WAIT, wait, True)
    return Verdict(TaskState.RETRY_WAIT, backoff(failures, draw), True)


def failure_message(exc: BaseException) -> str:
    """What an attempt stores about its failure: a database error's first line (never the
    statement's parameters, which hold whole records), anything else bounded in length."""
    if isinstance(exc, SQLAlchemyError):
        text = str(getattr(exc, "orig", None) or exc).strip()
        return (text.splitlines() or [type(exc).__name__])[0][:500]
    return str(exc)[:2000]


def throttled_in_a_row(services: Services, lease: Lease) -> int:
    """How many of the task's latest attempts, before this one, Cloud or the budget refused."""
    with services.uow.begin() as session:
        classes = session.execute(
            select(Attempt.error_class)
            .where(Attempt.task_key == lease.task_key, Attempt.attempt_id != lease.attempt_id)
            .order_by(Attempt.started_at.desc())
            .limit(32)
        ).scalars()
        count = 0
        for error_class in classes:
            if error_class not in THROTTLED:
                break
            count += 1
        return count
