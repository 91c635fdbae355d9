"""Writing and deleting many rows of a dataset's tables in few statements: COPY on PostgreSQL
once there are enough rows to pay for it, one executemany INSERT otherwise (and on SQLite)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy import JSON, Table, delete, insert, null
from sqlalchemy.orm import Session

COPY_FROM = 500  # rows: below this a multi-row INSERT is as quick as COPY's set-up
CHUNK = 500  # keys per IN (...) list, well under any driver's parameter limit


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


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
    target = f"{quote(table.schema)}.{quote(table.name)}" if table.schema else quote(table.name)
    columns = ", ".join(quote(n) for n in names)
    with raw.cursor() as cursor, cursor.copy(f"COPY {target} ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(
                [
                    Jsonb(row[n]) if n in json_columns and row[n] is not None else row[n]
                    for n in names
                ]
            )


def delete_keys(session: Session, table: Table, column: str, keys: Sequence[Any]) -> int:
    """Delete the rows whose ``column`` is one of ``keys``; how many went."""
    gone = 0
    for part in chunks(keys):
        result = session.execute(delete(table).where(table.c[column].in_(part)))
        gone += int(result.rowcount)  # type: ignore[attr-defined]
    return gone
