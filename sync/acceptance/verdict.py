"""The verdict on a run: every rule applied, partitions quarantined, and the run accepted,
rejected, or left a candidate while it waits for its syncs or Cloud's data-quality result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from config.datasets import Dataset
from sync.acceptance.checks import absolute_checks
from sync.acceptance.facts import (
    ACCEPTED,
    CANDIDATE,
    REJECTED,
    WAITING,
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
    run_checks: list[Check] = []
    partition_checks: list[Check] = []
    notes: list[Reason] = []
    if baseline is not None:
        missing = missing_field_checks(profile, baseline, quality)
        skip = [c.subject for c in missing if c.subject is not None]
        fills = fill_rate_checks(profile, baseline, quality, skip=skip)
        run_checks += missing + [c for c in fills if c.reason is None or c.reason.partition is None]
        partition_checks += [c for c in fills if c.reason is not None and c.reason.partition]
        partition_checks += partition_drop_checks(profile, baseline, quality)
        note = new_fields_note(profile, baseline)
        if note is not None:
            notes.append(note)
    by_partition: dict[str, list[Reason]] = {}
    for check in partition_checks:
        if check.reason is not None and check.reason.partition is not None:
            by_partition.setdefault(check.reason.partition, []).append(check.reason)
    names = sorted(set(tallies) | set(by_partition) | set(imports.invalid_partitions))
    partitions = tuple(
        PartitionJudgement(
            name,
            tallies[name].records if name in tallies else 0,
            (
                *(partition_reasons(tallies[name], quality) if name in tallies else ()),
                *invalid_partition_reasons(
                    name,
                    tallies[name].records if name in tallies else 0,
                    imports.invalid_partitions.get(name, {}),
                    quality,
                ),
                *by_partition.get(name, ()),
            ),
        )
        for name in names
    )
    failed = [p for p in partitions if not p.passed]
    if dataset.policy == "publish_passing":
        counted_names = [p.partition for p in partitions if p.passed]
    else:
        counted_names = [p.partition for p in partitions]
    counted = sum(p.records for p in partitions if p.partition in counted_names)
    drop = (
        record_drop_check(
            counted, baseline.records_of(counted_names), quality, runs=len(baseline.runs)
        )
        if baseline is not None
        else None
    )
    cloud = cloud_quality_reasons(jobs, quality)
    waiting = [r for r in cloud if is_waiting(r)]
    run_reasons = [
        *job_status_reasons(jobs),
        *page_counter_reasons(jobs, quality),
        *[r for r in cloud if not is_waiting(r)],
        *entity_key_reasons(imports, quality),
        *invalid_record_reasons(imports, quality),
        *duplicate_reasons(imports, quality),
        *record_count_reasons(counted, None, quality),
        *([drop.reason] if drop is not None and drop.reason is not None else []),
        *[c.reason for c in run_checks if c.reason is not None],
    ]
    quarantine = [
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
    rejected = bool(run_reasons) or (
        bool(failed) and (dataset.policy == "reject" or len(failed) == len(partitions))
    )
    if rejected:
        state = REJECTED
    elif waiting:
        state = CANDIDATE
    else:
        state = ACCEPTED
    every_failure = [*run_reasons, *(r for p in partitions for r in p.reasons)]
    checks = [
        *absolute_checks(jobs, imports, tallies, quality, counted=counted, reasons=every_failure),
        *([drop] if drop is not None else []),
        *run_checks,
        *partition_checks,
    ]
    return Judgement(
        state=state,
        reasons=(
            *run_reasons,
            *quarantine,
            *(waiting if state == CANDIDATE else []),
            *notes,
        ),
        partitions=partitions,
        counted_records=counted,
        profile=profile,
        baseline=baseline,
        checks=tuple(checks),
    )


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
