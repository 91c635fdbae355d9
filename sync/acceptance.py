"""Acceptance rules: whether a run's data is good enough to publish. Pure functions over counts,
records and thresholds, with no I/O, so every rule is tested with plain values.

"HTTP 200" is never "data success". A run is judged on four kinds of evidence:

- Cloud's job counters (failed, empty and no-value pages against pages scheduled) and the job's
  final status;
- Cloud's own data-quality result, one more gate that a dataset may switch off;
- the run as a whole: records without their entity key, entity keys seen twice with different
  payloads, the record count against the dataset's minimum;
- each partition's records: required fields present, values that parse (``price`` as a number),
  and pages that are not data (a consent page, an empty shell);
- the dataset's history: the run's profile (records per partition, each field's fill rate)
  against the median of its last accepted runs' profiles (the baseline). With fewer accepted
  runs than ``min_history`` only the rules above apply. A gain is never a failure; a drop in
  volume, in a field's fill rate or in one partition's records beyond its threshold is, and a
  field every baseline run had that this run lacks is too. A drop confined to one partition
  quarantines that partition; a drop across the run rejects it.

A failing run-level rule rejects the run. A failing partition is quarantined; the dataset's
policy then rejects the whole run (``reject``) or publishes the partitions that passed
(``publish_passing``). Every reason carries the numbers behind it (``got``, ``expected``, and
``baseline`` for the history rules); every rule applied is also kept as a :class:`Check`, pass
or fail, so an operator can see how close a run came.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from config.datasets import Dataset, Quality

NO_PARTITION = "(none)"
WAITING = "waiting"
NOTE = "note"
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
    baseline: float | int | str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The reason as plain JSON-able values, as stored and shown by status."""
        return {
            "code": self.code,
            "message": self.message,
            "got": self.got,
            "expected": self.expected,
            "partition": self.partition,
            **({"baseline": self.baseline} if self.baseline is not None else {}),
            **({"detail": dict(self.detail)} if self.detail else {}),
        }


@dataclass(frozen=True)
class Check:
    """One rule applied to one figure of a run: what the run got, the baseline it was held
    against (history rules only), what the rule allowed, and the reason when it failed."""

    rule: str
    got: float | int | str | None
    allowed: str
    baseline: float | int | str | None = None
    subject: str | None = None
    reason: Reason | None = None

    @property
    def passed(self) -> bool:
        """Whether the figure is within what the rule allows."""
        return self.reason is None

    def as_dict(self) -> dict[str, Any]:
        """The check as plain JSON-able values."""
        return {
            "rule": self.rule,
            "subject": self.subject,
            "verdict": "pass" if self.passed else "fail",
            "got": self.got,
            "baseline": self.baseline,
            "allowed": self.allowed,
            **({"message": self.reason.message} if self.reason is not None else {}),
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
    # records set aside as invalid, by reason: per partition, and those of no usable partition
    invalid_partitions: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    invalid_unplaced: Mapping[str, int] = field(default_factory=dict)


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
    filled: dict[str, int] = field(default_factory=dict)

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
class Profile:
    """What one run held: records per partition and each field's fill rate (percent of records
    where it is present and non-empty), over the run and per partition."""

    records: int
    partitions: Mapping[str, int]
    fill_rates: Mapping[str, float]
    partition_fill_rates: Mapping[str, Mapping[str, float]]
    run_id: str | None = None

    @property
    def fields(self) -> frozenset[str]:
        """The fields seen: filled in at least one record (a column of blanks carries nothing)."""
        return frozenset(name for name, rate in self.fill_rates.items() if rate > 0)

    def as_dict(self) -> dict[str, Any]:
        """The profile as plain JSON-able values."""
        return {
            "run_id": self.run_id,
            "records": self.records,
            "partitions": dict(self.partitions),
            "fill_rates": dict(self.fill_rates),
            "partition_fill_rates": {p: dict(r) for p, r in self.partition_fill_rates.items()},
            "fields": sorted(self.fields),
        }


@dataclass(frozen=True)
class Baseline:
    """A dataset's recent history, newest first: each figure is the median over these runs."""

    runs: tuple[Profile, ...]

    @property
    def run_ids(self) -> tuple[str, ...]:
        """The runs the baseline is made of, newest first."""
        return tuple(r.run_id or "?" for r in self.runs)

    def records_of(self, partitions: Iterable[str]) -> float:
        """The median of the records these partitions held in each baseline run."""
        names = set(partitions)
        return _median([sum(n for p, n in r.partitions.items() if p in names) for r in self.runs])

    def partition_records(self, partition: str) -> float:
        """The median of one partition's records (0 in a run that lacked it)."""
        return _median([r.partitions.get(partition, 0) for r in self.runs])

    @property
    def partition_names(self) -> frozenset[str]:
        """The partitions with a baseline: present in enough runs for their median to be > 0."""
        seen = {p for r in self.runs for p in r.partitions}
        return frozenset(p for p in seen if self.partition_records(p) > 0)

    def fill_rate(self, name: str) -> float:
        """The median fill rate of a field over the run (0 in a run that never filled it)."""
        return _median([r.fill_rates.get(name, 0.0) for r in self.runs])

    def partition_fill_rate(self, partition: str, name: str) -> float:
        """The median fill rate of a field in one partition, over the runs that had it."""
        return _median(
            [
                r.partition_fill_rates.get(partition, {}).get(name, 0.0)
                for r in self.runs
                if r.partitions.get(partition)
            ]
        )

    @property
    def fields_in_every_run(self) -> frozenset[str]:
        """The fields every baseline run had."""
        return frozenset.intersection(*(r.fields for r in self.runs))

    @property
    def fields_in_any_run(self) -> frozenset[str]:
        """The fields some baseline run had."""
        return frozenset().union(*(r.fields for r in self.runs))


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


@dataclass(frozen=True)
class Judgement:
    """The verdict on a run: accepted, rejected or still a candidate, and why; with the run's
    profile, the baseline it was judged against (if any) and every rule applied."""

    state: str
    reasons: tuple[Reason, ...]
    partitions: tuple[PartitionJudgement, ...]
    counted_records: int
    profile: Profile | None = None
    baseline: Baseline | None = None
    checks: tuple[Check, ...] = ()

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
    """Count one record's defects, and the fields it fills, into its partition's tally."""
    tally.records += 1
    filled = tally.filled
    for name, value in record.items():
        if is_filled(value):
            filled[name] = filled.get(name, 0) + 1
        elif name not in filled:
            filled[name] = 0
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


def _page_counts(
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
    for code, threshold_name, verb, pages, scheduled, urls in _page_counts(jobs):
        got = percent(pages, scheduled)
        expected = float(getattr(quality, threshold_name))
        if got > expected:
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
            f"{_num(quality.max_invalid_records_percent)}%)",
            got=got,
            expected=_num(quality.max_invalid_records_percent),
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
                    f"{_num(limit)}%)",
                    got=got,
                    expected=_num(limit),
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
            f"{_num(quality.max_conflicting_duplicates_percent)}%)",
            got=got,
            expected=_num(quality.max_conflicting_duplicates_percent),
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


# --- history ------------------------------------------------------------------------------------


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
    newest first), or None while it has fewer than ``min_history``: a cold start is judged by
    the absolute rules only."""
    runs = tuple(history[: quality.baseline_runs])
    if not runs or len(runs) < quality.min_history:
        return None
    return Baseline(runs)


def _drop_percent(got: float, baseline: float) -> float:
    return round(100.0 * (baseline - got) / baseline, 2) if baseline else 0.0


def _runs_text(runs: int) -> str:
    return f"the median of the last {runs} accepted run{'s' if runs != 1 else ''}"


def record_drop_check(
    records: int, baseline: float | None, quality: Quality, *, runs: int = 0
) -> Check | None:
    """The run's records against the baseline's: a drop beyond ``max_record_drop_percent``
    fails, a gain never does. None when there is nothing to compare with."""
    limit = quality.max_record_drop_percent
    if limit is None or baseline is None or baseline <= 0:
        return None
    floor = baseline * (1 - limit / 100.0)
    allowed = f">= {_num(floor)} (at most {_num(limit)}% below)"
    drop = _drop_percent(records, baseline)
    if drop <= limit:
        return Check("record_drop", records, allowed, baseline=_num(baseline))
    reason = Reason(
        "record_drop",
        f"{records} records against a baseline of {_num(baseline)} ({_runs_text(runs)}): a "
        f"drop of {drop}% > {_num(limit)}%",
        got=records,
        expected=_num(floor),
        baseline=_num(baseline),
        detail={"drop_percent": drop, "max_drop_percent": _num(limit), "baseline_runs": runs},
    )
    return Check("record_drop", records, allowed, baseline=_num(baseline), reason=reason)


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
        rate = _num(baseline.fill_rate(name))
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
        f"{name!r} is filled in {_num(got)}% of records{where} against a baseline of "
        f"{_num(base)}% ({_runs_text(runs)}): {_num(drop)} points down > {_num(limit)}",
        got=_num(got),
        expected=_num(max(0.0, base - limit)),
        baseline=_num(base),
        partition=partition,
        detail={
            "field": name,
            "drop_points": _num(drop),
            "max_drop_points": _num(limit),
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
        allowed = f">= {_num(max(0.0, base - limit))}% (at most {_num(limit)} points below)"
        failing: list[Check] = []
        for partition in judged:
            p_base = baseline.partition_fill_rate(partition, name)
            p_got = profile.partition_fill_rates.get(partition, {}).get(name, 0.0)
            if p_base - p_got > limit:
                reason = _fill_reason(name, p_got, p_base, limit, runs, partition)
                p_allowed = f">= {_num(max(0.0, p_base - limit))}% in {partition}"
                failing.append(
                    Check(
                        "fill_rate_drop",
                        _num(p_got),
                        p_allowed,
                        baseline=_num(p_base),
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
                    _num(got),
                    allowed,
                    baseline=_num(base),
                    subject=name,
                    reason=reason,
                )
            )
            continue
        checks.append(
            Check("fill_rate_drop", _num(got), allowed, baseline=_num(base), subject=name)
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
        allowed = f">= {_num(floor)} (at most {_num(limit)}% below)"
        drop = _drop_percent(got, base)
        reason = None
        if drop > limit:
            reason = Reason(
                "partition_drop",
                f"{got} records in partition {partition!r} against a baseline of {_num(base)} "
                f"({_runs_text(runs)}): a drop of {drop}% > {_num(limit)}%",
                got=got,
                expected=_num(floor),
                baseline=_num(base),
                partition=partition,
                detail={
                    "drop_percent": drop,
                    "max_drop_percent": _num(limit),
                    "baseline_runs": runs,
                },
            )
        checks.append(
            Check(
                "partition_drop",
                got,
                allowed,
                baseline=_num(base),
                subject=partition,
                reason=reason,
            )
        )
    return checks


# --- every rule as a check (for ``scrapesync check``) ---------------------------------------


def _failed(reasons: Iterable[Reason], code: str) -> list[Reason]:
    return [r for r in reasons if r.code == code]


def _percent_check(
    code: str, got: float, limit: float, reasons: Sequence[Reason], subject: str | None = None
) -> list[Check]:
    allowed = f"<= {_num(limit)}%"
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
    for code, threshold_name, _verb, pages, scheduled, _urls in _page_counts(jobs):
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


# --- the verdict ----------------------------------------------------------------------------


def is_waiting(reason: Reason) -> bool:
    """Whether a reason says what the run waits for rather than what is wrong with it."""
    return reason.detail.get("kind") == WAITING


def is_note(reason: Reason) -> bool:
    """Whether a reason only reports something (a new field), failing nothing."""
    return reason.detail.get("kind") == NOTE


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
