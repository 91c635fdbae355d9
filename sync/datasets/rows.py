"""Writing, finding and deleting many rows of a dataset's tables in few statements: COPY on
PostgreSQL once there are enough rows to pay for it, one executemany INSERT otherwise (and on
SQLite); a batch of keys as one array on PostgreSQL, in IN lists elsewhere."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson
from sqlalchemy import JSON, ColumnElement, Table, any_, bindparam, delete, insert, null
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

COPY_FROM = 500  # rows: below this a multi-row INSERT is as quick as COPY's set-up
CHUNK = 500  # keys per IN (...) list, well under any driver's parameter limit


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def key_matches(
    session: Session, column: ColumnElement[Any], keys: Sequence[Any]
) -> Iterator[ColumnElement[bool]]:
    """Conditions that together match the rows whose ``column`` is one of ``keys``: one
    ``= ANY(array)`` on PostgreSQL (one statement, one parameter), IN lists of ``CHUNK`` keys
    elsewhere."""
    if not keys:
        return
    if session.get_bind().dialect.name == "postgresql":
        yield column == any_(bindparam(None, list(keys), type_=ARRAY(column.type)))
        return
    for part in chunks(keys):
        yield column.in_(part)


def _json_text(value: Any) -> str:
    """A JSON column's value as COPY's text (orjson: several times quicker than the ``json``
    module psycopg's ``Jsonb`` would use), or through ``json`` for what orjson refuses (an
    integer beyond 64 bits: a wide numeric column's before and after)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value)


def target_name(session: Session, table: Table) -> str:
    """A table's name as SQL text, quoted (schema-qualified when it has one)."""
    quote = session.get_bind().dialect.identifier_preparer.quote
    return f"{quote(table.schema)}.{quote(table.name)}" if table.schema else quote(table.name)


def insert_rows(session: Session, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (column name -> value; every row names the same columns)."""
    if not rows:
        return
    names = list(rows[0])
    json_columns = {n for n in names if isinstance(table.c[n].type, JSON)}
    if len(rows) < COPY_FROM or session.get_bind().dialect.name != "postgresql":
        # None is SQL NULL in a JSON column, as COPY writes it, not JSON's null
        session.execute(
            insert(table),
            [
                {n: null() if n in json_columns and v is None else v for n, v in row.items()}
                for row in rows
            ],
        )
        return
    connection = session.connection()
    raw = connection.connection.driver_connection
    assert raw is not None
    quote = connection.dialect.identifier_preparer.quote
    columns = ", ".join(quote(n) for n in names)
    target = target_name(session, table)
    with raw.cursor() as cursor, cursor.copy(f"COPY {target} ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(
                [
                    _json_text(row[n]) if n in json_columns and row[n] is not None else row[n]
                    for n in names
                ]
            )


def delete_keys(session: Session, table: Table, column: str, keys: Sequence[Any]) -> int:
    """Delete the rows whose ``column`` is one of ``keys``; how many went."""
    gone = 0
    for matches in key_matches(session, table.c[column], keys):
        result = session.execute(delete(table).where(matches))
        gone += int(result.rowcount)  # type: ignore[attr-defined]
    return gone
