"""Many rows written at once: what a JSON column gets back is what was written, whichever way
the rows went in (COPY on PostgreSQL from ``COPY_FROM`` rows on, INSERT otherwise)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Column, MetaData, String, Table, select
from sqlalchemy.engine import Engine

from sync.datasets.rows import COPY_FROM, delete_keys, insert_rows
from sync.db import UnitOfWork
from sync.models.base import Payload

VALUES = [
    {"price": 12.5, "name": "Café ünïcode", "tags": ["a", "b"], "nested": {"x": None}},
    -7,
    1e16,
    "text with \\ backslash, \t tab and \n newline",
    True,
    [],
]


@pytest.fixture
def table(engine: Engine) -> Iterator[Table]:
    probe = Table(
        "rows_probe", MetaData(), Column("k", String, primary_key=True), Column("doc", Payload)
    )
    probe.drop(engine, checkfirst=True)
    probe.create(engine)
    yield probe
    probe.drop(engine)


@pytest.mark.parametrize("n", [len(VALUES), COPY_FROM + len(VALUES)])
def test_json_values_come_back_as_written_and_keys_delete_in_one_go(
    uow: UnitOfWork, table: Table, n: int
) -> None:
    values = list(VALUES)
    if uow.dialect == "postgresql":  # SQLite's JSON gives an integer beyond 64 bits back as a float
        values.append(10**30)  # a wide numeric's before or after
    rows = [{"k": f"key-{i:05d}", "doc": values[i % len(values)]} for i in range(n)]
    rows.append({"k": "null", "doc": None})
    with uow.begin() as session:
        insert_rows(session, table, rows)
        session.commit()
    with uow.begin() as session:
        back = dict(session.execute(select(table.c.k, table.c.doc)).all())
        assert back == {r["k"]: r["doc"] for r in rows}
        gone = delete_keys(session, table, "k", [r["k"] for r in rows[1:]])
        session.commit()
    assert gone == n
    with uow.begin() as session:
        assert session.execute(select(table.c.k)).scalars().all() == ["key-00000"]
