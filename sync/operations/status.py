"""What an operator wants to know at a glance, as plain values: runs with their coverage and
verdicts, tasks by state, the outbox backlog, the last reconcile and the API budget left.

The CLI (``scrapesync status``), the status page and ``GET /api/runs`` all show this one dict.
Its counts and ages come from :func:`figures`, which ``GET /metrics`` reads too, so the status
report and Prometheus never answer one question two ways.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sync.bootstrap import Services
from sync.delivery import backlog
from sync.models import (
    Attempt,
    Delivery,
    Launch,
    MaintenanceRun,
    Notification,
    Observation,
    OperatorDecision,
    OutboxEvent,
    PartitionVerdict,
    Publication,
    Run,
    ScrapingJob,
    SyncTask,
)
from sync.operations import heartbeat, triage
from sync.operations.reasons import reason_detail, reason_text
from sync.runs import verdict_rows
from sync.states import AttemptOutcome, Decision, OutboxState, PassKind, RunState, TaskState

TASK_STATES: tuple[str, ...] = tuple(TaskState)  # in lifecycle order
RUN_STATES: tuple[str, ...] = tuple(RunState)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if moment is not None else None


def _age(now: datetime, moment: datetime | None) -> float | None:
    return round((now - moment).total_seconds(), 1) if moment is not None else None


@dataclass(frozen=True)
class _RunParts:
    """What the listed runs are shown with, each keyed by run id."""

    observed: dict[str, int]
    jobs: dict[str, list[dict[str, Any]]]
    verdicts: dict[str, list[dict[str, Any]]]
    launches: dict[str, list[dict[str, Any]]]
    tasks: dict[str, dict[str, int]]
    current: set[str]
    changes: dict[str, dict[str, Any] | None]


def _runs(session: Session, *, limit: int, dataset: str | None = None) -> list[dict[str, Any]]:
    """The latest runs (of ``dataset``, or all), newest first, each with its jobs, verdicts,
    launches, tasks, coverage."""
    query = select(Run).order_by(Run.created_at.desc(), Run.run_id).limit(limit)
    if dataset is not None:
        query = query.where(Run.dataset == dataset)
    runs = list(session.execute(query).scalars().all())
    ids = [r.run_id for r in runs]
    if not ids:
        return []
    parts = _RunParts(
        observed=dict(
            session.execute(
                select(Observation.run_id, func.count())
                .where(Observation.run_id.in_(ids))
                .group_by(Observation.run_id)
            ).all()
        ),
        jobs=_jobs(session, ids),
        verdicts=_verdicts(session, ids),
        launches=_launches(session, ids),
        tasks=_run_tasks(session, ids),
        current=set(
            session.execute(
                select(Publication.run_id).where(Publication.is_current.is_(True))
            ).scalars()
        ),
        changes=_run_changes(session, ids),
    )
    return [_run_row(run, parts) for run in runs]


def _jobs(session: Session, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The runs' scraping jobs with Cloud's page counters."""
    jobs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for job in session.execute(
        select(ScrapingJob).where(ScrapingJob.run_id.in_(ids)).order_by(ScrapingJob.job_id)
    ).scalars():
        assert job.run_id is not None
        jobs[job.run_id].append(
            {
                "job_id": job.job_id,
                "status": job.status,
                "recovery_batch": job.recovery_batch,
                "pages_scheduled": job.jobs_scheduled,
                "pages_failed": job.jobs_failed,
                "pages_empty": job.jobs_empty,
                "pages_no_value": job.jobs_no_value,
                "stored_record_count": job.stored_record_count,
                "problematic_urls": len(job.problematic_urls or []),
            }
        )
    return jobs


def _verdicts(session: Session, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The runs' partition verdicts with their reasons."""
    verdicts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for verdict in session.execute(
        select(PartitionVerdict)
        .where(PartitionVerdict.run_id.in_(ids))
        .order_by(PartitionVerdict.partition)
    ).scalars():
        verdicts[verdict.run_id].append(
            {
                "partition": verdict.partition,
                "state": verdict.state,
                "records": verdict.records,
                "reasons": [reason_text(r) for r in verdict.reasons or []],
                "reason_details": [reason_detail(r) for r in verdict.reasons or []],
            }
        )
    return verdicts


def _launches(session: Session, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The runs' launches and recovery batches, oldest first."""
    launches: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for launch in session.execute(
        select(Launch).where(Launch.run_id.in_(ids)).order_by(Launch.created_at)
    ).scalars():
        launches[launch.run_id].append(
            {
                "batch_id": launch.batch_id,
                "kind": launch.kind,
                "state": launch.state,
                "job_id": launch.job_id,
                "partition": launch.partition,
            }
        )
    return launches


def _run_tasks(session: Session, ids: list[str]) -> dict[str, dict[str, int]]:
    """The runs' sync tasks counted by state."""
    tasks: dict[str, dict[str, int]] = defaultdict(dict)
    for run_id, state, count in session.execute(
        select(SyncTask.run_id, SyncTask.state, func.count())
        .where(SyncTask.run_id.in_(ids))
        .group_by(SyncTask.run_id, SyncTask.state)
    ):
        if run_id is not None:
            tasks[run_id][state] = int(count)
    return tasks


def _run_changes(session: Session, ids: list[str]) -> dict[str, dict[str, Any] | None]:
    """What each run's publication changed for readers."""
    changes: dict[str, dict[str, Any] | None] = {}
    for run_id, counted in session.execute(
        select(Publication.run_id, Publication.changes)
        .where(Publication.run_id.in_(ids))
        .order_by(Publication.id)
    ):
        changes[run_id] = change_counts(counted)  # the run's latest publication wins
    return changes


def _run_row(run: Run, parts: _RunParts) -> dict[str, Any]:
    """One run as shown: coverage counted from its primary jobs, never its recovery jobs."""
    jobs = parts.jobs[run.run_id]
    primary = [j for j in jobs if j["recovery_batch"] is None]
    expected = sum(j["stored_record_count"] for j in primary)
    observations = int(parts.observed.get(run.run_id, 0))
    capped, raw = triage.coverage(observations, expected)
    return {
        "run_id": run.run_id,
        "dataset": run.dataset,
        "window": run.collection_window,
        "state": run.state,
        "revision": run.revision,
        "published": run.run_id in parts.current,
        "standing": triage.standing(run.state, run.run_id in parts.current),
        "changes": parts.changes.get(run.run_id),
        "reasons": [reason_text(r) for r in run.reasons or []],
        "reason_details": [reason_detail(r) for r in run.reasons or []],
        "decision": verdict_rows.decided_by(run),
        "diagnosis": run.diagnosis,
        "created_at": _iso(run.created_at),
        "evaluated_at": _iso(run.evaluated_at),
        "accepted_at": _iso(run.accepted_at),
        "published_at": _iso(run.published_at),
        "observations": observations,
        "expected_records": expected,
        "coverage_percent": capped,
        "coverage_raw_percent": raw,
        "pages_scheduled": sum(j["pages_scheduled"] for j in primary),
        "pages_failed": sum(j["pages_failed"] for j in primary),
        "pages_empty": sum(j["pages_empty"] for j in primary),
        "pages_no_value": sum(j["pages_no_value"] for j in primary),
        "recovery_jobs": len(jobs) - len(primary),
        "jobs": jobs,
        "partitions": parts.verdicts[run.run_id],
        "launches": parts.launches[run.run_id],
        "tasks": parts.tasks[run.run_id],
    }


def change_counts(recorded: dict[str, Any] | None) -> dict[str, Any] | None:
    """A publication's change counts as shown (added, removed, changed, baseline, the run
    before it); None for a publication made before counts were kept."""
    if recorded is None:
        return None
    return {
        "added": int(recorded.get("added") or 0),
        "removed": int(recorded.get("removed") or 0),
        "changed": int(recorded.get("changed") or 0),
        "baseline": bool(recorded.get("baseline")),
        "previous_run_id": recorded.get("previous_run_id"),
    }


def _last_of_each(session: Session, query: Any, column: Any, dataset: str | None) -> dict[str, Any]:
    """The last row of ``query`` (in its order) for each dataset, or for ``dataset`` only."""
    if dataset is not None:
        query = query.where(column == dataset)
    return {row.dataset: row for row in session.execute(query).scalars()}


def _since(publication: Publication) -> str | None:
    """What a publication's counts are counted from: the run published before it, or "its last
    publication" when it published the same run again (Cloud's "Continue")."""
    previous = (publication.changes or {}).get("previous_run_id")
    return "its last publication" if previous == publication.run_id else previous


def _publications(session: Session, dataset: str | None = None) -> list[dict[str, Any]]:
    """Each dataset's (or ``dataset``'s) last publication and what it changed for readers."""
    query = select(Publication).order_by(Publication.id)
    last: dict[str, Publication] = _last_of_each(session, query, Publication.dataset, dataset)
    return [
        {
            "dataset": name,
            "run_id": p.run_id,
            "current": p.is_current,
            "published_at": _iso(p.published_at),
            "changes": change_counts(p.changes),
            "since": _since(p),
        }
        for name, p in sorted(last.items())
    ]


def _baseline_resets(session: Session, dataset: str | None = None) -> list[dict[str, Any]]:
    """Each dataset's (or ``dataset``'s) last baseline reset: who, when and why."""
    query = (
        select(OperatorDecision)
        .where(OperatorDecision.action == Decision.BASELINE_RESET)
        .order_by(OperatorDecision.decided_at, OperatorDecision.id)
    )
    last: dict[str, OperatorDecision] = _last_of_each(
        session, query, OperatorDecision.dataset, dataset
    )
    return [
        {
            "dataset": name,
            "decided_by": d.decided_by,
            "reason": d.reason,
            "decided_at": _iso(d.decided_at),
        }
        for name, d in sorted(last.items())
    ]


@dataclass(frozen=True)
class LastReconcile:
    """The latest reconcile pass as recorded: when it ran and its summary."""

    started_at: datetime
    finished_at: datetime | None
    summary: dict[str, Any]


@dataclass(frozen=True)
class Figures:
    """The deployment's counts and moments read from SQL in one go: the one source of the
    status report and of ``/metrics``."""

    now: datetime
    tasks_by_state: dict[str, int]  # every state of TASK_STATES, zero included
    oldest_lease_at: datetime | None  # start of the oldest attempt under a lease still held
    expired_leases: int
    oldest_due_at: datetime | None  # the longest-waiting task that is due now
    runs_by_state: dict[str, int]  # every state of RUN_STATES, zero included
    outbox_events: dict[str, int]
    deliveries: dict[str, int]
    oldest_undelivered_at: datetime | None
    notifications: int
    attempts_by_outcome: dict[str, int]
    last_reconcile: LastReconcile | None
    last_maintenance_at: datetime | None
    last_maintenance: heartbeat.Beat | None
    # destinations a 410 Gone disabled, and those failing now (their retry windows running)
    destinations_disabled: int = 0
    destinations_failing: int = 0

    @property
    def outbox_backlog(self) -> int:
        """Outbox events not yet delivered to every destination."""
        return sum(n for state, n in self.outbox_events.items() if state != OutboxState.DELIVERED)


def figures(session: Session, now: datetime) -> Figures:
    """Tasks, leases, runs, the outbox, notifications, attempts and the last passes, as of now."""
    return Figures(
        now=now,
        tasks_by_state=dict.fromkeys(TASK_STATES, 0) | _grouped(session, SyncTask.state),
        oldest_lease_at=_oldest_lease(session),
        expired_leases=int(
            session.execute(
                select(func.count())
                .select_from(SyncTask)
                .where(SyncTask.state == TaskState.LEASED, SyncTask.lease_until < now)
            ).scalar_one()
        ),
        oldest_due_at=session.execute(
            select(func.min(SyncTask.next_attempt_at)).where(
                SyncTask.state.in_((TaskState.PENDING, TaskState.RETRY_WAIT)),
                SyncTask.next_attempt_at <= now,
            )
        ).scalar_one(),
        runs_by_state=dict.fromkeys(RUN_STATES, 0) | _grouped(session, Run.state),
        outbox_events=_grouped(session, OutboxEvent.state),
        deliveries=_grouped(session, Delivery.state),
        oldest_undelivered_at=session.execute(
            select(func.min(OutboxEvent.created_at)).where(
                OutboxEvent.state != OutboxState.DELIVERED
            )
        ).scalar_one(),
        notifications=int(
            session.execute(select(func.count()).select_from(Notification)).scalar_one()
        ),
        attempts_by_outcome=_grouped(session, Attempt.outcome),
        last_reconcile=_latest_reconcile(session),
        last_maintenance_at=heartbeat.last(session),
        last_maintenance=heartbeat.latest(session),
        destinations_disabled=backlog.count_destinations(session, disabled=True),
        destinations_failing=backlog.count_destinations(session, disabled=False),
    )


def _grouped(session: Session, column: Any) -> dict[str, int]:
    """Rows counted by the value of ``column``."""
    return {
        str(key): int(count)
        for key, count in session.execute(select(column, func.count()).group_by(column))
    }


def _oldest_lease(session: Session) -> datetime | None:
    """When the oldest attempt still running under its task's current lease started."""
    return session.execute(
        select(func.min(Attempt.started_at))
        .select_from(Attempt)
        .join(
            SyncTask,
            (SyncTask.task_key == Attempt.task_key) & (SyncTask.lease_token == Attempt.lease_token),
        )
        .where(SyncTask.state == TaskState.LEASED, Attempt.outcome == AttemptOutcome.RUNNING)
    ).scalar_one()


def _latest_reconcile(session: Session) -> LastReconcile | None:
    """The reconcile pass that started last, if one ever did."""
    row = session.execute(
        select(MaintenanceRun)
        .where(MaintenanceRun.kind == PassKind.RECONCILE)
        .order_by(MaintenanceRun.started_at.desc(), MaintenanceRun.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    if row is None:
        return None
    return LastReconcile(row.started_at, row.finished_at, row.summary or {})


def _tasks(shown: Figures) -> dict[str, Any]:
    """Sync tasks by state and the ages of the oldest lease and the longest-waiting task."""
    return {
        "by_state": shown.tasks_by_state,
        "oldest_lease_age_seconds": _age(shown.now, shown.oldest_lease_at),
        "expired_leases": shown.expired_leases,
        "oldest_due_age_seconds": _age(shown.now, shown.oldest_due_at),
    }


def _outbox(shown: Figures) -> dict[str, Any]:
    """Outbox events and deliveries by state, the backlog and its oldest event's age."""
    return {
        "events": shown.outbox_events,
        "deliveries": shown.deliveries,
        "backlog": shown.outbox_backlog,
        "oldest_undelivered_age_seconds": _age(shown.now, shown.oldest_undelivered_at),
    }


def _last_reconcile(shown: Figures) -> dict[str, Any] | None:
    """The last reconcile pass: when, how long ago, and what it listed and wanted."""
    last = shown.last_reconcile
    if last is None:
        return None
    summary = last.summary
    return {
        "started_at": _iso(last.started_at),
        "finished_at": _iso(last.finished_at),
        "age_seconds": _age(shown.now, last.started_at),
        "state": summary.get("state", "done" if last.finished_at else "running"),
        "error": summary.get("listing_error"),
        "listed": summary.get("listed"),
        "wanted": len(summary.get("wanted") or []),
        "runs_evaluated": len(summary.get("runs_evaluated") or []),
        "complete": summary.get("complete"),
    }


def _maintenance(shown: Figures, interval: float) -> dict[str, Any]:
    """The last maintenance pass: when, whether it is late, and the steps that failed."""
    beat = shown.last_maintenance
    return {
        "finished_at": _iso(beat.finished_at) if beat is not None else None,
        "age_seconds": beat.age(shown.now) if beat is not None else None,
        "late": heartbeat.late(beat, now=shown.now, interval=interval),
        "failed_steps": beat.failed if beat is not None else [],
    }


def _budget(services: Services) -> int | None:
    if services.budget is None:
        return None
    try:
        return int(services.budget.remaining())
    except Exception:  # Redis away: the status page still shows the rest
        return None


def overview(services: Services, *, limit: int = 50, dataset: str | None = None) -> dict[str, Any]:
    """Everything ``scrapesync status`` and the status page show, as plain values; with
    ``dataset``, its runs, publication and tasks only (the deployment's figures stay whole)."""
    now = services.clock()
    with services.uow.begin() as session:
        values: dict[str, Any] = {
            "generated_at": _iso(now),
            "dataset": dataset,
            "runs": _runs(session, limit=limit, dataset=dataset),
            "publications": _publications(session, dataset),
            "baseline_resets": _baseline_resets(session, dataset),
            "attention": triage.troubled_tasks(session, dataset=dataset),
        }
        shown = figures(session, now)
        destinations = backlog.destination_rows(session, services)
    values["tasks"] = _tasks(shown)
    values["outbox"] = _outbox(shown)
    values["destinations"] = destinations
    values["last_reconcile"] = _last_reconcile(shown)
    values["maintenance"] = _maintenance(shown, services.settings.sweep_interval)
    values["api_budget"] = {
        "remaining": _budget(services),
        "limit": services.settings.api_budget_limit,
        "window_seconds": services.settings.api_budget_window,
    }
    return values
