"""The SQL objects of each dataset: its published run, the history of its values and what
changed at each publication.

On PostgreSQL they live in a schema of their own (``SCRAPESYNC_DATA_SCHEMA``, default
``datasets``): ``datasets.products``, ``datasets.products_history``, ``datasets.products_changes``
and ``datasets.products_closed``. On SQLite, which has no schemas, the same objects are named
``datasets_products``, ``datasets_products_history`` and so on. Every name is made here, once.

The history is a view: the closed stretches, kept in ``X_closed``, and the open ones, which are
the rows of ``X`` itself (each row knows the run that opened its stretch, ``changed_by_run_id``,
and when, ``last_changed_at``). A stretch is written once, when it closes; while it is open the
table's row is all there is of it, so a publication never writes an entity's values twice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Index,
    Integer,
    MetaData,
    Numeric,
    Select,
    String,
    Table,
    Text,
    false,
    null,
    select,
    union_all,
)
from sqlalchemy import Column as SQLColumn
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from config.columns import Column
from sync.models import Payload

SQLITE_PREFIX = "datasets_"
HISTORY_SUFFIX = "_history"
CHANGES_SUFFIX = "_changes"
CLOSED_SUFFIX = "_closed"
CURRENT_FILLFACTOR = 50  # percent of each page of a dataset's table that inserts fill


class Timestamp(TypeDecorator[datetime]):
    """A point in time: ``timestamp with time zone`` on PostgreSQL (what BI tools expect),
    naive UTC on SQLite; read back timezone-aware in UTC on both."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(DateTime(timezone=True))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are ambiguous; pass a timezone-aware one")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


SQL_TYPES: dict[str, Any] = {
    "text": Text,
    "integer": BigInteger,
    "numeric": lambda: Numeric(asdecimal=True),
    "boolean": Boolean,
    "timestamp": Timestamp,
    "json": lambda: Payload,
}


def sql_type(column: Column) -> Any:
    """The SQL type of a typed column."""
    return SQL_TYPES[column.type]()


def comment_for(column: Column) -> str:
    """The column comment BI tools show: the record field it is cast from, and its type."""
    return f"from field {column.field!r} as {column.type}"


@dataclass(frozen=True)
class DatasetTables:
    """One dataset's tables and its history view, built for its columns on one kind of
    database."""

    dataset: str
    columns: tuple[Column, ...]
    schema: str | None
    current: Table
    closed: Table
    changes: Table
    history: Table  # the view: read it, never write it

    @property
    def metadata(self) -> MetaData:
        """The metadata the three tables belong to (and nothing else does; not the view)."""
        return self.current.metadata

    def qualified(self, table: Table) -> str:
        """The name a user types in SQL: ``datasets.products`` or ``datasets_products``."""
        return f"{table.schema}.{table.name}" if table.schema else table.name


def base_name(dataset: str, *, dialect: str) -> str:
    """The name of a dataset's current table, without its schema."""
    return dataset if dialect == "postgresql" else f"{SQLITE_PREFIX}{dataset}"


def retired_indexes(tables: DatasetTables) -> tuple[str, ...]:
    """Indexes that earlier releases made on the dataset's tables and that this one drops."""
    return (f"ix_{tables.current.name}_run_id",)


@functools.lru_cache(maxsize=256)
def tables_for(
    dataset: str, columns: tuple[Column, ...], *, dialect: str, schema: str
) -> DatasetTables:
    """The dataset's tables with ``columns``, named for ``dialect`` (``schema`` is PostgreSQL's).
    The same arguments give the same objects, so SQLAlchemy's statement cache knows the tables
    again (a new ``Table`` compiles every statement afresh); no caller changes them."""
    in_schema = schema if dialect == "postgresql" else None
    metadata = MetaData(schema=in_schema)
    name = base_name(dataset, dialect=dialect)
    return DatasetTables(
        dataset=dataset,
        columns=columns,
        schema=in_schema,
        current=_current_table(dataset, name, columns, metadata),
        closed=_closed_table(dataset, name, columns, metadata),
        changes=_changes_table(dataset, name, metadata),
        history=_history_view(dataset, name, columns, MetaData(schema=in_schema)),
    )


def _typed(columns: tuple[Column, ...]) -> list[SQLColumn[Any]]:
    """The dataset's typed columns, fresh for one table."""
    return [SQLColumn(c.name, sql_type(c), comment=comment_for(c)) for c in columns]


def _current_table(
    dataset: str, name: str, columns: tuple[Column, ...], metadata: MetaData
) -> Table:
    """The published run: one row per entity, with the run and moment of its last change."""
    return Table(
        name,
        metadata,
        SQLColumn("entity_key", Text, primary_key=True, comment="the entity's stable key"),
        *_typed(columns),
        SQLColumn("partition", Text, comment="the partition the row was published in"),
        SQLColumn("run_id", String(200), nullable=False, comment="the run the row comes from"),
        SQLColumn("collection_window", String(40), nullable=False),
        SQLColumn("first_seen_at", Timestamp, nullable=False),
        SQLColumn("last_changed_at", Timestamp, nullable=False),
        SQLColumn("cast_failures", Payload, comment="values that failed their cast"),
        SQLColumn("payload_hash", String(64), nullable=False),
        SQLColumn(
            "changed_by_run_id",
            String(200),
            nullable=False,
            comment="the run that gave the row its values (at last_changed_at)",
        ),
        *stale_columns(),
        # no index on run_id: nearly every row holds the published run's, no query looks rows
        # up by it, and each publication would rewrite an entry for every row it moves
        comment=f"the published run of dataset {dataset!r}, one row per entity",
        # half of each page left free: a publication of the next run moves every row it saw
        # unchanged to that run, and each new version then stays on its page (heap-only, the
        # primary key untouched)
        postgresql_with={"fillfactor": CURRENT_FILLFACTOR},
    )


def stale_columns() -> tuple[SQLColumn[Any], ...]:
    """The columns that say a row is kept from an earlier run because the published run set
    its record aside (a NUL, an overlong value...), and which values were at fault."""
    return (
        SQLColumn(
            "stale",
            Boolean,
            nullable=False,
            server_default=false(),
            comment="kept from an earlier run: the published run set this record aside",
        ),
        SQLColumn("set_aside", Payload, comment="the values the published run set aside"),
    )


def _closed_table(
    dataset: str, name: str, columns: tuple[Column, ...], metadata: MetaData
) -> Table:
    """The closed stretches of the dataset's history, each written once, when it closed."""
    return Table(
        f"{name}{CLOSED_SUFFIX}",
        metadata,
        # an entity's stretches never overlap and are never empty: one starts at each moment
        SQLColumn("entity_key", Text, primary_key=True),
        *_typed(columns),
        SQLColumn("partition", Text),
        SQLColumn("run_id", String(200), nullable=False, comment="the run that opened it"),
        SQLColumn(
            "valid_from",
            Timestamp,
            primary_key=True,
            comment="start of its first window",
        ),
        SQLColumn("valid_to", Timestamp, nullable=False, comment="start of the window it ended"),
        SQLColumn("closed_by_run_id", String(200), comment="the run that ended it"),
        SQLColumn("payload_hash", String(64), nullable=False),
        comment=f"dataset {dataset!r}: the closed stretches of its history",
    )


def _changes_table(dataset: str, name: str, metadata: MetaData) -> Table:
    """What each publication added, removed and changed, one row per entity or column."""
    identity = BigInteger().with_variant(Integer, "sqlite")
    return Table(
        f"{name}{CHANGES_SUFFIX}",
        metadata,
        SQLColumn("id", identity, primary_key=True, autoincrement=True),
        SQLColumn("run_id", String(200), nullable=False, comment="the publication's run"),
        SQLColumn("revision", Integer, nullable=False, comment="the run's revision published"),
        SQLColumn("previous_run_id", String(200), comment="the run published before it"),
        SQLColumn("entity_key", Text, nullable=False),
        SQLColumn("kind", String(10), nullable=False, comment="added, removed or changed"),
        SQLColumn("column_name", Text, comment="the changed column (changed rows only)"),
        SQLColumn("before", Payload, comment="the value before (removed: the row)"),
        SQLColumn("after", Payload, comment="the value after (added: the row)"),
        SQLColumn("created_at", Timestamp, nullable=False),
        Index(f"ix_{name}_changes_run", "run_id", "revision"),
        comment=f"dataset {dataset!r}: what each publication added, removed and changed",
    )


def _history_view(
    dataset: str, name: str, columns: tuple[Column, ...], metadata: MetaData
) -> Table:
    """The history view's columns, in metadata of its own: a view is never created with the
    tables."""
    return Table(
        f"{name}{HISTORY_SUFFIX}",
        metadata,
        SQLColumn("entity_key", Text),
        *_typed(columns),
        SQLColumn("partition", Text),
        SQLColumn("run_id", String(200), comment="the run that opened it"),
        SQLColumn("valid_from", Timestamp, comment="start of its first window"),
        SQLColumn("valid_to", Timestamp, comment="start of the window it ended (NULL: current)"),
        SQLColumn("closed_by_run_id", String(200), comment="the run that ended it"),
        SQLColumn("payload_hash", String(64)),
        comment=f"dataset {dataset!r}: one row per entity per stretch of unchanged values",
    )


def stretch_selects(tables: DatasetTables) -> tuple[Select[Any], Select[Any]]:
    """The closed stretches, and one open stretch per row of the dataset's table (from its last
    change, by the run that made it), each selected as the history view's columns."""
    names = [c.name for c in tables.columns]
    shared = ["entity_key", *names, "partition"]
    c, x = tables.closed.c, tables.current.c
    closed = select(
        *(c[n] for n in shared),
        c.run_id,
        c.valid_from,
        c.valid_to,
        c.closed_by_run_id,
        c.payload_hash,
    )
    open_ = select(
        *(x[n] for n in shared),
        x.changed_by_run_id.label("run_id"),
        x.last_changed_at.label("valid_from"),
        null().cast(Timestamp).label("valid_to"),
        null().cast(String(200)).label("closed_by_run_id"),
        x.payload_hash,
    )
    return closed, open_


def history_query(tables: DatasetTables) -> Any:
    """What the history view selects: the closed stretches, then the open ones."""
    return union_all(*stretch_selects(tables))


def history_view_sql(tables: DatasetTables, dialect: Dialect) -> str:
    """``CREATE VIEW`` of the dataset's history."""
    quote = dialect.identifier_preparer.quote
    view = tables.history
    name = f"{quote(view.schema)}.{quote(view.name)}" if view.schema else quote(view.name)
    body = history_query(tables).compile(dialect=dialect, compile_kwargs={"literal_binds": True})
    return f"CREATE VIEW {name} AS {body}"
