"""The rules that need no history: every job finished, Cloud's page counters and data-quality
result, entity keys, invalid and duplicate records, the record count, and each partition's
records. Each returns the reasons it fails, with the numbers behind them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from config.datasets import Quality
from sync.acceptance.facts import (
    SAMPLES,
    WAITING,
    ImportFacts,
    JobFacts,
    PartitionTally,
    Reason,
    figure,
    percent,
)
from sync.acceptance.history import record_drop_check


def job_status_reasons(jobs: Sequence[JobFacts]) -> list[Reason]:
    """Every job of the run must have finished: a failed or stopped job is not a collection."""
    return [
        Reason(
            "job_not_finished",
            f"scraping job {job.job_id} ended {job.status!r}, not 'finished'",
            got=job.status,
            expected="finished",
            detail={"job_id": job.job_id},
        )
        for job in jobs
        if job.status != "finished"
    ]


_PAGE_RULES = (
    ("failed_pages", "jobs_failed", "max_failed_pages_percent", "failed", "failed"),
    ("empty_pages", "jobs_empty", "max_empty_pages_percent", "empty", "came back empty"),
    ("no_value_pages", "jobs_no_value", "max_no_value_pages_percent", "no_value", "had no value"),
)


def repaired_pages(jobs: Sequence[JobFacts]) -> set[str]:
    """Pages a finished recovery job of the run scraped again without a problem."""
    repaired: set[str] = set()
    for job in jobs:
        if job.recovery_start_urls is None or job.status != "finished":
            continue
        still = {str(u.get("url")) for u in job.problematic_urls}
        repaired |= {url for url in job.recovery_start_urls if url not in still}
    return repaired


def page_counts(
    jobs: Sequence[JobFacts],
) -> Iterable[tuple[str, str, str, int, int, list[str]]]:
    """Per page rule: its code, threshold, verb, pages still bad, pages scheduled, samples."""
    originals = [job for job in jobs if job.recovery_start_urls is None]
    repaired = repaired_pages(jobs)
    scheduled = sum(job.jobs_scheduled for job in originals)
    for code, counter, threshold_name, url_type, verb in _PAGE_RULES:
        listed = [
            str(u.get("url"))
            for job in originals
            for u in job.problematic_urls
            if u.get("type") == url_type
        ]
        fixed = sum(1 for url in listed if url in repaired)
        pages = max(0, sum(int(getattr(job, counter)) for job in originals) - fixed)
        urls = [url for url in listed if url not in repaired][:SAMPLES]
        yield code, threshold_name, verb, pages, scheduled, urls


def page_counter_reasons(jobs: Sequence[JobFacts], quality: Quality) -> list[Reason]:
    """Cloud's failed, empty and no-value page counts against the pages scheduled.

    Recovery jobs (reruns under the run) add no pages of their own: a page they scraped again
    without a problem no longer counts against the job that first failed it, and one that still
    fails is already counted there."""
    reasons: list[Reason] = []
    for code, threshold_name, verb, pages, scheduled, urls in page_counts(jobs):
        got = percent(pages, scheduled)
        expected = float(getattr(quality, threshold_name))
        if got > expected:
            reasons.append(
                Reason(
                    code,
                    f"{pages} of {scheduled} pages {verb} ({got}% > {figure(expected)}%)",
                    got=got,
                    expected=figure(expected),
                    detail={"pages": pages, "scheduled": scheduled, "sample_urls": urls},
                )
            )
    return reasons


def _quality_leaves(result: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    for key, value in result.items():
        if key == "min_column_records" and isinstance(value, Mapping):
            for column, leaf in value.items():
                if isinstance(leaf, Mapping):
                    yield f"min_column_records.{column}", leaf
        elif isinstance(value, Mapping) and "success" in value:
            yield key, value


def _superseded_criteria(job: JobFacts, repaired: set[str]) -> set[str]:
    """Cloud's page-percentage criteria of a job whose problem pages of that kind were all
    scraped again cleanly by a recovery job: Cloud judged the job before the repair, and
    :func:`page_counter_reasons` counts the pages that are still bad."""
    superseded = set()
    for _code, _counter, criterion, url_type, _verb in _PAGE_RULES:
        urls = [str(u.get("url")) for u in job.problematic_urls if u.get("type") == url_type]
        if urls and all(url in repaired for url in urls):
            superseded.add(criterion)
    return superseded


def cloud_quality_reasons(jobs: Sequence[JobFacts], quality: Quality) -> list[Reason]:
    """Cloud's data-quality result of every finished job, unless the dataset switched it off;
    a result that could not be read yet is a ``waiting`` reason, not a failure."""
    if not quality.use_cloud_quality:
        return []
    repaired = repaired_pages(jobs)
    reasons: list[Reason] = []
    for job in jobs:
        if job.status != "finished":
            continue
        superseded = _superseded_criteria(job, repaired)
        result = job.data_quality
        if result is None:
            reasons.append(
                Reason(
                    "cloud_quality_unavailable",
                    f"Cloud's data-quality result for scraping job {job.job_id} could not be "
                    f"read yet ({job.quality_error or 'not fetched'})",
                    detail={"job_id": job.job_id, "kind": WAITING},
                )
            )
            continue
        failed = [
            (name, leaf)
            for name, leaf in _quality_leaves(result)
            if not leaf["success"] and name not in superseded
        ]
        for name, leaf in failed:
            reasons.append(
                Reason(
                    "cloud_quality",
                    f"Cloud's data-quality check {name} failed for scraping job {job.job_id}: "
                    f"got {leaf.get('got')}, expected {leaf.get('expected')}",
                    got=leaf.get("got"),
                    expected=leaf.get("expected"),
                    detail={"job_id": job.job_id, "criterion": name},
                )
            )
        if not failed and not superseded and result.get("overall_data_quality_success") is False:
            reasons.append(
                Reason(
                    "cloud_quality",
                    f"Cloud's data-quality result for scraping job {job.job_id} is a failure",
                    got=False,
                    expected=True,
                    detail={"job_id": job.job_id, "criterion": "overall_data_quality_success"},
                )
            )
    return reasons


def entity_key_reasons(facts: ImportFacts, quality: Quality) -> list[Reason]:
    """Records without their entity key are pages that were not the thing scraped."""
    got = percent(facts.missing_key, facts.records_read)
    if got <= quality.max_invalid_records_percent:
        return []
    return [
        Reason(
            "records_without_key",
            f"{facts.missing_key} of {facts.records_read} records have no entity key ({got}% > "
            f"{figure(quality.max_invalid_records_percent)}%): those pages held no item",
            got=got,
            expected=figure(quality.max_invalid_records_percent),
            detail={"records": facts.missing_key, "read": facts.records_read},
        )
    ]


def invalid_record_reasons(facts: ImportFacts, quality: Quality) -> list[Reason]:
    """Records set aside with no usable partition (a line too long or unreadable, a partition
    value too wide) count against the whole run."""
    count = sum(facts.invalid_unplaced.values())
    got = percent(count, facts.records_read)
    if not count or got <= quality.max_invalid_records_percent:
        return []
    kinds = ", ".join(f"{n} {reason}" for reason, n in sorted(facts.invalid_unplaced.items()))
    return [
        Reason(
            "invalid_records",
            f"{count} of {facts.records_read} records could not be stored ({kinds}; {got}% > "
            f"{figure(quality.max_invalid_records_percent)}%)",
            got=got,
            expected=figure(quality.max_invalid_records_percent),
            detail={"records": count, "read": facts.records_read, **facts.invalid_unplaced},
        )
    ]


def invalid_partition_reasons(
    partition: str, stored: int, invalid: Mapping[str, int], quality: Quality
) -> list[Reason]:
    """A partition's records set aside as invalid (e.g. a NUL in a value), per reason, against
    all the partition's records."""
    total = stored + sum(invalid.values())
    limit = quality.max_invalid_records_percent
    reasons = []
    for reason, count in sorted(invalid.items()):
        got = percent(count, total)
        if count and got > limit:
            reasons.append(
                Reason(
                    "invalid_records",
                    f"{count} of {total} records set aside as invalid ({reason}; {got}% > "
                    f"{figure(limit)}%)",
                    got=got,
                    expected=figure(limit),
                    partition=partition,
                    detail={"records": count, "of": total, "reason": reason},
                )
            )
    return reasons


def duplicate_reasons(facts: ImportFacts, quality: Quality) -> list[Reason]:
    """Entity keys seen more than once in one job with different payloads make identity
    ambiguous: which price is the real one?"""
    got = percent(facts.conflicting_duplicates, facts.distinct_keys)
    if got <= quality.max_conflicting_duplicates_percent:
        return []
    return [
        Reason(
            "conflicting_duplicates",
            f"{facts.conflicting_duplicates} of {facts.distinct_keys} entity keys came twice "
            f"with different payloads ({got}% > "
            f"{figure(quality.max_conflicting_duplicates_percent)}%)",
            got=got,
            expected=figure(quality.max_conflicting_duplicates_percent),
            detail={"keys": facts.conflicting_duplicates, "distinct": facts.distinct_keys},
        )
    ]


def record_count_reasons(
    records: int, baseline: float | None, quality: Quality, *, runs: int = 0
) -> list[Reason]:
    """The record count against the dataset's minimum and, once the dataset has a history,
    against its baseline (the median of its last accepted runs); a gain never fails."""
    reasons: list[Reason] = []
    if records < quality.min_records:
        reasons.append(
            Reason(
                "min_records",
                f"{records} records, fewer than the minimum of {quality.min_records}",
                got=records,
                expected=quality.min_records,
            )
        )
    check = record_drop_check(records, baseline, quality, runs=runs)
    if check is not None and check.reason is not None:
        reasons.append(check.reason)
    return reasons


def partition_reasons(tally: PartitionTally, quality: Quality) -> list[Reason]:
    """One partition's records: required fields, value parsers, consent pages, empty shells."""
    limit = quality.max_invalid_records_percent
    n = tally.records
    reasons: list[Reason] = []

    def check(code: str, count: int, what: str, sample_key: str | None = None) -> None:
        got = percent(count, n)
        if count and got > limit:
            samples = tally.samples.get(sample_key or code, [])
            suffix = f", e.g. {', '.join(repr(s) for s in samples)}" if samples else ""
            reasons.append(
                Reason(
                    code,
                    f"{what} in {count} of {n} records ({got}% > {figure(limit)}%){suffix}",
                    got=got,
                    expected=figure(limit),
                    partition=tally.partition,
                    detail={"records": count, "of": n, **({"samples": samples} if samples else {})},
                )
            )

    for name, count in sorted(tally.missing.items()):
        check("required_missing", count, f"required field {name!r} is empty")
    for name, count in sorted(tally.unparsable.items()):
        parser = quality.parsers.get(name)
        check(
            "unparsable",
            count,
            f"{name!r} does not parse as {parser}"
            if parser
            else f"{name!r} does not cast to its column's type",
            sample_key=f"unparsable:{name}",
        )
    check("consent_page", tally.consent_pages, "a consent or bot-wall page", "consent")
    check("empty_shell", tally.empty_shells, "a page with every content field empty")
    return reasons
