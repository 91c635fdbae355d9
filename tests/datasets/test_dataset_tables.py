"""Each dataset's tables: their names on each database and their typed columns."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, event, insert, inspect, select, text

from config.columns import Column
from sync.datasets.schema import ensure_tables
from sync.datasets.tables import tables_for
from sync.db import UnitOfWork
from tests.datasets.flow import typed_datasets
from tests.harness import datasets_from

COLUMNS = (
    Column("price", "price", "numeric"),
    Column("title", "title"),
    Column("seen", "seen", "timestamp"),
)


def test_postgresql_names_live_in_the_data_schema() -> None:
    """datasets.products, datasets.products_history (the view), datasets.products_changes and
    datasets.products_closed."""
    tables = tables_for("products", COLUMNS, dialect="postgresql", schema="datasets")
    named = (tables.current, tables.history, tables.changes, tables.closed)
    assert [tables.qualified(t) for t in named] == [
        "datasets.products",
        "datasets.products_history",
        "datasets.products_changes",
        "datasets.products_closed",
    ]
    assert tables.current.c.price.comment == "from field 'price' as numeric"


def test_sqlite_names_carry_a_prefix_and_types_round_trip() -> None:
    """SQLite has no schemas: datasets_products. Numerics and timestamps read back typed."""
    tables = tables_for("products", COLUMNS, dialect="sqlite", schema="datasets")
    assert tables.qualified(tables.current) == "datasets_products"
    engine = create_engine("sqlite://")
    tables.metadata.create_all(engine)
    assert set(inspect(engine).get_table_names()) == {
        "datasets_products",
        "datasets_products_closed",
        "datasets_products_changes",
    }
    now = datetime(2026, 12, 3, 10, tzinfo=UTC)
    with engine.begin() as connection:
        connection.execute(
            insert(tables.current).values(
                entity_key="s1",
                price=Decimal("12.50"),
                title="A",
                seen=now,
                run_id="products-2026-12-03",
                collection_window="2026-12-03",
                first_seen_at=now,
                last_changed_at=now,
                payload_hash="0" * 64,
                changed_by_run_id="products-2026-12-03",
            )
        )
        row = connection.execute(select(tables.current)).one()
    assert row.price == Decimal("12.50")
    assert row.seen == now


@pytest.mark.postgres
def test_tables_as_made_are_left_alone_and_a_missing_part_is_made_again(uow: UnitOfWork) -> None:
    """Every evaluation makes sure of its dataset's tables first. Tables that stand as made
    cost one catalog query and no DDL (which would take their locks); a view or a column that
    went missing sends the evaluation down the long way, which makes it again."""
    dataset = datasets_from(typed_datasets()).get("products")
    ensure_tables(uow, dataset, "datasets")
    statements: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement.lstrip().split(None, 1)[0].upper())

    event.listen(uow.engine, "before_cursor_execute", seen)
    try:
        ensure_tables(uow, dataset, "datasets")
        assert not {"CREATE", "ALTER", "DROP"} & set(statements)
        with uow.engine.begin() as conn:
            conn.execute(text("DROP VIEW datasets.products_history"))
            conn.execute(
                text("ALTER TABLE datasets.products DROP COLUMN stale, DROP COLUMN set_aside")
            )
        statements.clear()
        ensure_tables(uow, dataset, "datasets")
        assert {"CREATE", "ALTER"} <= set(statements)
    finally:
        event.remove(uow.engine, "before_cursor_execute", seen)
    found = inspect(uow.engine)
    assert "products_history" in found.get_view_names(schema="datasets")
    current = [c["name"] for c in found.get_columns("products", schema="datasets")]
    assert {"stale", "set_aside"} <= set(current)
