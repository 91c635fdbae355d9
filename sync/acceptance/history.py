"""The history rules: a run's profile against the baseline made of its dataset's last
accepted runs. A gain is never a failure; a drop in volume, in a field's fill rate or in one
partition's records beyond its threshold is, and so is a field every baseline run had."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from config.datasets import Quality
from sync.acceptance.facts import (
    NOTE,
    Baseline,
    Check,
    PartitionTally,
    Profile,
    Reason,
    figure,
    percent,
)


def profile_of(tallies: Mapping[str, PartitionTally], run_id: str | None = None) -> Profile:
    """A run's profile from its partitions' tallies: records and fill rates, overall and per
    partition."""
    records = sum(t.records for t in tallies.values())
    totals: dict[str, int] = {}
    for tally in tallies.values():
        for name, n in tally.filled.items():
            totals[name] = totals.get(name, 0) + n
    return Profile(
        records=records,
        partitions={name: t.records for name, t in sorted(tallies.items())},
        fill_rates={name: percent(n, records) for name, n in sorted(totals.items())},
        partition_fill_rates={
            name: {f: percent(n, t.records) for f, n in sorted(t.filled.items())}
            for name, t in sorted(tallies.items())
        },
        run_id=run_id,
    )


def baseline_of(history: Sequence[Profile], quality: Quality) -> Baseline | None:
    """The baseline made of the dataset's last ``baseline_runs`` accepted runs (``history`` is
    newest first); while it has fewer than ``min_history``, the last accepted run alone (one
    run is no median, but a 40% loss against it is no noise either). None with no history: the
    first run is judged by the absolute rules only."""
    runs = tuple(history[: quality.baseline_runs])
    if not runs:
        return None
    if len(runs) < quality.min_history:
        return Baseline(runs[:1])
    return Baseline(runs)


def _drop_percent(got: float, baseline: float) -> float:
    return round(100.0 * (baseline - got) / baseline, 2) if baseline else 0.0


def _runs_text(runs: int) -> str:
    if runs == 1:
        return "the last accepted run"
    return f"the median of the last {runs} accepted runs"


def record_drop_check(
    records: int, baseline: float | None, quality: Quality, *, runs: int = 0
) -> Check | None:
    """The run's records against the baseline's: a drop beyond ``max_record_drop_percent``
    fails, a gain never does. None when there is nothing to compare with."""
    limit = quality.max_record_drop_percent
    if limit is None or baseline is None or baseline <= 0:
        return None
    floor = baseline * (1 - limit / 100.0)
    allowed = f">= {figure(floor)} (at most {figure(limit)}% below)"
    drop = _drop_percent(records, baseline)
    if drop <= limit:
        return Check("record_drop", records, allowed, baseline=figure(baseline))
    reason = Reason(
        "record_drop",
        f"{records} records against a baseline of {figure(baseline)} ({_runs_text(runs)}): a "
        f"drop of {drop}% > {figure(limit)}%",
        got=records,
        expected=figure(floor),
        baseline=figure(baseline),
        detail={"drop_percent": drop, "max_drop_percent": figure(limit), "baseline_runs": runs},
    )
    return Check("record_drop", records, allowed, baseline=figure(baseline), reason=reason)


def missing_field_checks(profile: Profile, baseline: Baseline, quality: Quality) -> list[Check]:
    """Every field that each baseline run had must be in this run (filled at least once)."""
    if not quality.fail_on_missing_fields:
        return []
    expected = sorted(baseline.fields_in_every_run)
    missing = [name for name in expected if name not in profile.fields]
    runs = len(baseline.runs)
    checks = [
        Check(
            "field_missing",
            f"{len(expected) - len(missing)} of {len(expected)}",
            "every field of every baseline run",
            baseline=len(expected),
        )
    ]
    for name in missing:
        rate = figure(baseline.fill_rate(name))
        reason = Reason(
            "field_missing",
            f"field {name!r} is missing: each of the last {runs} accepted runs had it (filled "
            f"in {rate}% of records)",
            got="absent",
            expected="present",
            baseline=rate,
            detail={"field": name, "baseline_runs": runs},
        )
        checks.append(
            Check("field_missing", "absent", "present", baseline=rate, subject=name, reason=reason)
        )
    return checks


def new_fields_note(profile: Profile, baseline: Baseline) -> Reason | None:
    """Fields no baseline run had are reported, never failed: a site may add a column."""
    new = sorted(profile.fields - baseline.fields_in_any_run)
    if not new:
        return None
    return Reason(
        "new_fields",
        f"{len(new)} field(s) none of the last {len(baseline.runs)} accepted runs had: "
        + ", ".join(new),
        got=len(new),
        expected=None,
        baseline=0,
        detail={"fields": new, "kind": NOTE},
    )


def _fill_reason(
    name: str, got: float, base: float, limit: float, runs: int, partition: str | None
) -> Reason:
    where = f" in partition {partition!r}" if partition is not None else ""
    drop = round(base - got, 2)
    return Reason(
        "fill_rate_drop",
        f"{name!r} is filled in {figure(got)}% of records{where} against a baseline of "
        f"{figure(base)}% ({_runs_text(runs)}): {figure(drop)} points down > {figure(limit)}",
        got=figure(got),
        expected=figure(max(0.0, base - limit)),
        baseline=figure(base),
        partition=partition,
        detail={
            "field": name,
            "drop_points": figure(drop),
            "max_drop_points": figure(limit),
            "baseline_runs": runs,
        },
    )


def _enough_records(records: int, limit_points: float) -> bool:
    """Whether one record of ``records`` is worth less than ``limit_points`` of fill rate."""
    return records > 0 and (limit_points <= 0 or 100.0 / records < limit_points)


def fill_rate_checks(
    profile: Profile, baseline: Baseline, quality: Quality, *, skip: Iterable[str] = ()
) -> list[Check]:
    """Each field's fill rate against its baseline, over the run and per partition.

    A fall beyond ``max_fill_rate_drop_points`` over the run is run-level unless a single
    partition (of several) is the one that fell: then, as for any partition whose own rate fell
    that far while the run's held, the reason is that partition's and quarantines it. A rate is
    judged only over enough records that one record alone cannot move it past the threshold
    (seven at 15 points): a retailer with three items is not quarantined for one blank title."""
    limit = quality.max_fill_rate_drop_points
    if limit is None or not _enough_records(profile.records, limit):
        return []
    runs = len(baseline.runs)
    skipped = set(skip)
    judged = sorted(
        p
        for p in profile.partitions
        if p in baseline.partition_names and _enough_records(profile.partitions[p], limit)
    )
    checks: list[Check] = []
    for name in sorted(baseline.fields_in_any_run - skipped):
        base = baseline.fill_rate(name)
        got = profile.fill_rates.get(name, 0.0)
        allowed = f">= {figure(max(0.0, base - limit))}% (at most {figure(limit)} points below)"
        failing: list[Check] = []
        for partition in judged:
            p_base = baseline.partition_fill_rate(partition, name)
            p_got = profile.partition_fill_rates.get(partition, {}).get(name, 0.0)
            if p_base - p_got > limit:
                reason = _fill_reason(name, p_got, p_base, limit, runs, partition)
                p_allowed = f">= {figure(max(0.0, p_base - limit))}% in {partition}"
                failing.append(
                    Check(
                        "fill_rate_drop",
                        figure(p_got),
                        p_allowed,
                        baseline=figure(p_base),
                        subject=f"{name} @ {partition}",
                        reason=reason,
                    )
                )
        one_partition_alone = len(failing) == 1 and len(profile.partitions) > 1
        if base - got > limit and one_partition_alone:
            allowed += f"; the fall is {failing[0].subject}'s alone"
        elif base - got > limit:
            reason = _fill_reason(name, got, base, limit, runs, None)
            reason = replace(
                reason,
                detail={
                    **reason.detail,
                    "partitions": [c.reason.partition for c in failing if c.reason],
                },
            )
            checks.append(
                Check(
                    "fill_rate_drop",
                    figure(got),
                    allowed,
                    baseline=figure(base),
                    subject=name,
                    reason=reason,
                )
            )
            continue
        checks.append(
            Check("fill_rate_drop", figure(got), allowed, baseline=figure(base), subject=name)
        )
        checks.extend(failing)
    return checks


def partition_drop_checks(profile: Profile, baseline: Baseline, quality: Quality) -> list[Check]:
    """Each partition's records against its baseline; one that fell beyond
    ``max_partition_drop_percent`` (or vanished) is quarantined, a gain never fails."""
    limit = quality.max_partition_drop_percent
    if limit is None:
        return []
    runs = len(baseline.runs)
    checks: list[Check] = []
    for partition in sorted(baseline.partition_names):
        base = baseline.partition_records(partition)
        got = profile.partitions.get(partition, 0)
        floor = base * (1 - limit / 100.0)
        allowed = f">= {figure(floor)} (at most {figure(limit)}% below)"
        drop = _drop_percent(got, base)
        reason = None
        if drop > limit:
            reason = Reason(
                "partition_drop",
                f"{got} records in partition {partition!r} against a baseline of {figure(base)} "
                f"({_runs_text(runs)}): a drop of {drop}% > {figure(limit)}%",
                got=got,
                expected=figure(floor),
                baseline=figure(base),
                partition=partition,
                detail={
                    "drop_percent": drop,
                    "max_drop_percent": figure(limit),
                    "baseline_runs": runs,
                },
            )
        checks.append(
            Check(
                "partition_drop",
                got,
                allowed,
                baseline=figure(base),
                subject=partition,
                reason=reason,
            )
        )
    return checks
