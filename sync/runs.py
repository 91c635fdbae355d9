"""Evaluating, accepting and publishing runs.

After a sync commits, its run is evaluated. Cloud's data-quality result and problematic URLs of
the run's finished jobs are fetched first, outside any transaction. Then ONE transaction reads
the run's tasks, jobs and observations (streamed, a few thousand rows at a time, into per
partition tallies that also give the run's profile) and the profiles of the dataset's last
accepted runs, judges them with the pure rules of :mod:`sync.acceptance`, and writes everything
the verdict changes: partition verdicts, quarantined observations, the run's state, reasons and
revision, its profile (kept while it is accepted), the dataset's published pointer, and the
outbox events that announce it. Until that commit the previously published run
stays published, readable in full.

Repeat-safety: a run's ``revision`` goes up only when its verdict or its data changed (a new
state, another set of passing partitions, or observations rewritten since the last verdict);
event ids are derived from run id, event type and revision, so evaluating twice never announces
one change twice. On PostgreSQL the transaction runs at REPEATABLE READ, so a sync or another
evaluation that commits in between makes this one retry instead of marking rows it never read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any

from sqlalchemy import delete, func, or_, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from config.datasets import Dataset, Datasets
from sync import acceptance, logs, outbox
from sync.acceptance import NO_PARTITION, ImportFacts, JobFacts, Judgement
from sync.bootstrap import Services
from sync.client import CloudError
from sync.models import (
    Attempt,
    Launch,
    Observation,
    OutboxEvent,
    PartitionVerdict,
    Publication,
    Run,
    RunProfile,
    ScrapingJob,
    SyncTask,
)
from sync.store import task_key_for

log = logs.get("runs")

DECIDED = ("accepted", "published", "rejected")
OPEN = ("collecting", "candidate")
UNFINISHED_LAUNCHES = ("intended", "creating", "uncertain")
PROBLEMATIC_URL_LIMIT = 500
CONFLICT_RETRIES = 5
_RETRYABLE_SQLSTATES = ("40001", "40P01")


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation of a run did."""

    run_id: str
    outcome: str
    state: str | None
    revision: int = 0
    events: tuple[str, ...] = ()
    reasons: tuple[dict[str, Any], ...] = ()
    changed: bool = False


@dataclass(frozen=True)
class RunVerdict:
    """A run's verdict as plain values: state, revision, reasons with their numbers, each
    partition's verdict, whether it is the dataset's published run, and its events."""

    run_id: str
    dataset: str
    collection_window: str
    state: str
    revision: int
    reasons: list[dict[str, Any]]
    partitions: list[dict[str, Any]]
    is_published: bool
    evaluated_at: datetime | None
    accepted_at: datetime | None
    published_at: datetime | None
    events: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The verdict as JSON-able values (timestamps in ISO 8601)."""
        return {
            "run_id": self.run_id,
            "dataset": self.dataset,
            "collection_window": self.collection_window,
            "state": self.state,
            "revision": self.revision,
            "reasons": self.reasons,
            "partitions": self.partitions,
            "is_published": self.is_published,
            "evaluated_at": _iso(self.evaluated_at),
            "accepted_at": _iso(self.accepted_at),
            "published_at": _iso(self.published_at),
            "events": [{**e, "created_at": _iso(e.get("created_at"))} for e in self.events],
        }


def _iso(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else None


# --- the use case -------------------------------------------------------------------------------


def evaluate_run(services: Services, run_id: str) -> Evaluation:
    """Judge a run and write its verdict, publication and outbox events in one transaction."""
    errors = _refresh_cloud_facts(services, run_id)
    for attempt in range(1, CONFLICT_RETRIES + 1):
        try:
            result = _decide(services, run_id, errors)
            break
        except (OperationalError, IntegrityError) as exc:
            if attempt == CONFLICT_RETRIES or not _is_conflict(exc):
                raise
            log.info("evaluation.conflict", extra={"run_id": run_id, "attempt": attempt})
    services.killpoints.reached("after-acceptance")
    for event_id in result.events:
        outbox.enqueue_delivery(services, event_id)
    log.info(
        "run.evaluated",
        extra={
            "run_id": run_id,
            "outcome": result.outcome,
            "state": result.state,
            "revision": result.revision,
            "events": list(result.events),
        },
    )
    return result


def _is_conflict(exc: OperationalError | IntegrityError) -> bool:
    """A serialization failure, a deadlock, or a race for the published pointer."""
    if isinstance(exc, IntegrityError):
        return "publications" in str(exc.orig)
    return getattr(exc.orig, "sqlstate", None) in _RETRYABLE_SQLSTATES


def _refresh_cloud_facts(services: Services, run_id: str) -> dict[int, str]:
    """Fetch Cloud's data-quality result and problematic URLs of the run's finished jobs that
    changed since they were last fetched; returns the jobs whose facts could not be read."""
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        if run is None or run.dataset not in services.datasets.by_name:
            return {}
        if _pending_tasks(session, run_id):
            return {}
        dataset = services.datasets.get(run.dataset)
        j = ScrapingJob.__table__.c
        stale = session.execute(
            select(
                j.job_id,
                j.last_seen_at,
                (j.jobs_failed + j.jobs_empty + j.jobs_no_value).label("problems"),
            ).where(
                j.run_id == run_id,
                j.status == "finished",
                or_(j.quality_checked_at.is_(None), j.quality_checked_at < j.last_seen_at),
            )
        ).all()
    if not stale:
        return {}
    errors: dict[int, str] = {}
    with services.cloud() as cloud:
        for job_id, seen_at, problems in stale:
            try:
                quality = (
                    cloud.get_data_quality(job_id) if dataset.quality.use_cloud_quality else None
                )
                urls = (
                    [
                        {"url": u.url, "type": u.type}
                        for u in islice(cloud.iter_problematic_urls(job_id), PROBLEMATIC_URL_LIMIT)
                    ]
                    if problems
                    else []
                )
            except CloudError as exc:
                errors[job_id] = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "evaluation.cloud_facts_unavailable",
                    extra={"run_id": run_id, "job_id": job_id, "error": errors[job_id]},
                )
                continue
            with services.uow.begin() as session:
                # Stamped with the sync it belongs to: a later sync makes it stale again.
                session.execute(
                    update(ScrapingJob)
                    .where(ScrapingJob.job_id == job_id, ScrapingJob.last_seen_at == seen_at)
                    .values(data_quality=quality, problematic_urls=urls, quality_checked_at=seen_at)
                )
                session.commit()
    return errors


def _decide(services: Services, run_id: str, errors: Mapping[int, str]) -> Evaluation:
    with services.uow.begin() as session:
        if services.uow.dialect == "postgresql":
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        now = services.clock()
        # The first statement writes, so it holds the run (and SQLite's write lock) throughout.
        touched = session.execute(update(Run).where(Run.run_id == run_id).values(updated_at=now))
        if not touched.rowcount:  # type: ignore[attr-defined]
            return Evaluation(run_id, "unknown", None)
        run = session.execute(select(Run).where(Run.run_id == run_id)).scalar_one()
        if run.dataset not in services.datasets.by_name:
            log.warning("evaluation.unconfigured", extra={"run_id": run_id, "dataset": run.dataset})
            return Evaluation(run_id, "unconfigured", run.state, run.revision)
        dataset = services.datasets.get(run.dataset)
        waiting = acceptance.waiting_for_tasks(_pending_tasks(session, run_id))
        if waiting is not None:
            if run.state in OPEN:
                run.state = "candidate"
                run.reasons = [waiting.as_dict()]
                run.evaluated_at = now
                session.commit()
            return Evaluation(
                run_id, "waiting", run.state, run.revision, reasons=(waiting.as_dict(),)
            )
        tallies, pending_rows = _tally(session, run_id, dataset)
        services.killpoints.reached("mid-evaluation")
        judgement = acceptance.judge(
            dataset,
            jobs=_job_facts(session, run_id, errors),
            imports=_import_facts(session, run_id),
            tallies=tallies,
            history=accepted_history(session, run, limit=dataset.quality.baseline_runs),
            run_id=run_id,
        )
        if judgement.state == acceptance.CANDIDATE:
            # Waiting for Cloud's data-quality result: evaluated_at stays, so the sweep retries.
            if run.state in OPEN:
                run.state = "candidate"
                run.reasons = [r.as_dict() for r in judgement.reasons]
                session.commit()
            return Evaluation(
                run_id,
                "waiting",
                run.state,
                run.revision,
                reasons=tuple(r.as_dict() for r in judgement.reasons),
            )
        result = _apply(session, run, dataset, judgement, pending_rows, now)
        session.commit()
        return result


def _apply(
    session: Session,
    run: Run,
    dataset: Dataset,
    judgement: Judgement,
    pending_rows: int,
    now: datetime,
) -> Evaluation:
    old_state = run.state
    old_verdicts = dict(
        session.execute(
            select(PartitionVerdict.partition, PartitionVerdict.state).where(
                PartitionVerdict.run_id == run.run_id
            )
        ).all()
    )
    new_verdicts = {
        p.partition: "passed" if p.passed else "quarantined" for p in judgement.partitions
    }
    was_accepted = old_state in ("accepted", "published")
    now_accepted = judgement.state == acceptance.ACCEPTED
    changed = (
        old_state not in DECIDED
        or was_accepted != now_accepted
        or old_verdicts != new_verdicts
        or pending_rows > 0
    )
    _write_partition_verdicts(session, run.run_id, judgement, now)
    _mark_observations(session, run.run_id, judgement)
    run.reasons = [r.as_dict() for r in judgement.reasons]
    run.evaluated_at = now
    events: list[str] = []
    if changed:
        run.revision += 1
        summary = _summary(run, judgement)
        if now_accepted:
            run.accepted_at = now
            if old_state != "published":
                run.state = "accepted"
            events.append(_announce(session, dataset, run, "run.accepted", summary, now))
            current = _current_publication(session, dataset.name)
            if _publishes(session, run, current):
                events.append(
                    _publish(
                        session,
                        dataset,
                        run,
                        records=judgement.counted_records,
                        previous=current,
                        now=now,
                    )
                )
        else:
            run.state = "rejected"
            events.append(_announce(session, dataset, run, "run.rejected", summary, now))
            events.extend(_withdraw(session, dataset, run, now))
    _keep_profile(session, run, judgement, now)
    outcome = run.state if changed else "unchanged"
    return Evaluation(
        run.run_id,
        outcome,
        run.state,
        run.revision,
        events=tuple(events),
        reasons=tuple(run.reasons),
        changed=changed,
    )


def _summary(run: Run, judgement: Judgement) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "dataset": run.dataset,
        "collection_window": run.collection_window,
        "revision": run.revision,
        "state": judgement.state,
        "records": judgement.counted_records,
        "partitions": {
            p.partition: {"state": "passed" if p.passed else "quarantined", "records": p.records}
            for p in judgement.partitions
        },
        "reasons": [r.as_dict() for r in judgement.reasons],
    }


def _announce(
    session: Session,
    dataset: Dataset,
    run: Run,
    event_type: str,
    payload: dict[str, Any],
    now: datetime,
) -> str:
    return outbox.write_event(
        session,
        event_type=event_type,
        run_id=run.run_id,
        dataset=dataset.name,
        revision=run.revision,
        payload=payload,
        destinations=[d.key for d in dataset.destinations],
        now=now,
    )


# --- reading the run ----------------------------------------------------------------------------


def _pending_tasks(session: Session, run_id: str) -> dict[str, str]:
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
    pending = {key: state for key, state in rows.items() if state != "committed"}
    pending.update({f"launch {batch}": state for batch, state in launching.items()})
    if not pending and "committed" not in rows.values():
        pending["first sync"] = "not synced"
    return pending


def _job_facts(session: Session, run_id: str, errors: Mapping[int, str]) -> list[JobFacts]:
    jobs = session.execute(
        select(ScrapingJob).where(ScrapingJob.run_id == run_id).order_by(ScrapingJob.job_id)
    ).scalars()
    recovery_urls = {
        batch: list(urls or [])
        for batch, urls in session.execute(
            select(Launch.batch_id, Launch.start_urls).where(
                Launch.run_id == run_id, Launch.kind == "rerun"
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


def _import_facts(session: Session, run_id: str) -> ImportFacts:
    """Counts of the latest committed attempt of each of the run's tasks."""
    keys = select(SyncTask.task_key).where(SyncTask.run_id == run_id).scalar_subquery()
    latest: dict[str, Attempt] = {}
    for attempt in session.execute(
        select(Attempt)
        .where(Attempt.task_key.in_(keys), Attempt.outcome == "committed")
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


def _tally(
    session: Session, run_id: str, dataset: Dataset
) -> tuple[dict[str, acceptance.PartitionTally], int]:
    """Stream the run's observations through the record rules; also count rows rewritten since
    the last verdict."""
    pending = 0

    def records() -> Iterator[tuple[str | None, dict[str, Any]]]:
        nonlocal pending
        stmt = (
            select(Observation.partition, Observation.payload, Observation.validation_state)
            .where(Observation.run_id == run_id)
            .execution_options(yield_per=2000)
        )
        for partition, payload, state in session.execute(stmt):
            if state == "pending":
                pending += 1
            yield partition, payload

    tallies = acceptance.tally_records(records(), acceptance.RecordRules.of(dataset))
    return tallies, pending


def accepted_history(session: Session, run: Run, *, limit: int) -> list[acceptance.Profile]:
    """The profiles of the dataset's last ``limit`` accepted runs begun before ``run``, newest
    first; rejected runs never count."""
    rows = session.execute(
        select(RunProfile)
        .join(Run, Run.run_id == RunProfile.run_id)
        .where(
            Run.dataset == run.dataset,
            Run.run_id != run.run_id,
            Run.state.in_(("accepted", "published")),
            Run.created_at < run.created_at,
        )
        .order_by(Run.created_at.desc(), Run.run_id.desc())
        .limit(limit)
    ).scalars()
    return [
        acceptance.Profile(
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


def _valid_records(session: Session, run_id: str) -> int:
    return int(
        session.execute(
            select(func.count()).where(
                Observation.run_id == run_id, Observation.validation_state == "valid"
            )
        ).scalar_one()
    )


# --- writing the verdict ------------------------------------------------------------------------


def _write_partition_verdicts(
    session: Session, run_id: str, judgement: Judgement, now: datetime
) -> None:
    session.execute(delete(PartitionVerdict).where(PartitionVerdict.run_id == run_id))
    for p in judgement.partitions:
        session.add(
            PartitionVerdict(
                run_id=run_id,
                partition=p.partition,
                state="passed" if p.passed else "quarantined",
                records=p.records,
                reasons=[r.as_dict() for r in p.reasons],
                evaluated_at=now,
            )
        )
    session.flush()


def _keep_profile(session: Session, run: Run, judgement: Judgement, now: datetime) -> None:
    """An accepted run's profile joins its dataset's history; a rejected run's leaves it."""
    profile = judgement.profile
    if judgement.state != acceptance.ACCEPTED or profile is None:
        session.execute(delete(RunProfile).where(RunProfile.run_id == run.run_id))
        return
    values = profile.as_dict()
    session.merge(
        RunProfile(
            run_id=run.run_id,
            dataset=run.dataset,
            revision=run.revision,
            records=profile.records,
            partitions=values["partitions"],
            fill_rates=values["fill_rates"],
            partition_fill_rates=values["partition_fill_rates"],
            fields=values["fields"],
            profiled_at=now,
        )
    )


def _in_partitions(names: list[str]) -> Any:
    named = [n for n in names if n != NO_PARTITION]
    conditions = [Observation.partition.in_(named)] if named else []
    if NO_PARTITION in names:
        conditions.append(Observation.partition.is_(None))
    return or_(*conditions) if conditions else None


def _mark_observations(session: Session, run_id: str, judgement: Judgement) -> None:
    """Quarantine the failed partitions' rows and mark the rest valid; rows this evaluation did
    not read (written by a sync since) are left alone: REPEATABLE READ refuses to touch them."""
    groups = {
        "quarantined": [p.partition for p in judgement.partitions if not p.passed],
        "valid": [p.partition for p in judgement.partitions if p.passed],
    }
    for state, names in groups.items():
        where = _in_partitions(names)
        if where is None:
            continue
        session.execute(
            update(Observation)
            .where(Observation.run_id == run_id, where, Observation.validation_state != state)
            .values(validation_state=state)
            .execution_options(synchronize_session=False)
        )


def _current_publication(session: Session, dataset: str) -> Publication | None:
    return session.execute(
        select(Publication).where(Publication.dataset == dataset, Publication.is_current)
    ).scalar_one_or_none()


def window_order(window: str) -> tuple[str, int | str]:
    """A collection window's place in time: ``job-N`` by job number, daily and weekly windows
    by their ISO text (which sorts by time within one kind)."""
    if window.startswith("job-") and window[4:].isdigit():
        return ("job", int(window[4:]))
    return ("weekly" if "-W" in window else "daily", window)


def _publishes(session: Session, run: Run, current: Publication | None) -> bool:
    """The pointer moves to an accepted run unless the published run is a later collection
    window (a repaired or late old run is accepted, and stays in history); windows of different
    kinds (the datasets file changed) are ordered by when their runs began."""
    if current is None or current.run_id == run.run_id:
        return True
    published = session.get(Run, current.run_id)
    if published is None:
        return True
    mine, theirs = window_order(run.collection_window), window_order(published.collection_window)
    if mine[0] == theirs[0] and mine != theirs:
        return mine > theirs
    return published.created_at <= run.created_at


def _publish(
    session: Session,
    dataset: Dataset,
    run: Run,
    *,
    records: int,
    previous: Publication | None,
    now: datetime,
    replacing: str | None = None,
) -> str:
    """Flip the dataset's published pointer to ``run`` and write the event that says so."""
    if previous is not None:
        session.execute(
            update(Publication)
            .where(Publication.id == previous.id)
            .values(is_current=False, superseded_at=now)
            .execution_options(synchronize_session=False)
        )
    event_id = outbox.event_id_for(run.run_id, "dataset.published", run.revision)
    session.add(
        Publication(
            dataset=dataset.name,
            run_id=run.run_id,
            is_current=True,
            published_at=now,
            event_id=event_id,
        )
    )
    session.flush()
    run.state = "published"
    run.published_at = now
    partitions = list(
        session.execute(
            select(PartitionVerdict.partition).where(
                PartitionVerdict.run_id == run.run_id, PartitionVerdict.state == "passed"
            )
        ).scalars()
    )
    return outbox.write_event(
        session,
        event_type="dataset.published",
        run_id=run.run_id,
        dataset=dataset.name,
        revision=run.revision,
        payload={
            "dataset": dataset.name,
            "run_id": run.run_id,
            "collection_window": run.collection_window,
            "revision": run.revision,
            "records": records,
            "partitions": sorted(partitions),
            "published_at": now.isoformat(),
            "previous_run_id": previous.run_id if previous is not None else None,
            **({"replacing": replacing} if replacing else {}),
        },
        destinations=[d.key for d in dataset.destinations],
        now=now,
    )


def _withdraw(session: Session, dataset: Dataset, run: Run, now: datetime) -> list[str]:
    """A published run that fails a later evaluation is no longer published: the pointer goes
    back to the newest other accepted run, or the dataset is announced withdrawn."""
    current = _current_publication(session, dataset.name)
    if current is None or current.run_id != run.run_id:
        return []
    fallback = session.execute(
        select(Run)
        .where(
            Run.dataset == dataset.name,
            Run.run_id != run.run_id,
            Run.state.in_(("accepted", "published")),
        )
        .order_by(Run.created_at.desc())
        .limit(1)
    ).scalar_one_or_none()
    if fallback is None:
        session.execute(
            update(Publication)
            .where(Publication.id == current.id)
            .values(is_current=False, superseded_at=now)
            .execution_options(synchronize_session=False)
        )
        return [
            outbox.write_event(
                session,
                event_type="dataset.withdrawn",
                run_id=run.run_id,
                dataset=dataset.name,
                revision=run.revision,
                payload={"dataset": dataset.name, "run_id": run.run_id, "revision": run.revision},
                destinations=[d.key for d in dataset.destinations],
                now=now,
            )
        ]
    fallback.revision += 1
    return [
        _publish(
            session,
            dataset,
            fallback,
            records=_valid_records(session, fallback.run_id),
            previous=current,
            now=now,
            replacing=run.run_id,
        )
    ]


# --- judging again without writing (``scrapesync check``) ---------------------------------------


@dataclass(frozen=True)
class Rejudgement:
    """A run judged again under some datasets file, with nothing written: the state it would
    take, every rule's check (got, baseline, allowed), the reasons and partition verdicts it
    would carry, and the accepted runs its baseline is made of."""

    run_id: str
    dataset: str
    current_state: str
    state: str
    checks: list[dict[str, Any]]
    reasons: list[dict[str, Any]]
    partitions: list[dict[str, Any]]
    baseline_runs: list[str]
    history_runs: int
    min_history: int
    profile: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        """The re-judgement as JSON-able values."""
        return {
            "run_id": self.run_id,
            "dataset": self.dataset,
            "current_state": self.current_state,
            "would_be": self.state,
            "baseline": {
                "runs": self.baseline_runs,
                "accepted_runs_before": self.history_runs,
                "min_history": self.min_history,
            },
            "checks": self.checks,
            "reasons": self.reasons,
            "partitions": self.partitions,
            "profile": self.profile,
        }


def rejudge(
    services: Services, run_id: str, datasets: Datasets | None = None
) -> Rejudgement | None:
    """Judge a run again from what the database holds (its observations, its jobs as last read
    from Cloud, its dataset's accepted history) under ``datasets`` (default: the deployment's),
    in a read-only transaction that is rolled back; None for an unknown run."""
    chosen = datasets if datasets is not None else services.datasets
    with services.uow.begin() as session:
        if services.uow.dialect == "postgresql":
            session.execute(text("SET TRANSACTION READ ONLY"))
        run = session.get(Run, run_id)
        if run is None:
            return None
        dataset = chosen.get(run.dataset)
        history = accepted_history(session, run, limit=dataset.quality.baseline_runs)
        waiting = acceptance.waiting_for_tasks(_pending_tasks(session, run_id))
        if waiting is not None:
            return Rejudgement(
                run_id=run.run_id,
                dataset=run.dataset,
                current_state=run.state,
                state=acceptance.CANDIDATE,
                checks=[],
                reasons=[waiting.as_dict()],
                partitions=[],
                baseline_runs=[],
                history_runs=len(history),
                min_history=dataset.quality.min_history,
                profile=None,
            )
        tallies, _ = _tally(session, run_id, dataset)
        judgement = acceptance.judge(
            dataset,
            jobs=_job_facts(session, run_id, {}),
            imports=_import_facts(session, run_id),
            tallies=tallies,
            history=history,
            run_id=run_id,
        )
        return Rejudgement(
            run_id=run.run_id,
            dataset=run.dataset,
            current_state=run.state,
            state=judgement.state,
            checks=[c.as_dict() for c in judgement.checks],
            reasons=[r.as_dict() for r in judgement.reasons],
            partitions=[
                {
                    "partition": p.partition,
                    "state": "passed" if p.passed else "quarantined",
                    "records": p.records,
                    "reasons": [r.as_dict() for r in p.reasons],
                }
                for p in judgement.partitions
            ],
            baseline_runs=list(judgement.baseline.run_ids) if judgement.baseline else [],
            history_runs=len(history),
            min_history=dataset.quality.min_history,
            profile=judgement.profile.as_dict() if judgement.profile is not None else None,
        )


# --- reading verdicts (status, export, sweeps) -------------------------------------------------


def published_run_id(session: Session, dataset: str) -> str | None:
    """The run the dataset's published pointer names, if any."""
    current = _current_publication(session, dataset)
    return current.run_id if current is not None else None


def read_verdict(session: Session, run_id: str) -> RunVerdict | None:
    """A run's verdict as plain values, read inside the caller's transaction."""
    run = session.get(Run, run_id)
    if run is None:
        return None
    partitions = session.execute(
        select(PartitionVerdict)
        .where(PartitionVerdict.run_id == run_id)
        .order_by(PartitionVerdict.partition)
    ).scalars()
    events = session.execute(
        select(OutboxEvent).where(OutboxEvent.run_id == run_id).order_by(OutboxEvent.id)
    ).scalars()
    return RunVerdict(
        run_id=run.run_id,
        dataset=run.dataset,
        collection_window=run.collection_window,
        state=run.state,
        revision=run.revision,
        reasons=list(run.reasons or []),
        partitions=[
            {
                "partition": p.partition,
                "state": p.state,
                "records": p.records,
                "reasons": list(p.reasons or []),
            }
            for p in partitions
        ],
        is_published=published_run_id(session, run.dataset) == run.run_id,
        evaluated_at=run.evaluated_at,
        accepted_at=run.accepted_at,
        published_at=run.published_at,
        events=[
            {
                "event_id": e.event_id,
                "type": e.event_type,
                "state": e.state,
                "attempts": e.attempts,
                "created_at": e.created_at,
                "last_error": e.last_error,
            }
            for e in events
        ],
    )


def run_verdict(services: Services, run_id: str) -> RunVerdict | None:
    """A run's verdict as plain values (for ``scrapesync status`` and ``/api/runs``)."""
    with services.uow.begin() as session:
        return read_verdict(session, run_id)


def runs_due_for_evaluation(session: Session, *, limit: int = 500) -> list[str]:
    """Runs with a sync committed after their last verdict (or none yet), and candidates
    waiting for Cloud's data-quality result."""
    t = SyncTask.__table__.c
    r = Run.__table__.c
    committed_since = session.execute(
        select(r.run_id)
        .join(SyncTask, t.run_id == r.run_id)
        .where(
            t.state == "committed",
            or_(r.evaluated_at.is_(None), t.updated_at > r.evaluated_at),
        )
        .distinct()
        .limit(limit)
    ).scalars()
    return sorted(set(committed_since))


def evaluation_job_id(run_id: str, suffix: str) -> str:
    """An RQ job id for evaluating ``run_id`` (``[A-Za-z0-9_-]`` whatever the run id holds)."""
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:16]
    return f"evaluate-{digest}-{suffix}"


def enqueue_evaluation(services: Services, run_id: str, *, suffix: str) -> bool:
    """Queue an evaluation of ``run_id``; a Redis failure is logged, the sweep finds it again."""
    try:
        return services.dispatcher.enqueue_call(
            "sync.jobs.evaluate_run", run_id, job_id=evaluation_job_id(run_id, suffix)
        )
    except Exception:  # the run's state in SQL says it is due; the sweep queues it again
        log.warning("evaluation.enqueue_failed", extra={"run_id": run_id}, exc_info=True)
        return False


def redrive(services: Services) -> int:
    """Queue an evaluation of every run that is due for one; returns how many were queued."""
    now = services.clock()
    bucket = int(now.timestamp() // services.settings.sweep_interval)
    with services.uow.begin() as session:
        due = runs_due_for_evaluation(session)
    return sum(enqueue_evaluation(services, run_id, suffix=f"s{bucket}") for run_id in due)
