"""A dataset's first publication on PostgreSQL: the rows whose every value is plain are cast and
copied by the database in one ``INSERT … SELECT``, so that only the rest pass through Python.

"Plain" is chosen so that the database reads a value exactly as :func:`sync.casts.cast` does, which
stays the one definition of a cast: a missing or null value; an empty string (NULL); text that
starts with a printable ASCII character other than a space, or holds an ASCII letter or digit, for a
``text`` column (kept as it is: Python's ``strip`` leaves something of it); ``-?digits(.digits)?``
written as a string, or a whole JSON number, for a ``numeric`` column; a string or a JSON number of
at most 18 digits for an ``integer`` column; a JSON ``true`` or ``false`` for a ``boolean`` column.
Anything else (currency signs, grouping, decimal commas, fractions written as JSON numbers,
timestamps, JSON values, and every value that fails its cast) takes the row through Python, whose
casts keep the failures.

The first sync of a dataset never published checks each record it copies straight in against
the same rule where it reads its values anyway (:class:`sync.casts.PlainValues`, whose rule for
text is Python's own: any string that is not blank), and marks the rows it finds plain
(``observations.plain_for``): those are cast here without a check, the rest checked here.

The rows go into the empty table with its primary key set aside, and the key is built from them
after, in one pass over the sorted keys (:func:`_key_built_after`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from config.columns import Column
from sync.acceptance import row_states
from sync.casts import PlainValues
from sync.datasets.rows import target_name
from sync.datasets.tables import DatasetTables
from sync.models import Observation

_ALNUM = "[A-Za-z0-9]"
# A text's first character read as printable ASCII other than a space tells that it is not blank
# at the cost of one character: most scraped text starts so, and the regular expression after
# it, for the rest, is most of the time a first publication spends checking values.
_PRINTABLE = "BETWEEN 33 AND 126"
_MAX_DIGITS = 30  # on either side of a plain numeric value's decimal point
_BIGINT_DIGITS = 18  # a plain integer's digits: always within 64 bits
# how long a first publication waits for its table before it leaves the key in place
_KEY_LOCK_TIMEOUT = "1s"


# Unbounded patterns with the digit counts checked by length: PostgreSQL's regular expressions
# spend several times longer on a bounded repetition such as [0-9]{1,30}.
def _decimal(s: str) -> str:
    """``s`` is ``-?digits(.digits)?`` with at most _MAX_DIGITS digits on either side."""
    n = _MAX_DIGITS
    return (
        f"({s} ~ '^-?[0-9]+(\\.[0-9]+)?$' AND (length({s}) <= {n} OR "
        f"(length(ltrim(split_part({s}, '.', 1), '-')) <= {n} "
        f"AND length(split_part({s}, '.', 2)) <= {n})))"
    )


def _whole(s: str, digits: int) -> str:
    """``s`` is ``-?digits`` with at most ``digits`` digits."""
    return f"({s} ~ '^-?[0-9]+$' AND length(ltrim({s}, '-')) <= {digits})"


def _plain(column: Column, t: str, s: str) -> tuple[str, str]:
    """(the condition that a value is plain, the SQL that casts it), the value given by its
    JSON type ``t`` (NULL when the field is missing) and its text ``s``."""
    absent = f"({t} IS NULL OR {t} = 'null' OR ({t} = 'string' AND {s} = ''))"
    if column.type == "text":
        return (
            f"({absent} OR ({t} = 'string' AND (ascii({s}) {_PRINTABLE} OR {s} ~ '{_ALNUM}')))",
            f"CASE WHEN {t} = 'string' AND {s} <> '' THEN {s} END",
        )
    if column.type == "numeric" and column.decimal == ".":
        return (
            f"({absent} OR ({t} = 'string' AND {_decimal(s)})"
            f" OR ({t} = 'number' AND {_whole(s, _MAX_DIGITS)}))",
            f"CASE WHEN {t} IN ('string', 'number') AND {s} <> '' THEN ({s})::numeric END",
        )
    if column.type == "integer":
        return (
            f"({absent} OR ({t} IN ('string', 'number') AND {_whole(s, _BIGINT_DIGITS)}))",
            f"CASE WHEN {t} IN ('string', 'number') AND {s} <> '' THEN ({s})::bigint END",
        )
    if column.type == "boolean":
        return (
            f"({absent} OR {t} = 'boolean')",
            f"CASE WHEN {t} = 'boolean' THEN ({s})::boolean END",
        )
    return absent, "NULL"


@dataclass(frozen=True)
class PlainCasts:
    """The SQL that reads a table's columns from ``o.payload``: ``extracted`` takes each
    field's JSON type and text once (select it in a ``LATERAL`` named ``e``), ``conditions`` say
    that each value is plain and ``values`` cast it; ``params`` bind the fields' names."""

    params: dict[str, Any]
    extracted: str
    conditions: tuple[str, ...]
    values: tuple[str, ...]


def plain_casts(tables: DatasetTables) -> PlainCasts:
    """The plain-value casts of the dataset's columns (see the module)."""
    params: dict[str, Any] = {}
    conditions: list[str] = []
    values: list[str] = []
    extracted: list[str] = []
    for i, column in enumerate(tables.columns):
        params[f"f{i}"] = column.field
        extracted.append(f"jsonb_typeof(o.payload -> :f{i}) AS t{i}, o.payload ->> :f{i} AS s{i}")
        condition, value = _plain(column, f"e.t{i}", f"e.s{i}")
        conditions.append(condition)
        values.append(value)
    return PlainCasts(params, ", ".join(extracted), tuple(conditions), tuple(values))


def _simple(column: Column, value: str) -> str:
    """The SQL that casts a value known to be absent or plain (``value`` its text)."""
    sql_type = {"text": "", "integer": "bigint", "boolean": "boolean"}.get(column.type)
    if column.type == "numeric" and column.decimal == ".":
        sql_type = "numeric"
    if sql_type is None:
        return "NULL"  # only an absent value is plain
    absent_as_null = f"NULLIF({value}, '')"
    return f"CAST({absent_as_null} AS {sql_type})" if sql_type else absent_as_null


def copy_plain_rows(
    session: Session, tables: DatasetTables, *, run_id: str, window: str, start: datetime
) -> int:
    """Write to the (empty) table every valid observation of the run whose values are all
    plain; returns how many rows were written. A row marked as it was copied in as holding
    only plain values (:class:`sync.casts.PlainValues`, under the table's columns) is cast
    without a check; the others' values are checked here."""
    quote = session.get_bind().dialect.identifier_preparer.quote
    casts = plain_casts(tables)
    marks = PlainValues.of(tables.columns)
    params: dict[str, Any] = {
        **casts.params,
        "run_id": run_id,
        "window": window,
        "start": start,
        "plain": "" if marks is None else marks.fingerprint,  # "": no row's mark
    }
    marked = "o.plain_for = :plain"
    values = (
        # a column only an absent value is plain for is NULL either way (and keeps its type)
        v
        if v == "NULL"
        else f"CASE WHEN {marked} THEN {_simple(c, f'(o.payload ->> :f{i})')} ELSE {v} END"
        for i, (c, v) in enumerate(zip(tables.columns, casts.values, strict=True))
    )
    names = ", ".join(quote(c.name) for c in tables.columns)
    target = target_name(session, tables.current)
    statement = (
        f"INSERT INTO {target} (entity_key, {names}, partition, "  # noqa: S608 - names are quoted identifiers
        "run_id, collection_window, first_seen_at, last_changed_at, cast_failures, payload_hash, "
        "changed_by_run_id) "
        f"SELECT o.entity_key, {', '.join(values)}, o.partition, CAST(:run_id AS text), "
        "CAST(:window AS text), CAST(:start AS timestamptz), "
        "CAST(:start AS timestamptz), NULL, o.payload_hash, CAST(:run_id AS text) "
        f"FROM {Observation.__tablename__} o "
        # an unmarked row's values have their type and text taken from the payload once (OFFSET
        # 0 keeps the planner from inlining them into every condition that reads them)
        f"LEFT JOIN LATERAL (SELECT {casts.extracted} WHERE o.plain_for IS DISTINCT FROM "
        f":plain OFFSET 0) AS e ON true WHERE {row_states.valid_sql()} "
        f"AND ({marked} OR ({' AND '.join(casts.conditions) or 'true'}))"
    )
    with _key_built_after(session, target):
        result = cast(CursorResult[Any], session.execute(text(statement), params))
    return int(result.rowcount or 0)


@contextmanager
def _key_built_after(session: Session, target: str) -> Iterator[None]:
    """The rows written with the table's primary key set aside and the key built after them,
    from its sorted keys at once: inserted row by row, each key descends the index, whose pages
    a run's rows push out of PostgreSQL's buffers and read back (100,000 rows: 1.24 s against
    1.78 s, the statement alone). Only while the table is empty, and only if the key can go at
    once: setting it aside locks the table until the transaction ends (readers wait for the
    published rows instead of reading none), so a reader holding the table, or a foreign key of
    the user's referring to it, leaves the key in place and the rows go in beside it."""
    found = (
        "SELECT c.conname FROM pg_constraint c WHERE c.conrelid = CAST(:t AS regclass) "  # noqa: S608 - a quoted name
        f"AND c.contype = 'p' AND NOT EXISTS (SELECT 1 FROM {target})"
    )
    key = session.execute(text(found), {"t": target}).scalar_one_or_none()
    set_aside = False
    if key is not None:
        quoted = session.get_bind().dialect.identifier_preparer.quote(key)
        conn = session.connection()
        waited = conn.exec_driver_sql("SHOW lock_timeout").scalar_one()
        conn.exec_driver_sql("SAVEPOINT pub_key")
        try:
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{_KEY_LOCK_TIMEOUT}'")
            conn.exec_driver_sql(f"ALTER TABLE {target} DROP CONSTRAINT {quoted}")
        except DBAPIError:  # a reader holds the table, or a key of the user's refers to it
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT pub_key")
        else:
            set_aside = True
            # the transaction's other statements wait for locks as they did before
            conn.exec_driver_sql("SELECT set_config('lock_timeout', %s, true)", (waited,))
        conn.exec_driver_sql("RELEASE SAVEPOINT pub_key")
    yield
    if set_aside:
        session.execute(
            text(f"ALTER TABLE {target} ADD CONSTRAINT {quoted} PRIMARY KEY (entity_key)")
        )
