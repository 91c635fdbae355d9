"""The rows a verdict writes inside the evaluating transaction: the partition verdicts, the data
version whose rows they judge, the run's profile, and the outbox events that announce it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import outbox
from sync.acceptance.decisions import OPERATOR, RULES
from sync.acceptance.facts import ACCEPTED, Judgement
from sync.models import PartitionVerdict, Run, RunProfile
from sync.runs import shapes
from sync.states import PartitionState, ValidationState


def summary(run: Run, judgement: Judgement) -> dict[str, Any]:
    """What ``run.accepted`` and ``run.rejected`` carry: the verdict, its figures and reasons,
    who decided (``operator`` or ``rules``) and, for an operator, why and when."""
    return {
        **decided_by(run),
        "run_id": run.run_id,
        "dataset": run.dataset,
        "collection_window": run.collection_window,
        "revision": run.revision,
        "state": judgement.state,
        "records": judgement.counted_records,
        "partitions": {
            p.partition: {
                "state": PartitionState.PASSED if p.passed else PartitionState.QUARANTINED,
                "records": p.records,
            }
            for p in judgement.partitions
        },
        "reasons": [r.as_dict() for r in judgement.reasons],
        **({"diagnosis": run.diagnosis} if run.diagnosis and judgement.state != ACCEPTED else {}),
    }


def decided_by(run: Run) -> dict[str, Any]:
    """Who gave the run its verdict, and the operator's reason and time if it was one."""
    if run.decided_by != OPERATOR:
        return {"decided_by": RULES}
    return {
        "decided_by": OPERATOR,
        "decision": run.decision,
        "reason": run.decision_reason,
        "decided_at": run.decided_at.isoformat() if run.decided_at is not None else None,
    }


def announce(
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


# --- writing the verdict ------------------------------------------------------------------------


def write_partition_verdicts(
    session: Session, run_id: str, judgement: Judgement, now: datetime
) -> None:
    session.execute(delete(PartitionVerdict).where(PartitionVerdict.run_id == run_id))
    for p in judgement.partitions:
        session.add(
            PartitionVerdict(
                run_id=run_id,
                partition=p.partition,
                state=PartitionState.PASSED if p.passed else PartitionState.QUARANTINED,
                records=p.records,
                reasons=[r.as_dict() for r in p.reasons],
                evaluated_at=now,
            )
        )
    session.flush()


def keep_profile(session: Session, run: Run, judgement: Judgement, now: datetime) -> None:
    """An accepted run's profile joins its dataset's history; a rejected run's leaves it."""
    profile = judgement.profile
    if judgement.state != ACCEPTED or profile is None:
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


def row_states(judgement: Judgement) -> dict[str, str]:
    """The state the rows of each judged partition take: valid, or quarantined."""
    return {
        p.partition: ValidationState.VALID if p.passed else ValidationState.QUARANTINED
        for p in judgement.partitions
    }


def judge_rows(session: Session, run: Run) -> None:
    """Give the run's rows the verdict whose partition verdicts this transaction wrote: every
    row of its snapshot (the data version it read) takes its partition's, and rows a sync
    writes after it stay pending (:mod:`sync.acceptance.row_states`); no row is written but the
    shapes this evaluation found (:func:`shapes.apply`)."""
    shapes.apply(session)
    run.judged_version = run.data_version  # read in this transaction's snapshot
    session.flush()  # the publication's statements read it
