"""What a run is judged on, read from the database inside the caller's transaction: the syncs and
launches it still waits for, its scraping jobs as last read from Cloud, the counts of its latest
committed imports, its observations streamed through the record rules, and the profiles of its
dataset's accepted runs before it.

Evaluation (:mod:`sync.runs.evaluation`) and ``scrapesync check`` (:mod:`sync.runs.check`) read the
same facts, so a re-judgement sees exactly what the evaluator saw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync.acceptance.facts import ImportFacts, JobFacts, PartitionTally, Profile
from sync.ingest.store import task_key_for
from sync.models import (
    Attempt,
    Launch,
    OperatorDecision,
    Run,
    RunProfile,
    ScrapingJob,
    SyncTask,
)
from sync.runs import shapes
from sync.states import (
    AttemptOutcome,
    Decision,
    LaunchKind,
    LaunchState,
    RunState,
    TaskState,
)

UNFINISHED_LAUNCHES = (LaunchState.INTENDED, LaunchState.CREATING, LaunchState.UNCERTAIN)


def pending_tasks(session: Session, run_id: str) -> dict[str, str]:
    """What the run still waits for (name -> state): its sync tasks that are not committed,
    the tasks of its scraping jobs and launched jobs never synced, launches whose Cloud job
    may not exist yet, and, while none of its syncs has committed, the first sync."""
    rows = dict(
        session.execute(
            select(SyncTask.task_key, SyncTask.state).where(SyncTask.run_id == run_id)
        ).all()
    )
    launching = dict(
        session.execute(
            select(Launch.batch_id, Launch.state).where(
                Launch.run_id == run_id, Launch.state.in_(UNFINISHED_LAUNCHES)
            )
        ).all()
    )
    job_ids: set[int | None] = set(
        session.execute(select(ScrapingJob.job_id).where(ScrapingJob.run_id == run_id)).scalars()
    )
    job_ids |= set(
        session.execute(
            select(Launch.job_id).where(Launch.run_id == run_id, Launch.job_id.is_not(None))
        ).scalars()
    )
    unknown = {task_key_for(j) for j in job_ids if j is not None} - set(rows)
    if unknown:
        found = dict(
            session.execute(
                select(SyncTask.task_key, SyncTask.state).where(SyncTask.task_key.in_(unknown))
            ).all()
        )
        rows.update({key: found.get(key, "not synced") for key in unknown})
    pending = {key: state for key, state in rows.items() if state != TaskState.COMMITTED}
    pending.update({f"launch {batch}": state for batch, state in launching.items()})
    if not pending and TaskState.COMMITTED not in rows.values():
        pending["first sync"] = "not synced"
    return pending


def job_facts(session: Session, run_id: str, errors: Mapping[int, str]) -> list[JobFacts]:
    """The run's scraping jobs as last read from Cloud; ``errors`` names jobs whose quality
    facts could not be read this time."""
    jobs = session.execute(
        select(ScrapingJob).where(ScrapingJob.run_id == run_id).order_by(ScrapingJob.job_id)
    ).scalars()
    recovery_urls = {
        batch: list(urls or [])
        for batch, urls in session.execute(
            select(Launch.batch_id, Launch.start_urls).where(
                Launch.run_id == run_id, Launch.kind == LaunchKind.RERUN
            )
        ).all()
    }
    facts = []
    for job in jobs:
        fresh = job.quality_checked_at is not None and job.quality_checked_at >= job.last_seen_at
        facts.append(
            JobFacts(
                job_id=job.job_id,
                status=job.status,
                jobs_scheduled=job.jobs_scheduled,
                jobs_executed=job.jobs_executed,
                jobs_failed=job.jobs_failed,
                jobs_empty=job.jobs_empty,
                jobs_no_value=job.jobs_no_value,
                stored_record_count=job.stored_record_count,
                data_quality=job.data_quality if fresh else None,
                problematic_urls=(job.problematic_urls or []) if fresh else [],
                quality_error=errors.get(job.job_id),
                recovery_start_urls=(
                    recovery_urls.get(job.recovery_batch, [])
                    if job.recovery_batch is not None
                    else None
                ),
            )
        )
    return facts


def import_facts(session: Session, run_id: str) -> ImportFacts:
    """Counts of the latest committed attempt of each of the run's tasks."""
    keys = select(SyncTask.task_key).where(SyncTask.run_id == run_id).scalar_subquery()
    latest: dict[str, Attempt] = {}
    for attempt in session.execute(
        select(Attempt)
        .where(Attempt.task_key.in_(keys), Attempt.outcome == AttemptOutcome.COMMITTED)
        .order_by(Attempt.finished_at)
    ).scalars():
        latest[attempt.task_key] = attempt
    read = sum(a.records_read for a in latest.values())
    missing = sum(a.missing_key for a in latest.values())
    duplicates = sum(a.duplicate_keys for a in latest.values())
    invalid = sum(a.invalid_records for a in latest.values())
    partitions: dict[str, dict[str, int]] = {}
    unplaced: dict[str, int] = {}
    for attempt in latest.values():
        detail = attempt.invalid_detail or {}
        for name, reasons in (detail.get("partitions") or {}).items():
            _add_counts(partitions.setdefault(name, {}), reasons)
        _add_counts(unplaced, detail.get("unplaced") or {})
    return ImportFacts(
        records_read=read,
        missing_key=missing,
        distinct_keys=read - missing - duplicates - invalid,
        conflicting_duplicates=sum(a.conflicting_duplicates for a in latest.values()),
        invalid_partitions=partitions,
        invalid_unplaced=unplaced,
    )


def _add_counts(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for reason, n in counts.items():
        into[reason] = into.get(reason, 0) + int(n)


def tally(
    session: Session,
    run_id: str,
    dataset: Dataset,
    *,
    keep: bool = True,
    keep_pending: bool = False,
    kept: Sequence[shapes.Group] | None = None,
    version: int | None = None,
) -> tuple[dict[str, PartitionTally], shapes.RowStates]:
    """The run's records tallied per partition under the record rules, reading again only those
    not judged before (:mod:`sync.runs.shapes`; ``keep`` false writes nothing); also count its
    rows by validation state (``keep_pending``: and keep the ids of those rewritten since the
    last verdict; ``kept``: the run's rows per group at this snapshot's ``version``, as
    :func:`shapes.kept_groups` gives them, counted instead of the run)."""
    return shapes.tally(
        session,
        run_id,
        dataset,
        keep=keep,
        keep_pending=keep_pending,
        kept=kept,
        version=version,
    )


def accepted_history(session: Session, run: Run, *, limit: int) -> list[Profile]:
    """The profiles of the dataset's last ``limit`` accepted runs begun before ``run``, newest
    first, and after the dataset's baseline reset in force when ``run`` began (if any);
    rejected runs never count."""
    reset = baseline_reset_before(session, run.dataset, run.created_at)
    rows = session.execute(
        select(RunProfile)
        .join(Run, Run.run_id == RunProfile.run_id)
        .where(
            Run.dataset == run.dataset,
            Run.run_id != run.run_id,
            Run.state.in_((RunState.ACCEPTED, RunState.PUBLISHED)),
            Run.created_at < run.created_at,
            *([Run.created_at > reset] if reset is not None else []),
        )
        .order_by(Run.created_at.desc(), Run.run_id.desc())
        .limit(limit)
    ).scalars()
    return [
        Profile(
            records=row.records,
            partitions={str(k): int(v) for k, v in row.partitions.items()},
            fill_rates={str(k): float(v) for k, v in row.fill_rates.items()},
            partition_fill_rates={
                str(p): {str(k): float(v) for k, v in rates.items()}
                for p, rates in row.partition_fill_rates.items()
            },
            run_id=row.run_id,
        )
        for row in rows
    ]


def baseline_reset_before(session: Session, dataset: str, moment: datetime) -> datetime | None:
    """When the dataset's baseline was last reset before ``moment`` (an operator's
    ``baseline reset``): history rules compare only with runs begun after it."""
    found: datetime | None = session.execute(
        select(func.max(OperatorDecision.decided_at)).where(
            OperatorDecision.dataset == dataset,
            OperatorDecision.action == Decision.BASELINE_RESET,
            OperatorDecision.decided_at < moment,
        )
    ).scalar_one()
    return found
