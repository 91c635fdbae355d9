"""Evaluating, accepting and publishing runs.

After a sync commits, its run is evaluated. Cloud's data-quality result and problematic URLs of the
run's finished jobs are fetched first, outside any transaction, for the jobs whose syncs did not
bring them (a sync asks for them beside its download: :mod:`sync.ingest.cloud_facts`). Then ONE
transaction reads the run's tasks, jobs and observations (streamed, a few thousand rows at a time,
into per partition tallies that also give the run's profile) and the profiles of the dataset's last
accepted runs (read by :mod:`sync.runs.evidence`), judges them with the pure rules of
:mod:`sync.acceptance`, and writes everything the verdict changes: partition verdicts, quarantined
observations, the run's state, reasons and revision, its profile (kept while it is accepted), the
dataset's published pointer (moved by :mod:`sync.runs.publication`), and the outbox events that
announce it. Until that commit the previously published run stays published, readable in full.

Repeat-safety: a run's ``revision`` goes up only when its verdict or its data changed (a new
state, another set of passing partitions, or observations rewritten since the last verdict);
event ids are derived from run id, event type and revision, so evaluating twice never announces
one change twice. On PostgreSQL the transaction runs at REPEATABLE READ and holds the run from
its first statement: the verdict judges the rows of the data version its snapshot read, and a
sync that commits meanwhile waits for it and makes a later version, whose rows stay pending
until the next verdict (:mod:`sync.acceptance.row_states`); a write that got in the way of this
one (another evaluation's) makes it retry.

One evaluation per change: each committed import of a run counts up its ``data_version``, and a
verdict records the version it judged (``evaluated_version``). A run is due for evaluation when
its syncs have all committed and its data changed since its verdict; an evaluation asked for
otherwise leaves at once, unless forced (the operator's own re-judgement). At most one
evaluation of a run runs at a time (an advisory lock); another leaves as ``busy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import db, logs
from sync.acceptance.decisions import cancelled_reason, decided
from sync.acceptance.facts import ACCEPTED, CANDIDATE, Judgement
from sync.acceptance.verdict import judge, waiting_for_tasks
from sync.alerts.verdicts import after_verdict
from sync.bootstrap import Services
from sync.cloud.errors import CloudError
from sync.datasets import schema
from sync.ingest import cloud_facts
from sync.models import PartitionVerdict, Run, ScrapingJob
from sync.queue import evaluation_job_id
from sync.runs import diagnosis, evidence, publication, quarantine, shapes, verdict_rows
from sync.runs.shapes import PENDING, RowStates
from sync.states import Decision, EvaluationOutcome, EventType, PartitionState, RunState

log = logs.get("runs")

DECIDED = (RunState.ACCEPTED, RunState.PUBLISHED, RunState.REJECTED)
SETTLED = (*DECIDED, *quarantine.HELD)
OPEN = (RunState.COLLECTING, RunState.CANDIDATE)
CONFLICT_RETRIES = 5
# a serialization failure, a deadlock, a lock not granted in time (a column being added)
_RETRYABLE_SQLSTATES = ("40001", "40P01", "55P03")

_LOCK_SPACE = 0x5C5E  # the advisory locks' first key: scrapesync's evaluations


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation of a run did."""

    run_id: str
    outcome: str
    state: str | None
    revision: int = 0
    events: tuple[str, ...] = ()
    reasons: tuple[dict[str, Any], ...] = ()


# --- the use case -------------------------------------------------------------------------------


def evaluate_run(services: Services, run_id: str, *, force: bool = False) -> Evaluation:
    """Judge a run and write its verdict, publication and outbox events in one transaction. At
    most one evaluation of a run runs at a time: another one leaves at once, as ``busy``; one
    that finds the run's data judged as it stands leaves as ``unchanged`` unless ``force``."""
    with db.alone(services.uow, _LOCK_SPACE, run_id) as alone:
        if not alone:
            log.info("evaluation.busy", extra={"run_id": run_id})
            return Evaluation(run_id, EvaluationOutcome.BUSY, None)
        if not force:
            judged = _already_judged(services, run_id)
            if judged is not None:
                return judged
            held = quarantine.held(services, run_id)
            if held is not None:
                return Evaluation(
                    run_id,
                    EvaluationOutcome.UNCHANGED,
                    held.state,
                    held.revision,
                    reasons=held.reasons,
                )
        try:
            return _evaluate(services, run_id)
        except Exception as exc:
            if not quarantine.counts_against_the_run(exc):
                raise
            stopped = quarantine.record_failure(services, run_id, exc)
            if stopped is None:
                raise
            return Evaluation(
                run_id,
                EvaluationOutcome.QUARANTINED,
                stopped.state,
                stopped.revision,
                reasons=stopped.reasons,
            )


def _already_judged(services: Services, run_id: str) -> Evaluation | None:
    """The run's verdict, when it was given on the data the run holds now."""
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        if run is None or run.state not in SETTLED or run.evaluated_version != run.data_version:
            return None
        return Evaluation(
            run_id, EvaluationOutcome.UNCHANGED, run.state, run.revision, reasons=tuple(run.reasons)
        )


def _evaluate(services: Services, run_id: str) -> Evaluation:
    _ensure_tables(services, run_id)
    errors = _refresh_cloud_facts(services, run_id)
    for attempt in range(1, CONFLICT_RETRIES + 1):
        try:
            result = _decide(services, run_id, errors, retry=attempt > 1)
            break
        except (OperationalError, IntegrityError) as exc:
            if attempt == CONFLICT_RETRIES or not _is_conflict(exc):
                raise
            log.info("evaluation.conflict", extra={"run_id": run_id, "attempt": attempt})
    # logged as soon as the verdict is committed: what follows talks to Redis and may fail or be
    # killed, and the verdict stands (an evaluation after it finds the run unchanged)
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
    services.killpoints.reached("after-acceptance")
    if result.state == RunState.REJECTED:
        diagnosis.add_selectors(services, run_id)
    for event_id in result.events:
        services.dispatcher.delivery(event_id)
    if result.events and services.datasets.alerts:
        services.dispatcher.alerts(suffix=evaluation_job_id(run_id, f"r{result.revision}"))
    return result


def _ensure_tables(services: Services, run_id: str) -> None:
    """Create the run's dataset tables, if missing, before the evaluating transaction needs them."""
    with services.uow.begin() as session:
        dataset_name = session.execute(
            select(Run.dataset).where(Run.run_id == run_id)
        ).scalar_one_or_none()
    if dataset_name is not None and dataset_name in services.datasets.by_name:
        schema.ensure_tables(
            services.uow, services.datasets.get(dataset_name), services.settings.data_schema
        )


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
        if evidence.pending_tasks(session, run_id):
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
                facts = cloud_facts.fetch(cloud, dataset, job_id, problems=problems)
            except CloudError as exc:
                errors[job_id] = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "evaluation.cloud_facts_unavailable",
                    extra={"run_id": run_id, "job_id": job_id, "error": errors[job_id]},
                )
                continue
            with services.uow.begin() as session:
                # Stamped with the sync it belongs to: a later sync makes it stale again.
                cloud_facts.store(session, job_id, facts, seen_at=seen_at)
                session.commit()
    return errors


def _decide(
    services: Services, run_id: str, errors: Mapping[int, str], *, retry: bool = False
) -> Evaluation:
    """Judge the run and write its verdict (``retry``: after a write to its rows got in the way)."""
    with services.uow.begin() as session:
        if services.uow.dialect == "postgresql":
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        now = services.clock()
        # The first statement writes, so it holds the run (and SQLite's write lock) throughout.
        touched = session.execute(update(Run).where(Run.run_id == run_id).values(updated_at=now))
        if not touched.rowcount:  # type: ignore[attr-defined]
            return Evaluation(run_id, EvaluationOutcome.UNKNOWN, None)
        run = session.execute(select(Run).where(Run.run_id == run_id)).scalar_one()
        if run.dataset not in services.datasets.by_name:
            log.warning("evaluation.unconfigured", extra={"run_id": run_id, "dataset": run.dataset})
            return Evaluation(run_id, EvaluationOutcome.UNCONFIGURED, run.state, run.revision)
        dataset = services.datasets.get(run.dataset)
        if run.decision == Decision.CANCEL:
            result = _cancel(session, run, dataset, now, schema=services.settings.data_schema)
            session.commit()
            return result
        waiting = waiting_for_tasks(evidence.pending_tasks(session, run_id))
        if waiting is not None:
            if run.state in OPEN:
                run.state = RunState.CANDIDATE
                run.reasons = [waiting.as_dict()]
                run.evaluated_at = now
                session.commit()
            return Evaluation(
                run_id,
                EvaluationOutcome.WAITING,
                run.state,
                run.revision,
                reasons=(waiting.as_dict(),),
            )
        # a run judged before keeps the ids of the rows written since, for its publication;
        # the run is counted from the groups its imports kept, when they hold (not on a retry)
        kept = None if retry else shapes.kept_groups(run)
        pending = run.evaluated_at is not None
        tallies, states = evidence.tally(
            session, run_id, dataset, keep_pending=pending, kept=kept, version=run.data_version
        )
        services.killpoints.reached("mid-evaluation")
        judgement = judge(
            dataset,
            jobs=evidence.job_facts(session, run_id, errors),
            imports=evidence.import_facts(session, run_id),
            tallies=tallies,
            history=evidence.accepted_history(session, run, limit=dataset.quality.baseline_runs),
            run_id=run_id,
        )
        judgement = decided(judgement, run.decision, run.decision_reason, run.decided_at)
        if judgement.state == CANDIDATE:
            # Waiting for Cloud's data-quality result: evaluated_at stays, so the sweep retries.
            if run.state in OPEN:
                run.state = RunState.CANDIDATE
                run.reasons = [r.as_dict() for r in judgement.reasons]
                session.commit()
            return Evaluation(
                run_id,
                EvaluationOutcome.WAITING,
                run.state,
                run.revision,
                reasons=tuple(r.as_dict() for r in judgement.reasons),
            )
        result = _apply(
            session,
            run,
            dataset,
            judgement,
            states,
            now,
            schema=services.settings.data_schema,
        )
        if result.events:  # a new verdict: the alert channels hear of it in this transaction
            after_verdict(session, services.datasets, run, now)
        session.commit()
        return result


def _apply(
    session: Session,
    run: Run,
    dataset: Dataset,
    judgement: Judgement,
    states: RowStates,
    now: datetime,
    *,
    schema: str,
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
        p.partition: PartitionState.PASSED if p.passed else PartitionState.QUARANTINED
        for p in judgement.partitions
    }
    was_accepted = old_state in (RunState.ACCEPTED, RunState.PUBLISHED)
    now_accepted = judgement.state == ACCEPTED
    changed = (
        old_state not in DECIDED
        or was_accepted != now_accepted
        or old_verdicts != new_verdicts
        or states.pending > 0
    )
    verdict_rows.write_partition_verdicts(session, run.run_id, judgement, now)
    verdict_rows.judge_rows(session, run)
    run.reasons = [r.as_dict() for r in judgement.reasons]
    run.evaluated_at = now
    run.evaluated_version = run.data_version  # read in this transaction's snapshot
    run.evaluation_failures = 0
    run.diagnosis = diagnosis.kept(session, run, dataset, judgement)
    events: list[str] = []
    if changed:
        run.revision += 1
        summary = verdict_rows.summary(run, judgement)
        if now_accepted:
            run.accepted_at = now
            if old_state != RunState.PUBLISHED:
                run.state = RunState.ACCEPTED
            events.append(
                verdict_rows.announce(session, dataset, run, EventType.RUN_ACCEPTED, summary, now)
            )
            events.extend(_publish(session, run, dataset, judgement, states, now, schema))
        else:
            run.state = RunState.REJECTED
            events.append(
                verdict_rows.announce(session, dataset, run, EventType.RUN_REJECTED, summary, now)
            )
            events.extend(publication.withdraw(session, dataset, run, now, schema=schema))
    verdict_rows.keep_profile(session, run, judgement, now)
    outcome = run.state if changed else EvaluationOutcome.UNCHANGED
    return Evaluation(
        run.run_id,
        outcome,
        run.state,
        run.revision,
        events=tuple(events),
        reasons=tuple(run.reasons),
    )


def _publish(
    session: Session,
    run: Run,
    dataset: Dataset,
    judgement: Judgement,
    states: RowStates,
    now: datetime,
    schema: str,
) -> list[str]:
    """Publish the accepted run unless a later window is published; the events written."""
    current = publication.current_publication(session, dataset.name)
    if not publication.publishes(session, run, current):
        return []
    marks = verdict_rows.row_states(judgement)
    # published already, and no row but those written since turned: only they can differ
    # from the dataset's table
    again = current is not None and current.run_id == run.run_id
    return publication.publish(
        session,
        dataset,
        run,
        records=judgement.counted_records,
        previous=current,
        now=now,
        schema=schema,
        fields=_published_fields(judgement),
        valid_rows=states.valid_after(marks),
        pending_ids=PENDING if again and states.only_pending_turn(marks) else None,
    )


def _published_fields(judgement: Judgement) -> set[str] | None:
    """Every field of the records of the partitions the judgement passed (filled or not), as
    its tallies found them."""
    if judgement.profile is None:
        return None
    rates = judgement.profile.partition_fill_rates
    return {name for p in judgement.partitions if p.passed for name in rates.get(p.partition, {})}


def _cancel(
    session: Session, run: Run, dataset: Dataset, now: datetime, *, schema: str
) -> Evaluation:
    """An operator stopped waiting for the run: it is ``cancelled``, announced so once, and
    withdrawn if it was published (the pointer falls back to the last accepted run)."""
    run.evaluated_at = now
    run.evaluated_version = run.data_version
    if run.state == RunState.CANCELLED:
        return Evaluation(run.run_id, EvaluationOutcome.UNCHANGED, run.state, run.revision)
    run.state = RunState.CANCELLED
    run.reasons = [cancelled_reason(run.decision_reason, run.decided_at).as_dict()]
    run.diagnosis = None  # a rejection's next steps (accept, rerun) no longer apply to it
    run.revision += 1
    payload = {
        **verdict_rows.decided_by(run),
        "run_id": run.run_id,
        "dataset": run.dataset,
        "collection_window": run.collection_window,
        "revision": run.revision,
        "state": run.state,
        "reasons": run.reasons,
    }
    events = [verdict_rows.announce(session, dataset, run, EventType.RUN_CANCELLED, payload, now)]
    events.extend(publication.withdraw(session, dataset, run, now, schema=schema))
    verdict_rows.keep_profile(session, run, _NO_PROFILE, now)
    return Evaluation(
        run.run_id,
        run.state,
        run.state,
        run.revision,
        events=tuple(events),
        reasons=tuple(run.reasons),
    )


_NO_PROFILE = Judgement(state=RunState.CANCELLED, reasons=(), partitions=(), counted_records=0)
