"""Which runs are due for evaluation, and queueing them (the maintenance sweep's step).

A run is due when every sync of it has committed and its data changed since its verdict (its
``data_version`` is past the ``evaluated_version`` its last verdict judged, or it has none). The
evaluation job is named after the data version, so the one a sync queued and the one a sweep
queues for the same change are one job.
"""

from __future__ import annotations

from sqlalchemy import case, func, or_, select
from sqlalchemy.orm import Session

from sync.bootstrap import Services
from sync.ingest.run_rows import evaluation_suffix
from sync.models import Launch, Run, SyncTask
from sync.states import LaunchState, TaskState

_CHUNK = 500  # run ids per IN (...) list, well under any driver's parameter limit


def runs_due_for_evaluation(session: Session, *, limit: int | None = 500) -> list[str]:
    """Runs whose every sync has committed, with data newer than their last verdict (or no
    verdict yet): the sweep queues them, reconcile judges them. Candidates waiting for Cloud's
    data-quality result record no judged version, so they stay due until Cloud answers.

    A run's syncs are those that committed into it plus those of its created launches; a
    launch still being created, or one whose job has not reported back, holds the run open
    (its own commit queues the evaluation).
    """
    t = SyncTask.__table__.c
    per_run = (
        select(
            t.run_id,
            func.sum(case((t.state != TaskState.COMMITTED, 1), else_=0)).label("open"),
        )
        .where(t.run_id.is_not(None))
        .group_by(t.run_id)
        .subquery()
    )
    candidates = list(
        session.execute(
            select(Run.run_id)
            .join(per_run, per_run.c.run_id == Run.run_id)
            .where(
                per_run.c.open == 0,
                or_(Run.evaluated_version.is_(None), Run.data_version > Run.evaluated_version),
            )
        ).scalars()
    )
    held: set[str] = set()
    for start in range(0, len(candidates), _CHUNK):
        held.update(
            session.execute(
                select(Launch.run_id)
                .outerjoin(SyncTask, SyncTask.job_id == Launch.job_id)
                .where(
                    Launch.run_id.in_(candidates[start : start + _CHUNK]),
                    Launch.state != LaunchState.FAILED,
                    or_(
                        Launch.state != LaunchState.CREATED,
                        SyncTask.state.is_(None),
                        SyncTask.state != TaskState.COMMITTED,
                    ),
                )
            ).scalars()
        )
    return sorted(set(candidates) - held)[:limit]


def redrive(services: Services) -> int:
    """Queue an evaluation of every run that is due for one; returns how many were queued. The
    job is named after the data version, so it coalesces with the one its sync queued."""
    with services.uow.begin() as session:
        due = runs_due_for_evaluation(session)
        versions = dict(
            session.execute(select(Run.run_id, Run.data_version).where(Run.run_id.in_(due))).all()
        )
    return sum(
        bool(services.dispatcher.evaluation(run_id, suffix=evaluation_suffix(versions[run_id])))
        for run_id in due
    )
