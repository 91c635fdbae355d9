"""An operator's decisions, recorded like verdicts: ``accept`` publishes a run the rules did not
accept, ``reject`` withdraws one (the pointer falls back to the last accepted run), ``cancel``
stops waiting for a run that will never complete, and ``baseline reset`` makes the history rules
compare only against runs begun after it.

A decision on a run is written on the run (who, what, why, when) and in ``operator_decisions``
in one transaction that also marks the run due for evaluation; the evaluation then applies it
through the same publication, typed-table and outbox path as an automatic verdict
(:mod:`sync.runs.evaluation`), so a crash between the two leaves a run the sweep evaluates
again. Every later evaluation of the run applies the decision again: new data is judged and its
reasons kept, but never overturns it. Repeating a decision changes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from sync import logs, outbox
from sync.acceptance.decisions import OPERATOR
from sync.bootstrap import Services
from sync.models import OperatorDecision, Run
from sync.runs import evaluation
from sync.states import Decision, EvaluationOutcome, EventType, RunState

log = logs.get("runs")

BUSY_TRIES = 20  # an evaluation under way ends in moments; the decision waits for it

# the states each decision may be taken in (repeating it is always allowed)
ALLOWED = {
    Decision.ACCEPT: (
        RunState.REJECTED,
        RunState.QUARANTINED,
        RunState.CANDIDATE,
        RunState.ACCEPTED,
        RunState.PUBLISHED,
    ),
    Decision.REJECT: (
        RunState.ACCEPTED,
        RunState.PUBLISHED,
        RunState.REJECTED,
        RunState.QUARANTINED,
        RunState.CANDIDATE,
    ),
    Decision.CANCEL: (
        RunState.COLLECTING,
        RunState.CANDIDATE,
        RunState.REJECTED,
        RunState.QUARANTINED,
    ),
}


class DecisionError(Exception):
    """A decision that cannot be taken: an unknown run or dataset, or a run in a state the
    decision does not apply to."""


@dataclass(frozen=True)
class Decided:
    """What one decision did: whether it was new, the run's state after it and the events
    that announce it."""

    action: str
    dataset: str
    run_id: str | None
    changed: bool
    state: str | None
    reason: str | None
    decided_at: datetime
    events: tuple[str, ...] = ()
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The decision as JSON-able values."""
        return {
            "action": self.action,
            "dataset": self.dataset,
            "run_id": self.run_id,
            "changed": self.changed,
            "state": self.state,
            "decided_by": OPERATOR,
            "reason": self.reason,
            "decided_at": self.decided_at.isoformat(),
            "events": list(self.events),
            "note": self.note,
        }


def decide(services: Services, run_id: str, action: str, reason: str | None) -> Decided:
    """Record the operator's ``action`` (accept, reject, cancel) on a run and apply it."""
    now = services.clock()
    with services.uow.begin() as session:
        run = session.execute(select(Run).where(Run.run_id == run_id)).scalar_one_or_none()
        if run is None:
            raise DecisionError(f"no run {run_id!r}")
        if run.dataset not in services.datasets.by_name:
            raise DecisionError(
                f"run {run_id!r} is of dataset {run.dataset!r}, not in the datasets file"
            )
        dataset = run.dataset
        repeated = run.decision == action and run.decided_by == OPERATOR
        if not repeated and run.state not in ALLOWED[Decision(action)]:
            raise DecisionError(_refusal(run, action))
        if repeated:
            decided_at = run.decided_at or now
            reason = run.decision_reason
        else:
            decided_at = now
            run.decision, run.decided_by = action, OPERATOR
            run.decision_reason, run.decided_at = reason, now
            run.evaluated_version = None  # due: the sweep applies it should this process stop
            session.add(
                OperatorDecision(
                    dataset=dataset, run_id=run_id, action=action, reason=reason, decided_at=now
                )
            )
            session.commit()
    log.info("run.decided", extra={"run_id": run_id, "action": action, "repeated": repeated})
    result = _apply(services, run_id)
    note = ""
    if result.outcome == EvaluationOutcome.WAITING:
        note = "the run still waits for its syncs; the decision applies when they commit"
    elif result.state == RunState.QUARANTINED:
        note = "its evaluation still fails, so the decision could not apply: it stays quarantined"
    elif result.outcome == EvaluationOutcome.BUSY:
        note = "another evaluation of the run holds it; the next sweep applies the decision"
    return Decided(
        action=action,
        dataset=dataset,
        run_id=run_id,
        changed=not repeated,
        state=result.state,
        reason=reason,
        decided_at=decided_at,
        events=result.events,
        note=note,
    )


def _apply(services: Services, run_id: str) -> evaluation.Evaluation:
    """Evaluate the run with its decision, waiting a little for an evaluation under way."""
    result = evaluation.evaluate_run(services, run_id)
    for _ in range(BUSY_TRIES):
        if result.outcome != EvaluationOutcome.BUSY:
            break
        time.sleep(0.25)
        result = evaluation.evaluate_run(services, run_id)
    return result


def _refusal(run: Run, action: str) -> str:
    if action == Decision.CANCEL and run.state in (RunState.ACCEPTED, RunState.PUBLISHED):
        return (
            f"run {run.run_id} is {run.state}: cancel stops waiting for a run that will never "
            f"complete; to withdraw it use: scrapesync reject {run.run_id} --reason TEXT"
        )
    return f"run {run.run_id} is {run.state}: it cannot be {action}ed"


def reset_baseline(services: Services, dataset_name: str, reason: str | None) -> Decided:
    """From the next run on, the dataset's history rules compare only against runs begun after
    now; a reset with no run begun since the last one is that same reset."""
    if dataset_name not in services.datasets.by_name:
        raise DecisionError(f"no dataset {dataset_name!r} in the datasets file")
    dataset = services.datasets.get(dataset_name)
    now = services.clock()
    with services.uow.begin() as session:
        last = session.execute(
            select(OperatorDecision)
            .where(
                OperatorDecision.dataset == dataset_name,
                OperatorDecision.action == Decision.BASELINE_RESET,
            )
            .order_by(OperatorDecision.decided_at.desc(), OperatorDecision.id.desc())
            .limit(1)
        ).scalar_one_or_none()
        newest_run = session.execute(
            select(func.max(Run.created_at)).where(Run.dataset == dataset_name)
        ).scalar_one()
        if last is not None and (newest_run is None or newest_run <= last.decided_at):
            return Decided(
                Decision.BASELINE_RESET,
                dataset_name,
                None,
                changed=False,
                state=None,
                reason=last.reason,
                decided_at=last.decided_at,
                note="no run began since the last reset",
            )
        row = OperatorDecision(
            dataset=dataset_name, action=Decision.BASELINE_RESET, reason=reason, decided_at=now
        )
        session.add(row)
        session.flush()
        event = outbox.write_event(
            session,
            event_type=EventType.DATASET_BASELINE_RESET,
            run_id=f"baseline-reset:{dataset_name}",
            dataset=dataset_name,
            revision=row.id,
            payload={
                "dataset": dataset_name,
                "decided_by": OPERATOR,
                "reason": reason,
                "decided_at": now.isoformat(),
            },
            destinations=[d.key for d in dataset.destinations],
            now=now,
        )
        session.commit()
    services.dispatcher.delivery(event)
    log.info("dataset.baseline_reset", extra={"dataset": dataset_name})
    return Decided(
        Decision.BASELINE_RESET,
        dataset_name,
        None,
        changed=True,
        state=None,
        reason=reason,
        decided_at=now,
        events=(event,),
    )
