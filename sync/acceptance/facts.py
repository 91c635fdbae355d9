"""What acceptance judges and what a judgement says, as plain values: the facts of a run's
jobs and imports, per-partition tallies of its records, profiles and the baseline made of them,
reasons and checks with their numbers, and the verdicts on partitions and on the run."""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from config.columns import Column
from config.datasets import Dataset
from sync.states import RunState

NO_PARTITION = "(none)"
WAITING = "waiting"
NOTE = "note"
SAMPLES = 3
UNFAILING_TYPES = ("text", "json")  # column types every value casts to
TALLY_VERSION = 1  # raise when a record is tallied differently: kept shapes then go unused

ACCEPTED = RunState.ACCEPTED
REJECTED = RunState.REJECTED
CANDIDATE = RunState.CANDIDATE


def percent(part: int, whole: int) -> float:
    """``part`` as a percentage of ``whole``, rounded to two decimals (0 when whole is 0)."""
    return round(100.0 * part / whole, 2) if whole else 0.0


def figure(value: float) -> float | int:
    """A number as reasons show it: a whole number as an int, any other to two decimals."""
    return int(value) if float(value).is_integer() else round(value, 2)


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
    # the typed columns whose casts can fail (every configured column but text and json): a
    # value that does not cast counts as unparsable under its field's name
    casts: tuple[Column, ...] = ()

    @property
    def fingerprint(self) -> str:
        """A short digest of these rules (and of the tally's version): a record's shape is kept
        under it, so a change of the datasets file judges every record again."""
        described = repr(
            (
                TALLY_VERSION,
                self.required,
                sorted(self.parsers.items()),
                self.consent_markers,
                self.identity_fields,
                self.casts,
            )
        )
        return hashlib.blake2b(described.encode(), digest_size=8).hexdigest()

    @classmethod
    def of(cls, dataset: Dataset) -> RecordRules:
        """The record rules configured for ``dataset``."""
        identity = dataset.entity_key + ((dataset.partition,) if dataset.partition else ())
        return cls(
            required=dataset.required,
            parsers=dict(dataset.quality.parsers),
            consent_markers=tuple(m.lower() for m in dataset.quality.consent_markers),
            identity_fields=identity,
            casts=tuple(c for c in dataset.columns if c.type not in UNFAILING_TYPES),
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
