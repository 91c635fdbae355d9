"""What is wrong, in words that stay true: the sync tasks that need a person (quarantined,
dead) or were set aside on purpose (ignored), a run's standing now that later runs may have
replaced it, and coverage capped at 100% with the raw figures kept beside it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sync.models import Run, SyncTask
from sync.states import RunState, TaskState

# The task states the status report lists one by one, with their reasons, most urgent first.
LISTED_STATES = (TaskState.DEAD, TaskState.QUARANTINED, TaskState.IGNORED)
LISTED_LIMIT = 20
PREVIOUSLY_PUBLISHED = "previously published"


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if moment is not None else None


def troubled_tasks(
    session: Session, *, dataset: str | None = None, limit: int = LISTED_LIMIT
) -> dict[str, Any]:
    """Dead, quarantined and ignored tasks with their reasons (at most ``limit`` of each state),
    and how many of each there are; with ``dataset``, only the tasks of its runs."""
    listed: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for state in LISTED_STATES:
        query = select(SyncTask).where(SyncTask.state == state)
        counted = select(func.count()).select_from(SyncTask).where(SyncTask.state == state)
        if dataset is not None:
            runs = select(Run.run_id).where(Run.dataset == dataset)
            query = query.where(SyncTask.run_id.in_(runs))
            counted = counted.where(SyncTask.run_id.in_(runs))
        counts[state] = int(session.execute(counted).scalar_one())
        for task in session.execute(
            query.order_by(SyncTask.updated_at.desc(), SyncTask.task_key).limit(limit)
        ).scalars():
            listed.append(
                {
                    "task_key": task.task_key,
                    "job_id": task.job_id,
                    "state": task.state,
                    "run_id": task.run_id,
                    "reason": reason_of(task.last_error_class, task.last_error),
                    "since": _iso(task.updated_at),
                    "failures": task.failure_count,
                }
            )
    return {"counts": counts, "tasks": listed}


def reason_of(error_class: str | None, error: str | None) -> str:
    """A task's last failure as one line: its class and message."""
    if error_class and error:
        return f"{error_class}: {error.splitlines()[0] if error.strip() else error}"
    return error_class or error or "no reason recorded"


def standing(state: str, current: bool) -> str:
    """A run's state as it is true now: a published run that a later one replaced (or that was
    withdrawn) is "previously published"."""
    if state == RunState.PUBLISHED and not current:
        return PREVIOUSLY_PUBLISHED
    return state


def coverage(observations: int, expected: int) -> tuple[float | None, float | None]:
    """(coverage capped at 100%, the raw ratio) of records kept against Cloud's stored count; a
    run can keep more than Cloud counted (recovery batches, Continue), never more than all."""
    if not expected:
        return None, None
    raw = round(100.0 * observations / expected, 1)
    return min(raw, 100.0), raw
