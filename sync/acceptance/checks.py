"""Every rule applied to a run as a check, pass or fail, with the figure it judged: how close
a run came, for ``scrapesync check``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from config.datasets import Quality
from sync.acceptance.facts import (
    Check,
    ImportFacts,
    JobFacts,
    PartitionTally,
    Reason,
    figure,
    percent,
)
from sync.acceptance.rules import page_counts


def _failed(reasons: Iterable[Reason], code: str) -> list[Reason]:
    return [r for r in reasons if r.code == code]


def _percent_check(
    code: str, got: float, limit: float, reasons: Sequence[Reason], subject: str | None = None
) -> list[Check]:
    allowed = f"<= {figure(limit)}%"
    failed = _failed(reasons, code)
    if not failed:
        return [Check(code, got, allowed, subject=subject)]
    return [Check(code, r.got, allowed, subject=r.partition or subject, reason=r) for r in failed]


def absolute_checks(
    jobs: Sequence[JobFacts],
    imports: ImportFacts,
    tallies: Mapping[str, PartitionTally],
    quality: Quality,
    *,
    counted: int,
    reasons: Sequence[Reason],
) -> list[Check]:
    """The rules that need no history, as checks: the figure each one judged and its verdict
    (``reasons`` are the run's and its partitions' failures)."""
    checks: list[Check] = []
    statuses = ", ".join(sorted({str(job.status) for job in jobs})) or "no job"
    failed_jobs = _failed(reasons, "job_not_finished")
    checks.append(
        Check(
            "job_not_finished",
            statuses,
            "finished",
            reason=failed_jobs[0] if failed_jobs else None,
        )
    )
    for code, threshold_name, _verb, pages, scheduled, _urls in page_counts(jobs):
        limit = float(getattr(quality, threshold_name))
        checks += _percent_check(code, percent(pages, scheduled), limit, reasons)
    cloud = _failed(reasons, "cloud_quality")
    checks.append(
        Check(
            "cloud_quality",
            f"{len(cloud)} failed criteria" if quality.use_cloud_quality else "off",
            "no failed criterion" if quality.use_cloud_quality else "not judged",
            reason=cloud[0] if cloud else None,
        )
    )
    checks += _percent_check(
        "records_without_key",
        percent(imports.missing_key, imports.records_read),
        quality.max_invalid_records_percent,
        reasons,
    )
    checks += _percent_check(
        "conflicting_duplicates",
        percent(imports.conflicting_duplicates, imports.distinct_keys),
        quality.max_conflicting_duplicates_percent,
        reasons,
    )
    minimum = _failed(reasons, "min_records")
    checks.append(
        Check(
            "min_records",
            counted,
            f">= {quality.min_records}",
            reason=minimum[0] if minimum else None,
        )
    )
    worst: dict[str, tuple[float, str | None]] = {
        code: (0.0, None)
        for code in ("required_missing", "unparsable", "consent_page", "empty_shell")
    }

    def note_worst(code: str, count: int, of: int, partition: str) -> None:
        got = percent(count, of)
        if got > worst[code][0]:
            worst[code] = (got, partition)

    for name, tally in sorted(tallies.items()):
        for count in tally.missing.values():
            note_worst("required_missing", count, tally.records, name)
        for count in tally.unparsable.values():
            note_worst("unparsable", count, tally.records, name)
        note_worst("consent_page", tally.consent_pages, tally.records, name)
        note_worst("empty_shell", tally.empty_shells, tally.records, name)
    for code, (got, partition) in worst.items():
        checks += _percent_check(
            code, got, quality.max_invalid_records_percent, reasons, subject=partition
        )
    return checks
