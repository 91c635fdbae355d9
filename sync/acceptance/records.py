"""One record's defects (missing required fields, values that do not parse or do not cast to
their column's type, consent pages, empty shells) and the fields it fills, tallied per partition
as the run's records stream by."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sync.acceptance.facts import NO_PARTITION, PartitionTally, RecordRules
from sync.acceptance.parsers import PARSERS, is_filled
from sync.casts import cast


def is_consent_page(record: Mapping[str, Any], markers: Sequence[str]) -> bool:
    """Whether any text field of a record carries a consent or bot-wall marker."""
    # one lowered text per record, each field apart (no marker holds the NUL between them)
    text = "\x00".join(v for v in record.values() if isinstance(v, str)).lower()
    return any(marker in text for marker in markers)


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
    unparsable: set[str] = set()
    for name, parser in rules.parsers.items():
        value = record.get(name)
        if is_filled(value) and not PARSERS[parser](value):
            unparsable.add(name)
            tally.unparsable[name] = tally.unparsable.get(name, 0) + 1
            tally.note(f"unparsable:{name}", value)
    for column in rules.casts:
        if column.field in unparsable:  # one bad value counts once
            continue
        value = record.get(column.field)
        if cast(column, value)[1] is not None:
            tally.unparsable[column.field] = tally.unparsable.get(column.field, 0) + 1
            tally.note(f"unparsable:{column.field}", value)
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
