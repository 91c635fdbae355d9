"""Acceptance rules: whether a run's data is good enough to publish. Pure functions over counts,
records and thresholds, with no I/O, so every rule is tested with plain values.

"HTTP 200" is never "data success". A run is judged on four kinds of evidence:

- Cloud's job counters (failed, empty and no-value pages against pages scheduled) and the job's
  final status;
- Cloud's own data-quality result, one more gate that a dataset may switch off;
- the run as a whole: records without their entity key, entity keys seen twice with different
  payloads, the record count against the dataset's minimum and against the last accepted run;
- each partition's records: required fields present, values that parse (``price`` as a number),
  and pages that are not data (a consent page, an empty shell).

A failing run-level rule rejects the run. A failing partition is quarantined; the dataset's
policy then rejects the whole run (``reject``) or publishes the partitions that passed
(``publish_passing``). Every reason carries the numbers behind it (``got``, ``expected``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from config.datasets import Dataset, Quality

NO_PARTITION = "(none)"
WAITING = "waiting"
SAMPLES = 3

ACCEPTED = "accepted"
REJECTED = "rejected"
CANDIDATE = "candidate"


@dataclass(frozen=True)
class Reason:
    """Why a run or a partition failed, or what it waits for, with the numbers behind it."""

    code: str
    message: str
    got: float | int | str | None = None
    expected: float | int | str | None = None
    partition: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The reason as plain JSON-able values, as stored and shown by status."""
        return {
            "code": self.code,
            "message": self.message,
            "got": self.got,
            "expected": self.expected,
            "partition": self.partition,
            **({"detail": dict(self.detail)} if self.detail else {}),
        }


@dataclass(frozen=True)
class JobFacts:
    """One scraping job of the run as Cloud last described it."""

    job_id: int
    status: str | None
    jobs_scheduled: int = 0
    jobs_executed: int = 0
    jobs_failed: int = 0
    jobs_empty: int = 0
    jobs_no_value: int = 0
    stored_record_count: int = 0
    data_quality: Mapping[str, Any] | None = None
    problematic_urls: Sequence[Mapping[str, Any]] = ()
    quality_error: str | None = None
    recovery_start_urls: Sequence[str] | None = None


@dataclass(frozen=True)
class ImportFacts:
    """What the run's committed syncs read: records, records without a key, conflicting keys."""

    records_read: int = 0
    missing_key: int = 0
    distinct_keys: int = 0
    conflicting_duplicates: int = 0


@dataclass
class PartitionTally:
    """Counts of one partition's records, per kind of defect, with a few sample values."""

    partition: str
    records: int = 0
    missing: dict[str, int] = field(default_factory=dict)
    unparsable: dict[str, int] = field(default_factory=dict)
    consent_pages: int = 0
    empty_shells: int = 0
    samples: dict[str, list[str]] = field(default_factory=dict)

    def note(self, key: str, value: Any) -> None:
        """Keep ``value`` as one of a few samples shown with the reason ``key``."""
        found = self.samples.setdefault(key, [])
        if len(found) < SAMPLES:
            text = value if isinstance(value, str) else repr(value)
            found.append(text if len(text) <= 60 else text[:57] + "...")


@dataclass(frozen=True)
class RecordRules:
    """What every record of a dataset must look like."""

    required: tuple[str, ...] = ()
    parsers: Mapping[str, str] = field(default_factory=dict)
    consent_markers: tuple[str, ...] = ()
    identity_fields: tuple[str, ...] = ()

    @classmethod
    def of(cls, dataset: Dataset) -> RecordRules:
        """The record rules configured for ``dataset``."""
        identity = dataset.entity_key + ((dataset.partition,) if dataset.partition else ())
        return cls(
            required=dataset.required,
            parsers=dict(dataset.quality.parsers),
            consent_markers=tuple(m.lower() for m in dataset.quality.consent_markers),
            identity_fields=identity,
        )


@dataclass(frozen=True)
class PartitionJudgement:
    """The verdict on one partition: passed or quarantined, with its reasons."""

    partition: str
    records: int
    reasons: tuple[Reason, ...]

    @property
    def passed(self) -> bool:
        """Whether the partition may be published."""
        return not self.reasons


@dataclass(frozen=True)
class Judgement:
    """The verdict on a run: accepted, rejected or still a candidate, and why."""

    state: str
    reasons: tuple[Reason, ...]
    partitions: tuple[PartitionJudgement, ...]
    counted_records: int

    @property
    def publishable(self) -> tuple[str, ...]:
        """The partitions whose records are published when the run is accepted."""
        if self.state != ACCEPTED:
            return ()
        return tuple(p.partition for p in self.partitions if p.passed)

    @property
    def quarantined(self) -> tuple[str, ...]:
        """The partitions that failed their checks."""
        return tuple(p.partition for p in self.partitions if not p.passed)


# --- value parsers ------------------------------------------------------------------------------

_CURRENCY = re.compile(
    r"^(?:[A-Z]{3}|[$€£¥₹₽₩]|US\$|R\$|kr)?\s*(.*?)\s*(?:[A-Z]{3}|[$€£¥₹₽₩]|kr)?$"
)
_PLAIN_NUMBER = re.compile(r"^[+-]?(?:\d+(?:[.,]\d+)?|[.,]\d+)$")
_GROUPED_POINT = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_GROUPED_COMMA = re.compile(r"^[+-]?\d{1,3}(?:\.\d{3})+(?:,\d+)?$")
_INTEGER = re.compile(r"^[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)$")
_GROUP_SPACES = re.compile(r"(?<=\d)[\s\u00a0\u202f'](?=\d{3}\b)")


def is_filled(value: Any) -> bool:
    """Whether a field holds a value: not None, not blank text, not an empty list or object."""
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, list | dict):
        return bool(value)
    return True


def parses_as_number(value: Any) -> bool:
    """A price-like number: 12, 12.5, "1,234.50", "1.234,50", "$ 9.99", "12,99 EUR"."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value == value and value not in (float("inf"), float("-inf"))
    if not isinstance(value, str):
        return False
    match = _CURRENCY.match(value.strip())
    text = _GROUP_SPACES.sub("", match.group(1) if match else value.strip())
    return bool(
        _PLAIN_NUMBER.match(text) or _GROUPED_POINT.match(text) or _GROUPED_COMMA.match(text)
    )


def parses_as_integer(value: Any) -> bool:
    """A whole number: 3, "3", "1,200", "1 200"."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, str) and bool(_INTEGER.match(_GROUP_SPACES.sub("", value.strip())))


def parses_as_url(value: Any) -> bool:
    """An absolute http(s) URL with a host and no whitespace."""
    if not isinstance(value, str) or any(c.isspace() for c in value.strip()):
        return False
    parts = urlsplit(value.strip())
    return parts.scheme in ("http", "https") and bool(parts.hostname)


PARSERS = {
    "number": parses_as_number,
    "integer": parses_as_integer,
    "url": parses_as_url,
    "nonempty": is_filled,
}


# --- records ------------------------------------------------------------------------------------


def is_consent_page(record: Mapping[str, Any], markers: Sequence[str]) -> bool:
    """Whether any text field of a record carries a consent or bot-wall marker."""
    for value in record.values():
        if isinstance(value, str):
            lowered = value.lower()
            if any(marker in lowered for marker in markers):
                return True
    return False


def is_empty_shell(record: Mapping[str, Any], identity_fields: Sequence[str]) -> bool:
    """Whether a record has content fields and every one of them is empty (a page that rendered
    its frame but no data)."""
    content = [k for k in record if k not in identity_fields]
    return bool(content) and not any(is_filled(record[k]) for k in content)


def tally_record(tally: PartitionTally, record: Mapping[str, Any], rules: RecordRules) -> None:
    """Count one record's defects into its partition's tally."""
    tally.records += 1
    for name in rules.required:
        if not is_filled(record.get(name)):
            tally.missing[name] = tally.missing.get(name, 0) + 1
    for name, parser in rules.parsers.items():
        value = record.get(name)
        if is_filled(value) and not PARSERS[parser](value):
            tally.unparsable[name] = tally.unparsable.get(name, 0) + 1
            tally.note(f"unparsable:{name}", value)
    if rules.consent_markers and is_consent_page(record, rules.consent_markers):
        tally.consent_pages += 1
        title = record.get("title")
        tally.note("consent", title if is_filled(title) else dict(record))
    elif is_empty_shell(record, rules.identity_fields):
        tally.empty_shells += 1


def tally_records(
    records: Iterable[tuple[str | None, Mapping[str, Any]]], rules: RecordRules
) -> dict[str, PartitionTally]:
    """Tally (partition, record) pairs per partition; records without one go to ``(none)``."""
    tallies: dict[str, PartitionTally] = {}
    for partition, record in records:
        name = partition if partition is not None else NO_PARTITION
        tally = tallies.get(name)
        if tally is None:
            tally = tallies[name] = PartitionTally(name)
        tally_record(tally, record, rules)
    return tallies


# --- rules --------------------------------------------------------------------------------------


def percent(part: int, whole: int) -> float:
    """``part`` as a percentage of ``whole``, rounded to two decimals (0 when whole is 0)."""
    return round(100.0 * part / whole, 2) if whole else 0.0


def _num(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 2)


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


def page_counter_reasons(jobs: Sequence[JobFacts], quality: Quality) -> list[Reason]:
    """Cloud's failed, empty and no-value page counts against the pages scheduled.

    Recovery jobs (reruns under the run) add no pages of their own: a page they scraped again
    without a problem no longer counts against the job that first failed it, and one that still
    fails is already counted there."""
    originals = [job for job in jobs if job.recovery_start_urls is None]
    repaired = repaired_pages(jobs)
    scheduled = sum(job.jobs_scheduled for job in originals)
    reasons: list[Reason] = []
    for code, counter, threshold_name, url_type, verb in _PAGE_RULES:
        listed = [
            str(u.get("url"))
            for job in originals
            for u in job.problematic_urls
            if u.get("type") == url_type
        ]
        fixed = sum(1 for url in listed if url in repaired)
        pages = max(0, sum(int(getattr(job, counter)) for job in originals) - fixed)
        got = percent(pages, scheduled)
        expected = float(getattr(quality, threshold_name))
        if got > expected:
            urls = [url for url in listed if url not in repaired][:SAMPLES]
            reasons.append(
                Reason(
                    code,
                    f"{pages} of {scheduled} pages {verb} ({got}% > {_num(expected)}%)",
                    got=got,
                    expected=_num(expected),
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
            f"{_num(quality.max_invalid_records_percent)}%): those pages held no item",
            got=got,
            expected=_num(quality.max_invalid_records_percent),
            detail={"records": facts.missing_key, "read": facts.records_read},
        )
    ]


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
            f"{_num(quality.max_conflicting_duplicates_percent)}%)",
            got=got,
            expected=_num(quality.max_conflicting_duplicates_percent),
            detail={"keys": facts.conflicting_duplicates, "distinct": facts.distinct_keys},
        )
    ]


def record_count_reasons(records: int, previous: int | None, quality: Quality) -> list[Reason]:
    """The record count against the dataset's minimum and against the last accepted run."""
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
    limit = quality.max_record_drop_percent
    if limit is not None and previous:
        drop = percent(previous - records, previous)
        if drop > limit:
            reasons.append(
                Reason(
                    "record_drop",
                    f"{records} records against {previous} in the last accepted run: a drop of "
                    f"{drop}% > {_num(limit)}%",
                    got=drop,
                    expected=_num(limit),
                    detail={"records": records, "previous": previous},
                )
            )
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
                    f"{what} in {count} of {n} records ({got}% > {_num(limit)}%){suffix}",
                    got=got,
                    expected=_num(limit),
                    partition=tally.partition,
                    detail={"records": count, "of": n, **({"samples": samples} if samples else {})},
                )
            )

    for name, count in sorted(tally.missing.items()):
        check("required_missing", count, f"required field {name!r} is empty")
    for name, count in sorted(tally.unparsable.items()):
        parser = quality.parsers.get(name, "?")
        check(
            "unparsable",
            count,
            f"{name!r} does not parse as {parser}",
            sample_key=f"unparsable:{name}",
        )
    check("consent_page", tally.consent_pages, "a consent or bot-wall page", "consent")
    check("empty_shell", tally.empty_shells, "a page with every content field empty")
    return reasons


# --- the verdict ----------------------------------------------------------------------------


def is_waiting(reason: Reason) -> bool:
    """Whether a reason says what the run waits for rather than what is wrong with it."""
    return reason.detail.get("kind") == WAITING


def judge(
    dataset: Dataset,
    *,
    jobs: Sequence[JobFacts],
    imports: ImportFacts,
    tallies: Mapping[str, PartitionTally],
    previous_records: int | None,
) -> Judgement:
    """The verdict on a run whose tasks are all committed."""
    quality = dataset.quality
    partitions = tuple(
        PartitionJudgement(name, tally.records, tuple(partition_reasons(tally, quality)))
        for name, tally in sorted(tallies.items())
    )
    failed = [p for p in partitions if not p.passed]
    if dataset.policy == "publish_passing":
        counted = sum(p.records for p in partitions if p.passed)
    else:
        counted = sum(p.records for p in partitions)
    cloud = cloud_quality_reasons(jobs, quality)
    waiting = [r for r in cloud if is_waiting(r)]
    run_reasons = [
        *job_status_reasons(jobs),
        *page_counter_reasons(jobs, quality),
        *[r for r in cloud if not is_waiting(r)],
        *entity_key_reasons(imports, quality),
        *duplicate_reasons(imports, quality),
        *record_count_reasons(counted, previous_records, quality),
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
    return Judgement(
        state=state,
        reasons=(*run_reasons, *quarantine, *(waiting if state == CANDIDATE else [])),
        partitions=partitions,
        counted_records=counted,
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
