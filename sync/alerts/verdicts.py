"""Alerts that a run's verdict raises or settles, written in the evaluating transaction: a run
rejected, partitions quarantined in an accepted run, and their recoveries (an accepted run also
ends a stale spell)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from config.datasets import Datasets
from sync.alerts import messages
from sync.alerts.conditions import AlertReason, fire, recover, watched
from sync.models import PartitionVerdict, Run
from sync.states import PartitionState, RunState

_WHAT = {
    AlertReason.RUN_REJECTED: "a rejected run",
    AlertReason.PARTITION_QUARANTINED: "quarantined partitions",
    AlertReason.STALE: "a stale spell",
}


def _partitions(session: Session, run_id: str) -> dict[str, dict[str, Any]]:
    rows = session.execute(
        select(PartitionVerdict.partition, PartitionVerdict.state, PartitionVerdict.records).where(
            PartitionVerdict.run_id == run_id
        )
    ).all()
    return {r.partition: {"state": r.state, "records": r.records} for r in rows}


def after_verdict(session: Session, datasets: Datasets, run: Run, now: datetime) -> int:
    """Tell the channels what a new verdict on ``run`` means; returns how many messages were
    written (in the caller's transaction)."""
    if not watched(datasets, run.dataset):
        return 0
    partitions = _partitions(session, run.run_id)
    if run.state == RunState.REJECTED:
        notice = messages.run_rejected(
            run.dataset,
            run.run_id,
            revision=run.revision,
            reasons=list(run.reasons or []),
            partitions=partitions,
        )
        return fire(
            session,
            datasets,
            dataset=run.dataset,
            reason=AlertReason.RUN_REJECTED,
            notice=notice,
            now=now,
        )
    if run.state not in (RunState.ACCEPTED, RunState.PUBLISHED):
        return 0
    written = 0
    records = sum(
        int(v["records"] or 0) for v in partitions.values() if v["state"] == PartitionState.PASSED
    )
    quarantined = any(v["state"] == PartitionState.QUARANTINED for v in partitions.values())
    if quarantined:
        written += fire(
            session,
            datasets,
            dataset=run.dataset,
            reason=AlertReason.PARTITION_QUARANTINED,
            notice=messages.partitions_quarantined(run.dataset, run.run_id, partitions=partitions),
            now=now,
        )
    settled = [AlertReason.RUN_REJECTED, AlertReason.STALE]
    if not quarantined:
        settled.append(AlertReason.PARTITION_QUARANTINED)
    for reason in settled:
        written += recover(
            session,
            datasets,
            dataset=run.dataset,
            reason=reason,
            notice=messages.run_accepted(
                run.dataset, run.run_id, records=records, what=_WHAT[reason]
            ),
            now=now,
        )
    return written
