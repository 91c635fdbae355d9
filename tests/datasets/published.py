"""Published states of the ``products`` dataset written straight into its tables, as
publication leaves them: runs, publication rows with their change counts, the history's
stretches and each publication's change feed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, delete, insert, text

from config.columns import Column
from sync import outbox
from sync.casts import to_json
from sync.datasets.changes import ChangeSet
from sync.datasets.tables import DatasetTables, history_view_sql, tables_for
from sync.db import UnitOfWork
from sync.models import DatasetColumn, Publication, Run
from sync.states import RunState

DATASETS_TOML = """
[datasets.products]
sitemap = "products"
entity_key = ["sku"]
window = "daily"
partition = "retailer"
required = ["sku", "price"]
[datasets.products.columns]
sku = "text"
title = "text"
price = "numeric"
[datasets.products.watch]
price = { percent = 1 }
title = true
"""
COLUMNS = (Column("sku", "sku"), Column("title", "title"), Column("price", "price", "numeric"))
WINDOWS = ("2026-12-01", "2026-12-02", "2026-12-03")
A, B, C = (f"products-{w}" for w in WINDOWS)

# what each run's publication left in datasets.products: sku -> (title, price)
VIEWS: dict[str, dict[str, tuple[str, str]]] = {
    A: {"s1": ("One", "10"), "s2": ("Two", "20"), "s3": ("Three", "30"), "s4": ("Four", "5")},
    # s1 moves 0.5% (under the tolerance), s2 and s4 change, s3 leaves, s5 comes
    B: {"s1": ("One", "10.05"), "s2": ("Two", "25"), "s4": ("Four!", "5"), "s5": ("Five", "7")},
    # s3 comes back, s1 moves 4.5%
    C: {
        "s1": ("One", "10.5"),
        "s2": ("Two", "25"),
        "s3": ("Three", "30"),
        "s4": ("Four!", "5"),
        "s5": ("Five", "7"),
    },
}


def values(sku: str, title: str, price: str) -> dict[str, Any]:
    """One entity's typed column values."""
    return {"sku": sku, "title": title, "price": Decimal(price)}


def midnight(window: str) -> datetime:
    """Where a daily window begins."""
    return datetime.fromisoformat(window).replace(tzinfo=UTC)


@dataclass
class PublishedProducts:
    """The tables of ``products`` on the test database, and a writer of published states."""

    uow: UnitOfWork
    tables: DatasetTables

    def run(self, run_id: str, window: str, state: str = RunState.PUBLISHED) -> None:
        """A run of the dataset in ``state``."""
        with self.uow.begin() as session:
            session.add(
                Run(
                    run_id=run_id,
                    dataset="products",
                    collection_window=window,
                    state=state,
                    revision=1,
                    created_at=midnight(window),
                )
            )
            session.commit()

    def publication(self, run_id: str, changes: ChangeSet, *, current: bool) -> None:
        """A publication row of ``run_id`` with its counts, and its change feed rows."""
        counts: dict[str, Any] = {
            **changes.counts(),
            "baseline": changes.baseline,
            "previous_run_id": changes.previous_run_id,
        }
        now = midnight(WINDOWS[[A, B, C].index(run_id)]) if run_id in (A, B, C) else None
        with self.uow.begin() as session:
            session.add(
                Publication(
                    dataset="products",
                    run_id=run_id,
                    is_current=current,
                    published_at=now or datetime(2026, 12, 4, tzinfo=UTC),
                    event_id=outbox.event_id_for(run_id, "dataset.published", 1),
                    changes=counts,
                )
            )
            rows = list(self._feed(changes))
            if rows:
                session.execute(insert(self.tables.changes), rows)
            session.commit()

    def _feed(self, changes: ChangeSet) -> Iterator[dict[str, Any]]:
        if changes.baseline:
            return
        common = {
            "run_id": changes.run_id,
            "revision": 1,
            "previous_run_id": changes.previous_run_id,
            "created_at": datetime(2026, 12, 4, tzinfo=UTC),
        }
        for entry in changes.added + changes.removed:
            row = {k: to_json(v) for k, v in entry.values.items()}
            yield {
                **common,
                "entity_key": entry.entity_key,
                "kind": entry.kind,
                "column_name": None,
                "before": row if entry.kind == "removed" else None,
                "after": row if entry.kind == "added" else None,
            }
        for entry in changes.changed:
            for column in entry.columns:
                yield {
                    **common,
                    "entity_key": entry.entity_key,
                    "kind": "changed",
                    "column_name": column.column,
                    "before": to_json(column.before),
                    "after": to_json(column.after),
                }

    def history(self, views: Mapping[str, Mapping[str, tuple[str, str]]]) -> None:
        """The stretches the published views make, one run after another."""
        stretches: list[dict[str, Any]] = []
        open_now: dict[str, dict[str, Any]] = {}
        for run_id, view in views.items():
            start = midnight(run_id.removeprefix("products-"))
            for sku in sorted(open_now.keys() - view.keys()):
                open_now.pop(sku).update(valid_to=start, closed_by_run_id=run_id)
            for sku, (title, price) in sorted(view.items()):
                now = values(sku, title, price)
                kept = open_now.get(sku)
                if kept is not None and all(kept[k] == v for k, v in now.items()):
                    continue
                if kept is not None:
                    kept.update(valid_to=start, closed_by_run_id=run_id)
                stretch = {
                    **now,
                    "entity_key": sku,
                    "partition": "alpha.example",
                    "run_id": run_id,
                    "valid_from": start,
                    "valid_to": None,
                    "closed_by_run_id": None,
                    "payload_hash": "0" * 64,
                }
                stretches.append(stretch)
                open_now[sku] = stretch
        # the closed stretches are rows of X_closed, the open ones the rows of datasets.products
        last = list(views)[-1]
        closed = [s for s in stretches if s["valid_to"] is not None]
        rows = [
            {
                **{n: s[n] for n in ("entity_key", "sku", "title", "price", "partition")},
                "run_id": last,
                "collection_window": last.removeprefix("products-"),
                "first_seen_at": min(
                    t["valid_from"] for t in stretches if t["entity_key"] == s["entity_key"]
                ),
                "last_changed_at": s["valid_from"],
                "changed_by_run_id": s["run_id"],
                "payload_hash": s["payload_hash"],
            }
            for s in stretches
            if s["valid_to"] is None
        ]
        with self.uow.begin() as session:
            if closed:
                session.execute(insert(self.tables.closed), closed)
            session.execute(insert(self.tables.current), rows)
            session.commit()


def create_tables(engine: Engine, schema: str) -> DatasetTables:
    """The dataset's three tables with :data:`COLUMNS`, registered as its columns, made for this
    test in place of any it had (and dropped by :func:`drop_tables`)."""
    drop_tables(engine, schema)
    tables = tables_for("products", COLUMNS, dialect=engine.dialect.name, schema=schema)
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        tables.metadata.create_all(connection)
        connection.execute(text(history_view_sql(tables, engine.dialect)))
        connection.execute(
            insert(DatasetColumn),
            [
                {
                    "dataset": "products",
                    "column_name": c.name,
                    "field": c.field,
                    "type": c.type,
                    "decimal": c.decimal,
                    "position": position,
                }
                for position, c in enumerate(COLUMNS)
            ],
        )
    return tables


def drop_tables(engine: Engine, schema: str) -> None:
    """The dataset as if it had never had tables: none, and no columns registered."""
    tables = tables_for("products", (), dialect=engine.dialect.name, schema=schema)
    view = tables.qualified(tables.history)
    with engine.begin() as connection:
        connection.execute(text(f"DROP VIEW IF EXISTS {view}"))
        tables.metadata.drop_all(connection)
        connection.execute(delete(DatasetColumn).where(DatasetColumn.dataset == "products"))
