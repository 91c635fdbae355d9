"""Judging a run again without writing anything (``scrapesync check``): what it would become
under some datasets file, and every rule's figures, from what the database holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from config.datasets import Datasets
from sync.acceptance.facts import ACCEPTED, CANDIDATE
from sync.acceptance.history import baseline_of
from sync.acceptance.verdict import judge, waiting_for_tasks
from sync.bootstrap import Services
from sync.models import Run
from sync.runs import diagnosis, evidence
from sync.states import PartitionState


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
    # what most likely broke and what to run next, when it would not be accepted
    diagnosis: dict[str, Any] | None = None

    def baseline_line(self) -> str:
        """What the run was held against, as ``scrapesync check`` says it."""
        if len(self.baseline_runs) == 1 and self.history_runs < self.min_history:
            return (
                f"baseline: the last accepted run, {self.baseline_runs[0]} ({self.history_runs} "
                f"accepted run(s) before this one; the median from {self.min_history} on)"
            )
        if self.baseline_runs:
            return f"baseline: the median of {len(self.baseline_runs)} accepted run(s): " + (
                ", ".join(self.baseline_runs)
            )
        return (
            f"baseline: none ({self.history_runs} accepted run(s) before this one; the history "
            f"rules wait for {self.min_history})"
        )

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
            "diagnosis": self.diagnosis,
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
        history = evidence.accepted_history(session, run, limit=dataset.quality.baseline_runs)
        waiting = waiting_for_tasks(evidence.pending_tasks(session, run_id))
        if waiting is not None:  # not judged yet, but held against the same baseline then
            baseline = baseline_of(history, dataset.quality)
            return Rejudgement(
                run_id=run.run_id,
                dataset=run.dataset,
                current_state=run.state,
                state=CANDIDATE,
                checks=[],
                reasons=[waiting.as_dict()],
                partitions=[],
                baseline_runs=list(baseline.run_ids) if baseline is not None else [],
                history_runs=len(history),
                min_history=dataset.quality.min_history,
                profile=None,
            )
        tallies, _ = evidence.tally(session, run_id, dataset, keep=False)
        judgement = judge(
            dataset,
            jobs=evidence.job_facts(session, run_id, {}),
            imports=evidence.import_facts(session, run_id),
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
                    "state": PartitionState.PASSED if p.passed else PartitionState.QUARANTINED,
                    "records": p.records,
                    "reasons": [r.as_dict() for r in p.reasons],
                }
                for p in judgement.partitions
            ],
            baseline_runs=list(judgement.baseline.run_ids) if judgement.baseline else [],
            history_runs=len(history),
            min_history=dataset.quality.min_history,
            profile=judgement.profile.as_dict() if judgement.profile is not None else None,
            diagnosis=(
                diagnosis.with_selectors_of(
                    diagnosis.of(session, run, dataset, judgement), run.diagnosis
                )
                if judgement.state != ACCEPTED
                else None
            ),
        )
