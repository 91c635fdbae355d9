"""``scrapesync db upgrade`` brings the dataset tables in line with an edited datasets file:
a new column filled from the kept payloads, a removed one dropped, a retyped one rebuilt."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from flask import Flask
from sqlalchemy import (
    BigInteger,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy import Column as SQLColumn

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from sync.datasets.tables import DatasetTables, Timestamp, retired_indexes, sql_type
from sync.datasets.upgrade import upgrade_dataset
from tests.acceptance.flow import product_records, use_datasets
from tests.datasets.flow import (
    TYPED,
    assert_rows_are_open_stretches,
    current_rows,
    history_rows,
    tables,
    typed_datasets,
)
from tests.datasets.test_publication import collect
from tests.harness import write_datasets

EDITED = (
    TYPED.replace('title = "text"\n', "")
    .replace('price = "numeric"', 'price = "text"\nlink = { field = "url", type = "text" }')
    .replace("price = { percent = 1 }\ntitle = true", "price = true")
)


@pytest.mark.slow
def test_db_upgrade_adds_a_column_filled_for_existing_rows_drops_one_and_rebuilds_one(
    web: Flask, services: Services, cloud: CloudState, engine: Engine, tmp_path: Path
) -> None:
    """After the file gains ``link``, loses ``title`` and makes ``price`` text: every existing
    row (and stretch) has its link from the kept payload, title is gone, price holds text; the
    next publication writes the new columns."""
    records = product_records(40)
    collect(web, services, cloud, records)
    changed = [dict(r, price="1.00") if r["sku"] == "SKU-000001" else r for r in records]
    collect(web, services, cloud, changed)
    datasets_file = write_datasets(tmp_path, typed_datasets(columns=EDITED))
    result = CliRunner().invoke(
        main,
        ["db", "upgrade"],
        env={
            "DATABASE_URL": services.settings.database_url,
            "SCRAPESYNC_DATASETS": str(datasets_file),
        },
    )
    assert result.exit_code == 0, result.output
    assert "dataset products: added link; dropped title; rebuilt price (" in result.output

    found = tables(services)
    assert [c.name for c in found.columns] == ["sku", "price", "link", "retailer"]
    held = {
        c["name"]: c for c in inspect(engine).get_columns(found.current.name, schema=found.schema)
    }
    assert "title" not in held
    rows = current_rows(services)
    by_sku = {r["sku"]: r for r in changed}
    assert {k: (r["link"], r["price"]) for k, r in rows.items()} == {
        k: (r["url"], r["price"]) for k, r in by_sku.items()
    }
    old = [h for h in history_rows(services) if h["entity_key"] == "SKU-000001"]
    assert [(h["link"], h["price"]) for h in old] == [
        (records[1]["url"], records[1]["price"]),
        (records[1]["url"], "1.00"),
    ]
    assert_rows_are_open_stretches(services)
    if engine.dialect.name == "postgresql":
        assert held["link"]["comment"] == "from field 'url' as text"
        assert str(held["price"]["type"]) == "TEXT"

    edited = use_datasets(services, typed_datasets(columns=EDITED))
    later = [dict(r, price="2.00") if r["sku"] == "SKU-000002" else r for r in changed]
    collect(web, edited, cloud, later + product_records(1, start=40))
    rows = current_rows(edited)
    assert rows["SKU-000002"]["price"] == "2.00"
    assert rows["SKU-000040"]["link"] == product_records(1, start=40)[0]["url"]
    assert_rows_are_open_stretches(edited)
    again = CliRunner().invoke(
        main,
        ["db", "upgrade"],
        env={
            "DATABASE_URL": services.settings.database_url,
            "SCRAPESYNC_DATASETS": str(datasets_file),
        },
    )
    assert "dataset products: tables match the datasets file" in again.output


def test_db_upgrade_drops_the_run_id_index_of_earlier_releases(
    services: Services, engine: Engine
) -> None:
    """Earlier releases indexed ``X.run_id``, which each publication rewrote for every row it
    moved to the new run; tables made now have no such index, and ``db upgrade`` drops it from
    tables made before."""
    typed = use_datasets(services, typed_datasets())
    dataset = typed.datasets.get("products")
    schema = typed.settings.data_schema
    upgrade_dataset(typed.uow, dataset, schema)
    found = tables(typed)

    def indexed_columns() -> list[list[str | None]]:
        held = inspect(engine).get_indexes(found.current.name, schema=found.schema)
        return [index["column_names"] for index in held]

    assert indexed_columns() == []  # the primary key (entity_key) is no index of its own
    (old,) = retired_indexes(found)
    quote = engine.dialect.identifier_preparer.quote
    target = (
        f"{quote(found.schema)}.{quote(found.current.name)}"
        if found.schema
        else quote(found.current.name)
    )
    with engine.begin() as conn:
        conn.execute(text(f"CREATE INDEX {quote(old)} ON {target} (run_id)"))
    assert indexed_columns() == [["run_id"]]
    upgrade_dataset(typed.uow, dataset, schema)
    assert indexed_columns() == []


@pytest.mark.postgres
def test_a_dataset_table_leaves_room_on_its_pages_for_the_next_runs_rows(
    services: Services, engine: Engine
) -> None:
    """Each publication of a new run moves every row it saw unchanged to that run: with half
    of each page free, each moved row's new version stays on its page (no primary-key entry
    written). Tables are made so, and ``db upgrade`` gives the setting to tables made before,
    leaving alone a fillfactor an operator chose."""
    typed = use_datasets(services, typed_datasets())
    dataset = typed.datasets.get("products")
    schema = typed.settings.data_schema
    upgrade_dataset(typed.uow, dataset, schema)
    found = tables(typed)
    target = f"{found.schema}.{found.current.name}"

    def options() -> list[str] | None:
        with engine.connect() as conn:
            sql = "SELECT reloptions FROM pg_class WHERE oid = CAST(:t AS regclass)"
            return conn.execute(text(sql), {"t": target}).scalar_one()

    assert options() == ["fillfactor=50"]
    with engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {target} RESET (fillfactor)"))  # as made before
    assert options() is None
    upgrade_dataset(typed.uow, dataset, schema)
    assert options() == ["fillfactor=50"]
    with engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {target} SET (fillfactor = 70)"))
    upgrade_dataset(typed.uow, dataset, schema)
    assert options() == ["fillfactor=70"]


def earlier_history_table(found: DatasetTables) -> Table:
    """The history table of earlier releases: every stretch, open ones too, keyed by an id."""
    return Table(
        found.history.name,
        MetaData(schema=found.schema),
        SQLColumn("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
        SQLColumn("entity_key", Text, nullable=False),
        *(SQLColumn(c.name, sql_type(c)) for c in found.columns),
        SQLColumn("partition", Text),
        SQLColumn("run_id", String(200), nullable=False),
        SQLColumn("valid_from", Timestamp, nullable=False),
        SQLColumn("valid_to", Timestamp),
        SQLColumn("closed_by_run_id", String(200)),
        SQLColumn("payload_hash", String(64), nullable=False),
        Index(f"ix_{found.current.name}_history_entity", "entity_key", "valid_from"),
        Index(
            f"uq_{found.current.name}_history_open",
            "entity_key",
            unique=True,
            postgresql_where=text("valid_to IS NULL"),
            sqlite_where=text("valid_to IS NULL"),
        ),
    )


@pytest.mark.slow
def test_db_upgrade_converts_a_history_table_that_held_the_open_stretches(
    web: Flask, services: Services, cloud: CloudState, engine: Engine
) -> None:
    """Earlier releases wrote every open stretch twice, as a row of the table and as a row of
    the history table: ``db upgrade`` gives each row the run that opened its stretch, moves the
    closed stretches to ``X_closed`` and makes the history the view, which reads exactly as the
    table did; publications go on from there."""
    records = product_records(40)
    collect(web, services, cloud, records)
    changed = [dict(r, price="1.00") if r["sku"] == "SKU-000001" else r for r in records]
    collect(web, services, cloud, [r for r in changed if r["sku"] != "SKU-000002"])
    history, rows = history_rows(services), current_rows(services)
    assert len([h for h in history if h["valid_to"] is not None]) == 2
    found = tables(services)
    old = earlier_history_table(found)
    quote = engine.dialect.identifier_preparer.quote
    with engine.begin() as conn:
        conn.execute(text(f"DROP VIEW {found.qualified(found.history)}"))
        old.create(conn)
        conn.execute(insert(old), [{"id": n, **h} for n, h in enumerate(history, start=1)])
        conn.execute(
            text(
                f"ALTER TABLE {found.qualified(found.current)} DROP COLUMN "
                f"{quote('changed_by_run_id')}"
            )
        )
        conn.execute(text(f"DROP TABLE {found.qualified(found.closed)}"))

    upgrade_dataset(services.uow, services.datasets.get("products"), services.settings.data_schema)
    assert history_rows(services) == history
    assert current_rows(services) == rows
    held = inspect(engine)
    assert found.history.name in held.get_view_names(schema=found.schema)
    assert found.history.name not in held.get_table_names(schema=found.schema)
    with services.uow.begin() as session:
        closed = session.execute(select(func.count()).select_from(found.closed)).scalar_one()
    assert closed == 2

    later = [dict(r, price="3.00") if r["sku"] == "SKU-000003" else r for r in changed]
    collect(web, services, cloud, later)
    after = history_rows(services)
    assert [h for h in after if h["valid_to"] is not None] == [
        h for h in history if h["valid_to"] is not None
    ] + [h for h in after if h["entity_key"] == "SKU-000003" and h["valid_to"] is not None]
    assert len(after) == len(history) + 2  # SKU-000002 back, SKU-000003 a new price
    assert_rows_are_open_stretches(services)
