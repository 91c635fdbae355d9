"""Casting scraped values to a column's type, as a user writes them in the datasets file."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from config.columns import Column
from sync.acceptance.facts import NO_PARTITION, PartitionTally, RecordRules
from sync.acceptance.records import profile_record
from sync.bootstrap import Services
from sync.casts import RAW_KEPT, PlainValues, cast, cast_record, to_json

NUMERIC = Column("price", "price", "numeric")
COMMA = Column("price", "price", "numeric", decimal=",")
INTEGER = Column("stock", "stock", "integer")


@pytest.mark.parametrize(
    ("column", "raw", "expected"),
    [
        (NUMERIC, "$1,299.00", Decimal("1299.00")),
        (NUMERIC, "12.5", Decimal("12.5")),
        (NUMERIC, "USD 9.99", Decimal("9.99")),
        (NUMERIC, "(12.50)", Decimal("-12.50")),
        (NUMERIC, 3, Decimal(3)),
        (NUMERIC, 2.5, Decimal("2.5")),
        (COMMA, "1 299,99 €", Decimal("1299.99")),
        (COMMA, "1.299,99", Decimal("1299.99")),
        (COMMA, "12,5", Decimal("12.5")),
        (INTEGER, "1,200", 1200),
        (INTEGER, "1 200", 1200),
        (INTEGER, 4.0, 4),
        (Column("b", "b", "boolean"), "Yes", True),
        (Column("b", "b", "boolean"), "off", False),
        (Column("b", "b", "boolean"), 1, True),
        (Column("t", "t", "timestamp"), "2026-12-03", datetime(2026, 12, 3, tzinfo=UTC)),
        (
            Column("t", "t", "timestamp"),
            "2026-12-03T10:00:00+01:00",
            datetime(2026, 12, 3, 9, tzinfo=UTC),
        ),
        (Column("t", "t", "timestamp"), "2026-12-03 10:00", datetime(2026, 12, 3, 10, tzinfo=UTC)),
        (Column("t", "t", "timestamp"), 0, datetime(1970, 1, 1, tzinfo=UTC)),
        (Column("x", "x", "text"), 12, "12"),
        (Column("x", "x", "text"), True, "true"),
        (Column("x", "x", "text"), {"b": 1, "a": 2}, '{"a":2,"b":1}'),
        (Column("j", "j", "json"), ["a", "b"], ["a", "b"]),
    ],
)
def test_scraped_values_cast(column: Column, raw: Any, expected: Any) -> None:
    """The documented examples read as the documented values."""
    assert cast(column, raw) == (expected, None)


@pytest.mark.parametrize(
    ("column", "raw", "why"),
    [
        (NUMERIC, "n/a", "not a number"),
        (NUMERIC, "1,2", "not a number"),
        (NUMERIC, True, "a boolean is not a number"),
        (NUMERIC, float("nan"), "not a finite number"),
        (COMMA, "12.5", "decimal comma"),
        (INTEGER, "3.5", "not a whole number"),
        (INTEGER, "3 pcs", "not a number"),
        (INTEGER, "9" * 19, "out of the 64-bit integer range"),
        (Column("b", "b", "boolean"), "maybe", "not true/false"),
        (Column("t", "t", "timestamp"), "yesterday", "not an ISO 8601"),
    ],
)
def test_a_value_that_does_not_cast_is_null_with_the_failure_kept(
    column: Column, raw: Any, why: str
) -> None:
    """The column is NULL; the failure names the column, keeps the raw value and says why."""
    value, failure = cast(column, raw)
    assert value is None
    assert failure is not None
    assert failure.column == column.name
    assert failure.raw == raw or failure.raw != failure.raw  # NaN is not equal to itself
    assert why in failure.why
    assert set(failure.as_dict()) == {"column", "raw", "why"}


@pytest.mark.parametrize("raw", [None, "", "   ", [], {}])
def test_an_empty_value_is_null_and_no_failure(raw: Any) -> None:
    """Missing and blank values are NULL in every type, and never counted as failures."""
    for kind in ("text", "integer", "numeric", "boolean", "timestamp", "json"):
        assert cast(Column("c", "c", kind), raw) == (None, None)


def test_a_long_raw_value_is_cut() -> None:
    """A failure keeps at most RAW_KEPT characters of the raw value."""
    _, failure = cast(NUMERIC, "x" * 10_000)
    assert failure is not None
    assert len(failure.raw) == RAW_KEPT


def test_a_record_casts_each_column_from_its_field() -> None:
    """Columns read their own field; a failure in one leaves the others."""
    columns = (NUMERIC, Column("in_stock", "availability", "boolean"), Column("t", "title"))
    values, failures = cast_record(columns, {"price": "n/a", "availability": "yes", "title": "A"})
    assert values == {"price": None, "in_stock": True, "t": "A"}
    assert [f.as_dict() for f in failures] == [
        {"column": "price", "raw": "n/a", "why": "not a number (read with a decimal point)"}
    ]


def test_typed_values_as_json() -> None:
    """The change feed carries numerics as numbers and timestamps as ISO text."""
    assert to_json(Decimal("1299.00")) == 1299
    assert to_json(Decimal("12.5")) == 12.5
    assert to_json(datetime(2026, 12, 3, tzinfo=UTC)) == "2026-12-03T00:00:00+00:00"
    assert to_json("a") == "a"


@given(st.decimals(allow_nan=False, allow_infinity=False, places=2, max_value=10**9))
def test_a_plain_number_reads_back_as_itself(number: Decimal) -> None:
    """Any plain decimal written as text casts to the same number, grouped or not."""
    assert cast(NUMERIC, str(number))[0] == number
    assert cast(NUMERIC, f"{number:,}")[0] == number
    assert cast(COMMA, f"{number:,}".replace(",", " ").replace(".", ","))[0] == number


@given(st.one_of(st.text(), st.integers(), st.floats(), st.booleans(), st.none()))
def test_a_cast_never_raises(raw: Any) -> None:
    """Whatever a site writes, every type gives a value or a failure, never an exception."""
    for kind in ("text", "integer", "numeric", "boolean", "timestamp", "json"):
        value, failure = cast(Column("c", "c", kind), raw)
        assert failure is None or value is None


_MARKED_COLUMNS = (
    Column("v", "v"),
    Column("v", "v", "numeric"),
    Column("v", "v", "numeric", decimal=","),
    Column("v", "v", "integer"),
    Column("v", "v", "boolean"),
    Column("v", "v", "timestamp"),
    Column("v", "v", "json"),
)
_SCRAPED = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text().filter(lambda s: "\x00" not in s),  # a record holding NUL is never stored
    st.from_regex(r"-?[0-9]{1,32}(\.[0-9]{1,32})?", fullmatch=True),
    st.sampled_from(["", " ", "\u00a0", "\u3000x", "  \u2605", "-0", "007", "1,200", "1e3"]),
    st.lists(st.integers(), max_size=2),
)


@pytest.mark.postgres
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=_SCRAPED)
def test_a_value_the_import_marks_plain_is_read_by_the_database_as_the_casts_read_it(
    services: Services, value: Any
) -> None:
    """A first publication casts a row the import marked plain with one simple cast per column,
    unchecked: every value the mark admits must come out of it exactly as :func:`cast` gives
    it, and without a failure."""
    from sync.datasets.first_publication import _simple

    payload = json.dumps({"v": value})  # as stored: integers past 64 bits too
    marked = [c for c in _MARKED_COLUMNS if _plain_values((c,)).holds({"v": value})]
    if not marked:
        return
    with services.uow.begin() as session:
        got = session.execute(
            text(
                f"SELECT {', '.join(_simple(c, '(o.payload ->> :f)') for c in marked)} "  # noqa: S608 - built from constants
                "FROM (SELECT CAST(:p AS jsonb) AS payload) AS o"
            ),
            {"p": payload, "f": "v"},
        ).one()
    for column, read in zip(marked, got, strict=True):
        expected, failure = cast(column, value)
        assert failure is None, (column, value)
        assert read == expected, (column, value, read)
        assert type(read) is type(expected), (column, value, read)


def test_two_columns_reading_one_field_as_two_types_mark_no_record() -> None:
    """A value plain for one column may not be for another of the same field: no mark."""
    assert PlainValues.of((Column("a", "v"), Column("b", "v", "numeric"))) is None
    same = PlainValues.of((Column("a", "v", "numeric"), Column("b", "v", "numeric")))
    assert same is not None
    assert same.holds({"v": "1.5"})


_TYPED = (
    Column("price", "price", "numeric"),
    Column("stock", "stock", "integer"),
    Column("ok", "ok", "boolean"),
    Column("seen", "seen", "timestamp"),
)


@settings(max_examples=300, deadline=None)
@given(
    record=st.dictionaries(
        st.sampled_from(["title", "sku", "price", "stock", "ok", "seen"]), _SCRAPED, max_size=6
    ),
    typed=st.booleans(),
)
def test_the_tallys_pass_tells_the_plain_records_that_the_rule_tells(
    record: dict[str, Any], typed: bool
) -> None:
    """The import marks a record plain in the tally's one pass over its fields: exactly the
    records :meth:`PlainValues.holds` calls plain, for text columns and typed ones."""
    plain = _plain_values(_TYPED if typed else ())
    found = profile_record(PartitionTally(NO_PARTITION), record, RecordRules(), plain)[1]
    assert found == plain.holds(record)


@settings(max_examples=300, deadline=None)
@given(
    record=st.dictionaries(
        st.sampled_from(["title", "sku", "price", "stock", "ok", "seen"]), _SCRAPED, max_size=6
    ),
    checked=st.integers(min_value=0, max_value=len(_TYPED)),
)
def test_a_record_found_plain_is_judged_as_if_every_value_were_cast(
    record: dict[str, Any], checked: int
) -> None:
    """The import's tally casts only the values its plain check did not settle: a record's
    shape, and every count and sample of its tally, come out as when each value is cast,
    whichever of the typed columns the plain values were told of (a registry's columns may
    differ from the datasets file's)."""
    rules = RecordRules(casts=_TYPED)
    plain = PlainValues.of(_TYPED[:checked])
    assert plain is not None
    with_plain, cast_all = PartitionTally(NO_PARTITION), PartitionTally(NO_PARTITION)
    shape = profile_record(with_plain, record, rules, plain)[0]
    assert shape == profile_record(cast_all, record, rules)[0]
    assert with_plain == cast_all


@settings(max_examples=500, deadline=None)
@given(
    record=st.dictionaries(
        st.sampled_from(["title", "sku", "retailer", "price", "stock", "ok", "seen"]),
        st.one_of(_SCRAPED, st.sampled_from(["Accept all cookies", "WE USE COOKIES here"])),
        max_size=7,
    ),
    checked=st.integers(min_value=0, max_value=len(_TYPED)),
    required=st.sampled_from([(), ("sku",), ("sku", "price")]),
    casts=st.sampled_from([_TYPED, ()]),
)
def test_the_imports_shape_alone_is_the_one_a_tally_finds(
    record: dict[str, Any], checked: int, required: tuple[str, ...], casts: tuple[Column, ...]
) -> None:
    """The import keeps a record's shape without tallying it (and stops at its first defect):
    the shape and the plain mark are those the evaluation's tally finds, defects and all."""
    rules = RecordRules(
        required=required,
        parsers={"price": "number", "title": "url"},
        consent_markers=("accept all cookies", "we use cookies"),
        identity_fields=("sku", "retailer"),
        casts=casts,
    )
    plain = PlainValues.of(_TYPED[:checked])
    for given_plain in (plain, None):
        alone = profile_record(None, record, rules, given_plain)
        assert alone == profile_record(PartitionTally(NO_PARTITION), record, rules, given_plain)


def _plain_values(columns: tuple[Column, ...]) -> PlainValues:
    plain = PlainValues.of(columns)
    assert plain is not None
    return plain
