"""An export's records on their way to staging: what cannot be stored is set aside and counted
(per partition and reason, with the first few lines), what can is staged."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from sync.acceptance.facts import RecordRules
from sync.acceptance.records import profile_record
from sync.casts import PlainValues
from sync.cloud.download import InvalidRecord, KnownLines
from sync.identity import Identified, RecordIdentity, payload_of
from sync.ingest.line_digests import LineDigests
from sync.ingest.staging import ObservationStager

# --- records that cannot be stored ---------------------------------------------------------------

PARTITION_LIMIT = 200  # the width of observations.partition and partition_verdicts.partition
INVALID_SAMPLES = 20  # lines kept, with their numbers, in an attempt's invalid_detail
# records set aside whose entity is known, kept per record (their entity keeps its published
# row); past this many an export is garbage, which acceptance rejects anyway
SET_ASIDE_KEPT = 100_000


def record_problem(
    record: Mapping[str, Any],
    *,
    partition: str | None,
    canonical: str,
    start_url: str | None,
    max_record_bytes: int,
) -> tuple[str, str] | None:
    """Why a parsed record cannot be staged (reason code, detail), or None when it can: a NUL
    character in a key or value (no database text holds one), a partition value wider than its
    column, or a record over the size limit. (Unreadable lines are caught while the export is
    read.)"""
    if ("\\u0000" in canonical or "\x00" in (start_url or "")) and _has_nul(record):
        return "nul_character", "a key or value holds a NUL character"
    if partition is not None and len(partition) > PARTITION_LIMIT:
        return (
            "partition_too_long",
            f"partition value has {len(partition)} characters; at most {PARTITION_LIMIT} fit",
        )
    if len(canonical) > max_record_bytes // 4:
        size = len(canonical.encode())
        if size > max_record_bytes:
            return "record_too_large", f"{size} bytes; the limit is {max_record_bytes} bytes"
    return None


def values_at_fault(
    record: Mapping[str, Any], reason: str, detail: str, *, partition_field: str | None
) -> list[dict[str, Any]]:
    """The values that made a record unstorable, field by field: those holding a NUL, the
    overlong partition, or (a record too large) its largest values."""
    if reason == "nul_character":
        found = [
            {"field": str(k).replace("\x00", "\\0"), "reason": reason, "detail": detail}
            for k, v in record.items()
            if "\x00" in str(k) or _has_nul(v)
        ]
    elif reason == "partition_too_long":
        found = [{"field": partition_field or "partition", "reason": reason, "detail": detail}]
    else:
        sizes = sorted(((len(str(v)), str(k)) for k, v in record.items()), reverse=True)
        found = [
            {"field": k, "reason": reason, "detail": f"{n} characters; {detail}"}
            for n, k in sizes[:3]
        ]
    return found or [{"field": None, "reason": reason, "detail": detail}]


def _has_nul(value: Any) -> bool:
    """Whether a NUL character hides in any key or string of a parsed record."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in str(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


class SetAside:
    """The records one sync set aside as invalid, counted per partition and reason (records
    whose partition is unknown or unusable are "unplaced"), with the first few lines."""

    def __init__(self) -> None:
        self.count = 0
        self.partitions: dict[str, dict[str, int]] = {}
        self.unplaced: dict[str, int] = {}
        self.lines: list[dict[str, Any]] = []
        # the records whose entity is known: {"entity_key", "partition", "line", "reason",
        # "values"}; their entities keep their published rows (sync.datasets.materialise)
        self.entities: list[dict[str, Any]] = []

    def keep_entity(
        self, item: InvalidRecord, entity_key: str, values: list[dict[str, Any]]
    ) -> None:
        """Keep what was set aside of one record whose entity key is known."""
        if len(self.entities) < SET_ASIDE_KEPT:
            self.entities.append(
                {
                    "entity_key": entity_key,
                    "partition": item.partition
                    if item.partition is not None and len(item.partition) <= PARTITION_LIMIT
                    else None,
                    "line": item.line,
                    "reason": item.reason,
                    "values": values,
                }
            )

    def add(self, item: InvalidRecord) -> None:
        """Count one invalid record."""
        self.count += 1
        usable = item.partition is not None and len(item.partition) <= PARTITION_LIMIT
        bucket = self.partitions.setdefault(str(item.partition), {}) if usable else self.unplaced
        bucket[item.reason] = bucket.get(item.reason, 0) + 1
        if len(self.lines) < INVALID_SAMPLES:
            self.lines.append(
                {
                    "line": item.line,
                    "reason": item.reason,
                    "detail": item.detail,
                    "partition": item.partition if usable else None,
                }
            )

    def as_detail(self) -> dict[str, Any] | None:
        """What the attempt stores in invalid_detail (None when nothing was set aside)."""
        if not self.count:
            return None
        return {"partitions": self.partitions, "unplaced": self.unplaced, "lines": self.lines}


@dataclass
class ExportRead:
    """What reading one export found besides the records it staged."""

    read: int = 0
    missing_key: int = 0
    protected: int = 0
    invalid: SetAside = field(default_factory=SetAside)


def _shape(
    payload: dict[str, Any],
    rules: RecordRules,
    plain: PlainValues | None = None,
) -> tuple[str | None, bool]:
    """The shape of a record as its evaluation would find it in the stored payload, or None to
    leave it to the evaluation: a record with a defect, or one holding a number that the
    database would give back in another form (a float written with an exponent, an infinity
    stored as null, an integer past 64 bits), whose casts could then read otherwise; and
    whether its values are all ``plain`` (such a number leaves that to the publication too)."""
    for value in payload.values():
        kind = type(value)
        if kind is float:
            if not math.isfinite(value) or "e" in repr(value) or b"e" in orjson.dumps(value):
                return None, False
        elif kind is int and not -(2**63) <= value < 2**64:
            return None, False
    return profile_record(None, payload, rules, plain)


def _set_aside(
    invalid: SetAside,
    line: int,
    item: Mapping[str, Any],
    staged: Identified,
    identify: RecordIdentity,
    max_record_bytes: int,
) -> bool:
    """Whether a record cannot be stored; if so, it is set aside and counted (one bad record
    never sinks a job), and its entity kept with the values at fault."""
    partition = staged[2]
    problem = record_problem(
        item,
        partition=partition,
        canonical=staged[4],
        start_url=staged[3],
        max_record_bytes=max_record_bytes,
    )
    if problem is None:
        return False
    aside = InvalidRecord(line, *problem, partition=partition)
    invalid.add(aside)
    invalid.keep_entity(
        aside,
        staged[1],
        values_at_fault(item, *problem, partition_field=identify.dataset.partition),
    )
    return True


def stage_export(
    stager: ObservationStager,
    records: Iterable[tuple[int, Mapping[str, Any] | InvalidRecord | KnownLines]],
    identify: RecordIdentity,
    *,
    frozen: frozenset[str],
    max_record_bytes: int,
    tick: Callable[[int], None],
    lines: LineDigests | None = None,
    plain: PlainValues | None = None,
) -> ExportRead:
    """Stage every storable record of an export; set the others aside and count them.
    ``tick`` gets the count of lines read every thousand staged records. ``lines`` digests the
    lines as ``records`` reads them: each record is staged with its line's digest, and lines
    known as stored rows' come as KnownLines, counted by the stager. Where the stager copies
    straight in, a record whose values are all ``plain`` is marked so. Should it raise, the
    caller aborts the stager (:meth:`ObservationStager.abort`) before it rolls back."""
    found = ExportRead()
    invalid = found.invalid
    read = missing = protected = 0
    add, known = stager.add, stager.known
    quarter = max_record_bytes // 4
    # Records copied straight in, or merged while the export downloads, are stored with their
    # shape under the dataset's record rules (sync.runs.shapes): the evaluation then counts
    # them instead of reading them back (and makes its own tallies).
    rules = RecordRules.of(identify.dataset) if stager.takes_shapes else None
    prefix = rules.fingerprint + "|" if rules is not None else ""
    plain = plain if stager.takes_plain else None
    plain_for = None if plain is None else plain.fingerprint
    for line, item in records:
        if isinstance(item, KnownLines):
            known(item.indexes)
            before, read = read, read + len(item.indexes)
            for mark in range(before // 1000 + 1, read // 1000 + 1):  # each thousand passed
                tick(mark * 1000)
            continue
        read += 1
        if isinstance(item, InvalidRecord):
            invalid.add(item)
            continue
        payload = payload_of(item)  # one copy, for its identity and its shape
        staged = identify(item, payload)
        if staged is None:
            missing += 1
            continue
        if frozen and staged[2] in frozen:
            protected += 1  # a recovery batch never rewrites a partition that passed
            continue
        partition, start_url, canonical = staged[2], staged[3], staged[4]
        if (  # only what record_problem could refuse is checked by it
            "\\u0000" in canonical
            or len(canonical) > quarter
            or (partition is not None and len(partition) > PARTITION_LIMIT)
            or (start_url is not None and "\x00" in start_url)
        ) and _set_aside(invalid, line, item, staged, identify, max_record_bytes):
            continue
        shape, marked = None, False
        if rules is not None:
            shape, marked = _shape(payload, rules, plain)
        add(
            staged,
            lines.digest_of(line) if lines is not None else None,
            None if shape is None else prefix + shape,
            plain_for if marked else None,
        )
        if read % 1000 == 0:
            tick(read)
    stager.flush()  # the end of the export: a copy straight into observations ends here
    found.read, found.missing_key, found.protected = read, missing, protected
    return found
