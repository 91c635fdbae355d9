"""One record's defects (missing required fields, values that do not parse or do not cast to
their column's type, consent pages, empty shells) and the fields it fills, tallied per partition
as the run's records stream by."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from sync.acceptance.facts import NO_PARTITION, PartitionTally, RecordRules
from sync.acceptance.parsers import PARSERS, is_filled
from sync.casts import PlainValues, cast


def _carries_marker(texts: list[str], markers: Sequence[str]) -> bool:
    """Whether any of ``texts`` carries one of ``markers`` (lower case)."""
    # one lowered text per record, each field apart (no marker holds the NUL between them)
    text = "\x00".join(texts).lower()
    for marker in markers:  # noqa: SIM110 - a plain loop: half the steps of any() over a generator
        if marker in text:
            return True
    return False


def is_empty_shell(record: Mapping[str, Any], identity_fields: Sequence[str]) -> bool:
    """Whether a record has content fields and every one of them is empty (a page that rendered
    its frame but no data)."""
    content = [k for k in record if k not in identity_fields]
    return bool(content) and not any(is_filled(record[k]) for k in content)


def tally_record(
    tally: PartitionTally, record: Mapping[str, Any], rules: RecordRules
) -> str | None:
    """Count one record's defects, and the fields it fills, into its partition's tally; return
    its shape when it has no defect (the fields it fills and those it leaves empty: all that it
    counted besides one record, see :func:`add_shape`), None when it has one."""
    return profile_record(tally, record, rules)[0]


def profile_record(
    tally: PartitionTally | None,
    record: Mapping[str, Any],
    rules: RecordRules,
    plain: PlainValues | None = None,
) -> tuple[str | None, bool]:
    """:func:`tally_record`'s shape, and whether every value of the record is ``plain``
    (:meth:`PlainValues.holds`; False without ``plain``). Without a ``tally`` nothing is
    counted, and the first defect ends the look (the import keeps the shape alone).

    Every record of a run passes here: one pass over its fields serves the fill counts, the
    empty-shell check and the text columns' share of the plain check (a text is plain when it
    is empty or not blank, which the fill count tells)."""
    filled = None
    if tally is not None:
        tally.records += 1
        filled = tally.filled
    identity = rules.identity_fields
    content = content_filled = False
    full: list[str] = []
    empty: list[str] = []
    texts: list[str] = []  # for the consent check, in the record's order
    is_plain = plain is not None
    typed = plain.typed_fields if plain is not None else {}
    for name, value in record.items():
        if type(value) is str:  # the commonest case: :func:`is_filled` without its dispatch
            texts.append(value)
            has = bool(value.strip())
        else:
            if isinstance(value, str):
                texts.append(value)
            has = is_filled(value)
            if value is not None and name not in typed:
                is_plain = False  # a text column's value that is not a string
        if has:
            full.append(name)
            if filled is not None:
                filled[name] = filled.get(name, 0) + 1
            if name not in identity:
                content = content_filled = True
        else:
            if value and name not in typed:
                is_plain = False  # blank text, which the casts read as NULL
            empty.append(name)
            if filled is not None and name not in filled:
                filled[name] = 0
            if name not in identity:
                content = True
    if is_plain and typed:
        is_plain = plain is not None and plain.holds_typed(record)
    shell = content and not content_filled  # is_empty_shell, from the pass above
    if not _clean(tally, record, rules, plain if is_plain else None, texts, full, shell):
        return None, is_plain
    return _shape(full, empty), is_plain


def _clean(
    tally: PartitionTally | None,
    record: Mapping[str, Any],
    rules: RecordRules,
    plain: PlainValues | None,
    texts: list[str],
    full: list[str],
    shell: bool,
) -> bool:
    """Whether a record has no defect. With a ``tally``, each defect is counted there, with
    samples; without one, the first ends the look. ``plain``: given when the record is plain;
    ``texts`` and ``full``: its texts and the fields it fills; ``shell``: it is an empty shell
    (all from :func:`profile_record`'s pass)."""
    clean = True
    for name in rules.required:
        if name not in full:  # missing, or empty
            if tally is None:
                return False
            tally.missing[name] = tally.missing.get(name, 0) + 1
            clean = False
    unparsable: set[str] = set()
    for name, parser in rules.parsers.items():
        if name in full and not PARSERS[parser](value := record[name]):
            if tally is None:
                return False
            unparsable.add(name)
            tally.unparsable[name] = tally.unparsable.get(name, 0) + 1
            tally.note(f"unparsable:{name}", value)
    # a record found plain has its values' casts settled where its typed columns read them
    for column in plain.unsettled(rules.casts) if plain is not None else rules.casts:
        if column.field in unparsable:  # one bad value counts once
            continue
        value = record.get(column.field)
        if cast(column, value)[1] is not None:
            if tally is None:
                return False
            clean = False
            tally.unparsable[column.field] = tally.unparsable.get(column.field, 0) + 1
            tally.note(f"unparsable:{column.field}", value)
    if rules.consent_markers and _carries_marker(texts, rules.consent_markers):
        if tally is None:
            return False
        tally.consent_pages += 1
        title = record.get("title")
        tally.note("consent", title if is_filled(title) else dict(record))
        clean = False
    elif shell:
        if tally is None:
            return False
        tally.empty_shells += 1
        clean = False
    return clean and not unparsable


_SHAPES: dict[tuple[str | None, ...], str] = {}  # field names in a record's order -> shape
_SHAPES_KEPT = 4096  # shapes kept: records of a run share a few


def _shape(full: list[str], empty: list[str]) -> str:
    """The shape of a record that fills ``full`` and leaves ``empty``, in name order (the same
    record read in another key order has the same shape); the text made once per field order."""
    key = (*full, None, *empty)
    found = _SHAPES.get(key)
    if found is None:
        found = orjson.dumps([sorted(full), sorted(empty)]).decode()
        if len(_SHAPES) < _SHAPES_KEPT:
            _SHAPES[key] = found
    return found


def add_shape(tally: PartitionTally, found: str, records: int) -> None:
    """Count ``records`` records of one shape (as :func:`tally_record` returns it) into a tally,
    as :func:`tally_record` would count each of them."""
    filled_names, empty_names = orjson.loads(found)
    tally.records += records
    filled = tally.filled
    for name in filled_names:
        filled[name] = filled.get(name, 0) + records
    for name in empty_names:
        if name not in filled:
            filled[name] = 0


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
