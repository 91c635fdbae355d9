"""An operator's decision applied to a verdict: the rules still judge the run (their reasons are
kept), and the decision says what becomes of it. Every evaluation of a decided run applies it
again, so new data for the run is judged and reported but never overturns the decision."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from sync.acceptance.facts import ACCEPTED, NOTE, REJECTED, Judgement, PartitionJudgement, Reason
from sync.states import Decision

OPERATOR = "operator"
RULES = "rules"


def decided(
    judgement: Judgement, decision: str | None, reason: str | None, at: datetime | None
) -> Judgement:
    """``judgement`` as the operator's decision makes it: accepted with every partition passed
    (the rules' reasons kept as overridden), or rejected with the operator's reason first."""
    if decision == Decision.ACCEPT:
        overridden = [r.as_dict() for r in judgement.reasons]
        for p in judgement.partitions:
            overridden.extend(r.as_dict() for r in p.reasons)
        note = Reason(
            "operator_accepted",
            f"accepted by the operator{_when(at)}: {reason or 'no reason given'}",
            detail={
                "kind": NOTE,
                "decided_by": OPERATOR,
                "reason": reason,
                "overridden": overridden,
            },
        )
        partitions = tuple(
            PartitionJudgement(p.partition, p.records, ()) for p in judgement.partitions
        )
        return replace(
            judgement,
            state=ACCEPTED,
            reasons=(note,),
            partitions=partitions,
            counted_records=sum(p.records for p in partitions),
        )
    if decision == Decision.REJECT:
        first = Reason(
            "operator_rejected",
            f"rejected by the operator{_when(at)}: {reason or 'no reason given'}",
            detail={"decided_by": OPERATOR, "reason": reason},
        )
        return replace(judgement, state=REJECTED, reasons=(first, *judgement.reasons))
    return judgement


def cancelled_reason(reason: str | None, at: datetime | None) -> Reason:
    """Why a cancelled run is no longer waited for."""
    return Reason(
        "operator_cancelled",
        f"cancelled by the operator{_when(at)}: {reason or 'no reason given'}",
        detail={"decided_by": OPERATOR, "reason": reason},
    )


def _when(at: datetime | None) -> str:
    return f" at {at:%Y-%m-%d %H:%M} UTC" if at is not None else ""
