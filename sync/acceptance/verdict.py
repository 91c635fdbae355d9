"""The verdict on a run: every rule applied, partitions quarantined, and the run accepted,
rejected, or left a candidate while it waits for its syncs or Cloud's data-quality result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from config.datasets import Dataset, Quality
from sync.acceptance.checks import absolute_checks
from sync.acceptance.facts import (
    ACCEPTED,
    CANDIDATE,
    REJECTED,
    WAITING,
    Baseline,
    Check,
    ImportFacts,
    JobFacts,
    Judgement,
    PartitionJudgement,
    PartitionTally,
    Profile,
    Reason,
)
from sync.acceptance.history import (
    baseline_of,
    fill_rate_checks,
    missing_field_checks,
    new_fields_note,
    partition_drop_checks,
    profile_of,
    record_drop_check,
)
from sync.acceptance.rules import (
    cloud_quality_reasons,
    duplicate_reasons,
    entity_key_reasons,
    invalid_partition_reasons,
    invalid_record_reasons,
    job_status_reasons,
    page_counter_reasons,
    partition_reasons,
    record_count_reasons,
)


def is_waiting(reason: Reason) -> bool:
    """Whether a reason says what the run waits for rather than what is wrong with it."""
    return reason.detail.get("kind") == WAITING


def judge(
    dataset: Dataset,
    *,
    jobs: Sequence[JobFacts],
    imports: ImportFacts,
    tallies: Mapping[str, PartitionTally],
    history: Sequence[Profile] = (),
    run_id: str | None = None,
) -> Judgement:
    """The verdict on a run whose tasks are all committed; ``history`` holds the profiles of
    the dataset's accepted runs before it, newest first."""
    quality = dataset.quality
    profile = profile_of(tallies, run_id)
    baseline = baseline_of(history, quality)
    against = _against_history(profile, baseline, quality)
    partitions = _partitions(tallies, imports, against.partition_checks, quality)
    failed = [p for p in partitions if not p.passed]
    counted_names = _counted_partitions(partitions, dataset.policy)
    counted = sum(p.records for p in partitions if p.partition in counted_names)
    drop = _record_drop(counted, counted_names, baseline, quality)
    cloud = cloud_quality_reasons(jobs, quality)
    waiting = [r for r in cloud if is_waiting(r)]
    run_reasons = _run_reasons(
        jobs, imports, quality, cloud=cloud, counted=counted, drop=drop, checks=against.run_checks
    )
    state = _state(dataset.policy, run_reasons, failed, partitions, waiting)
    every_failure = [*run_reasons, *(r for p in partitions for r in p.reasons)]
    checks = [
        *absolute_checks(jobs, imports, tallies, quality, counted=counted, reasons=every_failure),
        *([drop] if drop is not None else []),
        *against.run_checks,
        *against.partition_checks,
    ]
    return Judgement(
        state=state,
        reasons=(
            *run_reasons,
            *_quarantine_reasons(failed),
            *(waiting if state == CANDIDATE else []),
            *against.notes,
        ),
        partitions=partitions,
        counted_records=counted,
        profile=profile,
        baseline=baseline,
        checks=tuple(checks),
    )


def _record_drop(
    counted: int, counted_names: Sequence[str], baseline: Baseline | None, quality: Quality
) -> Check | None:
    """The counted records against the same partitions' records in the baseline, if any."""
    if baseline is None:
        return None
    return record_drop_check(
        counted, baseline.records_of(counted_names), quality, runs=len(baseline.runs)
    )


def _run_reasons(
    jobs: Sequence[JobFacts],
    imports: ImportFacts,
    quality: Quality,
    *,
    cloud: Sequence[Reason],
    counted: int,
    drop: Check | None,
    checks: Sequence[Check],
) -> list[Reason]:
    """Every reason the run as a whole fails, in a stable order; what it waits for is not one."""
    return [
        *job_status_reasons(jobs),
        *page_counter_reasons(jobs, quality),
        *[r for r in cloud if not is_waiting(r)],
        *entity_key_reasons(imports, quality),
        *invalid_record_reasons(imports, quality),
        *duplicate_reasons(imports, quality),
        *record_count_reasons(counted, None, quality),
        *([drop.reason] if drop is not None and drop.reason is not None else []),
        *[c.reason for c in checks if c.reason is not None],
    ]


@dataclass(frozen=True, slots=True)
class _HistoryChecks:
    """The history rules applied to a run: checks of the run, checks of its partitions, notes."""

    run_checks: list[Check] = field(default_factory=list)
    partition_checks: list[Check] = field(default_factory=list)
    notes: list[Reason] = field(default_factory=list)


def _against_history(
    profile: Profile, baseline: Baseline | None, quality: Quality
) -> _HistoryChecks:
    """The run's profile against its baseline (nothing while there is none): missing fields,
    fill rates and partition drops as checks, new fields as a note."""
    if baseline is None:
        return _HistoryChecks()
    missing = missing_field_checks(profile, baseline, quality)
    skip = [c.subject for c in missing if c.subject is not None]
    fills = fill_rate_checks(profile, baseline, quality, skip=skip)
    note = new_fields_note(profile, baseline)
    return _HistoryChecks(
        run_checks=missing + [c for c in fills if c.reason is None or c.reason.partition is None],
        partition_checks=[
            *(c for c in fills if c.reason is not None and c.reason.partition),
            *partition_drop_checks(profile, baseline, quality),
        ],
        notes=[] if note is None else [note],
    )


def _partitions(
    tallies: Mapping[str, PartitionTally],
    imports: ImportFacts,
    checks: Sequence[Check],
    quality: Quality,
) -> tuple[PartitionJudgement, ...]:
    """The verdict on each partition the run's records, invalid records or history checks name,
    in name order."""
    by_partition: dict[str, list[Reason]] = {}
    for check in checks:
        if check.reason is not None and check.reason.partition is not None:
            by_partition.setdefault(check.reason.partition, []).append(check.reason)
    names = sorted(set(tallies) | set(by_partition) | set(imports.invalid_partitions))
    return tuple(
        _partition(
            name,
            tallies.get(name),
            imports.invalid_partitions.get(name, {}),
            by_partition.get(name, ()),
            quality,
        )
        for name in names
    )


def _partition(
    name: str,
    tally: PartitionTally | None,
    invalid: Mapping[str, int],
    history_reasons: Sequence[Reason],
    quality: Quality,
) -> PartitionJudgement:
    """One partition's verdict: its records' defects, its invalid records, its history checks."""
    records = tally.records if tally is not None else 0
    return PartitionJudgement(
        name,
        records,
        (
            *(partition_reasons(tally, quality) if tally is not None else ()),
            *invalid_partition_reasons(name, records, invalid, quality),
            *history_reasons,
        ),
    )


def _counted_partitions(partitions: Sequence[PartitionJudgement], policy: str) -> list[str]:
    """The partitions whose records count: those that passed under ``publish_passing``, all of
    them otherwise."""
    if policy == "publish_passing":
        return [p.partition for p in partitions if p.passed]
    return [p.partition for p in partitions]


def _state(
    policy: str,
    run_reasons: Sequence[Reason],
    failed: Sequence[PartitionJudgement],
    partitions: Sequence[PartitionJudgement],
    waiting: Sequence[Reason],
) -> str:
    """Rejected for any run-level failure, or for a failed partition unless the policy publishes
    the passing ones and some passed; else a candidate while it waits, else accepted."""
    rejected = bool(run_reasons) or (
        bool(failed) and (policy == "reject" or len(failed) == len(partitions))
    )
    if rejected:
        return REJECTED
    if waiting:
        return CANDIDATE
    return ACCEPTED


def _quarantine_reasons(failed: Sequence[PartitionJudgement]) -> list[Reason]:
    """One run-level reason per quarantined partition, listing what it failed."""
    return [
        Reason(
            "partition_quarantined",
            f"partition {p.partition!r} failed {len(p.reasons)} check(s): "
            + "; ".join(r.message for r in p.reasons),
            got=len(p.reasons),
            expected=0,
            partition=p.partition,
        )
        for p in failed
    ]


def waiting_for_tasks(pending: Mapping[str, str]) -> Reason | None:
    """The reason a run stays a candidate while some of its tasks are not committed."""
    if not pending:
        return None
    listed = ", ".join(f"{key} ({state})" for key, state in sorted(pending.items()))
    return Reason(
        "tasks_not_committed",
        f"waiting for {len(pending)} sync(s) of this run to commit: {listed}",
        got=len(pending),
        expected=0,
        detail={"tasks": dict(sorted(pending.items())), "kind": WAITING},
    )
