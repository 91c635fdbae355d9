"""Each dataset's tables as they stand in the database, and the registry that says so.

The ``dataset_columns`` registry names the typed columns each dataset's tables hold (column,
source field, type, decimal mark, position); the tables are always built from it, never from
the datasets file directly, so a file edited before ``scrapesync db upgrade`` ran cannot make a
publication write a column that does not exist. A dataset with configured columns is
registered with them when its tables are first made; one with none (every field a ``text``
column) gains a column the first time a run brings a field it has not seen.

The tables are created, if missing, in a short transaction of their own before a run is
evaluated (and by ``scrapesync db upgrade``), so the evaluating transaction only writes rows.
The history view is made with them, and made again whenever their columns change (a view's
columns are fixed when it is made). Tables of earlier releases, whose history was a table
holding the open stretches too, are converted on the way (:func:`convert_open_stretches`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from sqlalchemy import String, delete, func, inspect, select, text
from sqlalchemy import exists as sa_exists
from sqlalchemy.orm import Session
from sqlalchemy.schema import CreateSchema

from config.columns import RESERVED_COLUMNS, Column, default_columns
from config.datasets import Dataset
from sync.datasets.columns import registered_columns
from sync.datasets.tables import (
    DatasetTables,
    comment_for,
    history_view_sql,
    sql_type,
    tables_for,
)
from sync.db import UnitOfWork
from sync.models import DatasetColumn

# A column added while readers hold the table waits this long for its lock, then the
# evaluation fails with a lock timeout and is retried.
LOCK_TIMEOUT = "5s"


def dialect_of(session: Session) -> str:
    """``postgresql`` or ``sqlite``: the database the session talks to."""
    return session.get_bind().dialect.name


def register(session: Session, dataset: str, columns: Iterable[Column]) -> None:
    """Record ``columns`` as the dataset's typed columns, replacing what was registered."""
    session.execute(delete(DatasetColumn).where(DatasetColumn.dataset == dataset))
    for position, column in enumerate(columns):
        session.add(
            DatasetColumn(
                dataset=dataset,
                column_name=column.name,
                field=column.field,
                type=column.type,
                decimal=column.decimal,
                position=position,
            )
        )
    session.flush()


def tables_in(session: Session, dataset: str, schema: str) -> DatasetTables:
    """The dataset's tables with the columns they hold now."""
    return tables_for(
        dataset, registered_columns(session, dataset), dialect=dialect_of(session), schema=schema
    )


def lock_dataset(session: Session, dataset: str) -> None:
    """Serialise changes to one dataset's tables for the rest of the transaction (PostgreSQL;
    SQLite's single writer serialises them already)."""
    if dialect_of(session) == "postgresql":
        key = int.from_bytes(hashlib.sha256(f"dataset:{dataset}".encode()).digest()[:8], "big")
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key - (1 << 63)})


def wanted_columns(dataset: Dataset, registered: tuple[Column, ...]) -> tuple[Column, ...]:
    """The columns the datasets file asks for: the configured ones, or with none configured
    the registered ``text`` columns grown from the fields seen (none if any is typed)."""
    if dataset.columns:
        return dataset.columns
    return registered if all(c.type == "text" for c in registered) else ()


def create_tables(session: Session, dataset: Dataset, schema: str) -> DatasetTables:
    """Create the dataset's schema and tables if they are missing, with the columns the
    datasets file asks for; tables that never held a published row are made afresh when they
    hold other columns (a change to tables with rows waits for ``db upgrade``). In the
    caller's transaction."""
    lock_dataset(session, dataset.name)
    dialect = dialect_of(session)
    registered = registered_columns(session, dataset.name)
    wanted = wanted_columns(dataset, registered)
    tables = tables_for(dataset.name, registered, dialect=dialect, schema=schema)
    if registered == wanted and _as_made(session, tables):
        return tables
    connection = session.connection()
    if dialect == "postgresql":
        session.execute(CreateSchema(schema, if_not_exists=True))
    # the catalog first: reading the tables themselves would wait on (and could deadlock with)
    # an evaluation adding a column to them
    if _holds_open_stretches(session, tables):
        convert_open_stretches(session, tables)
    _add_stale_columns(session, tables)
    held = _typed_columns_held(session, tables)
    views = set(inspect(connection).get_view_names(schema=tables.schema))
    if (registered != wanted or held != [c.name for c in wanted]) and (
        held is None or _never_published(session, tables)
    ):
        drop_history_view(session, tables)
        tables.metadata.drop_all(connection, checkfirst=True)
        register(session, dataset.name, wanted)
        tables = tables_for(dataset.name, wanted, dialect=dialect, schema=schema)
        views.discard(tables.history.name)
    tables.metadata.create_all(connection, checkfirst=True)
    if tables.history.name not in views:
        make_history_view(session, tables)
    return tables


def _as_made(session: Session, tables: DatasetTables) -> bool:
    """Whether the dataset's tables and view stand exactly as :func:`create_tables` would leave
    them for ``tables`` (PostgreSQL, in one catalog query; SQLite always looks closer): every
    evaluation asks, and nearly always they do."""
    if dialect_of(session) != "postgresql":
        return False
    held = session.execute(
        text(
            "SELECT c.relname, c.relkind, array_agg(a.attname::text ORDER BY a.attnum) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
            "AND NOT a.attisdropped "
            "WHERE n.nspname = :schema AND c.relname = ANY(:names) GROUP BY c.relname, c.relkind"
        ),
        {
            "schema": tables.schema,
            "names": [
                t.name for t in (tables.current, tables.closed, tables.changes, tables.history)
            ],
        },
    ).all()
    found = {name: (kind, list(columns)) for name, kind, columns in held}
    typed = [c.name for c in tables.columns]
    for table in (tables.current, tables.closed, tables.changes):
        kind, columns = found.get(table.name, (None, []))
        if kind != "r" or set(columns) != set(table.c.keys()):
            return False
        if table is not tables.changes and [c for c in columns if c in typed] != typed:
            return False
    return bool(found.get(tables.history.name, (None, []))[0] == "v")


def _typed_columns_held(session: Session, tables: DatasetTables) -> list[str] | None:
    """The typed columns the dataset's table has in the database, in order (None if it has no
    table)."""
    found = inspect(session.connection())
    if not found.has_table(tables.closed.name, schema=tables.schema):
        return None
    if not found.has_table(tables.current.name, schema=tables.schema):
        return None
    names = [c["name"] for c in found.get_columns(tables.current.name, schema=tables.schema)]
    return [n for n in names if n not in RESERVED_COLUMNS]


def _add_stale_columns(session: Session, tables: DatasetTables) -> None:
    """Give a dataset's table of an earlier release the ``stale`` and ``set_aside`` columns
    (existing rows are not stale)."""
    found = inspect(session.connection())
    if not found.has_table(tables.current.name, schema=tables.schema):
        return
    names = {c["name"] for c in found.get_columns(tables.current.name, schema=tables.schema)}
    if "stale" in names:
        return
    dialect = session.get_bind().dialect
    target = _quoted(session, tables.schema, tables.current.name)
    kind = sql_type_of(tables.current.c.set_aside.type, dialect)
    session.execute(text(f"ALTER TABLE {target} ADD COLUMN stale BOOLEAN NOT NULL DEFAULT false"))
    session.execute(text(f"ALTER TABLE {target} ADD COLUMN set_aside {kind}"))


def sql_type_of(kind: Any, dialect: Any) -> str:
    """A column type as the dialect spells it in DDL."""
    return str(kind.compile(dialect=dialect))


def _never_published(session: Session, tables: DatasetTables) -> bool:
    return (
        not session.execute(select(sa_exists().select_from(tables.closed))).scalar_one()
        and not session.execute(select(sa_exists().select_from(tables.current))).scalar_one()
    )


def _quoted(session: Session, schema: str | None, name: str) -> str:
    quote = session.get_bind().dialect.identifier_preparer.quote
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)


def drop_history_view(session: Session, tables: DatasetTables) -> None:
    """Drop the dataset's history view, if there is one (before its tables' columns change)."""
    name = _quoted(session, tables.schema, tables.history.name)
    session.execute(text(f"DROP VIEW IF EXISTS {name}"))


def make_history_view(session: Session, tables: DatasetTables) -> None:
    """Make the dataset's history view over its tables as ``tables`` describes them, with the
    comments BI tools show (PostgreSQL)."""
    dialect = session.get_bind().dialect
    session.execute(text(history_view_sql(tables, dialect)))
    if dialect.name != "postgresql":
        return
    view = tables.history
    name = _quoted(session, view.schema, view.name)
    quote = dialect.identifier_preparer.quote
    session.execute(text(f"COMMENT ON VIEW {name} IS '{_literal(view.comment or '')}'"))
    for column in view.columns:
        if column.comment:
            session.execute(
                text(
                    f"COMMENT ON COLUMN {name}.{quote(column.name)} IS '{_literal(column.comment)}'"
                )
            )


def remake_history_view(session: Session, tables: DatasetTables) -> None:
    """Make the dataset's history view again, with the columns ``tables`` has."""
    drop_history_view(session, tables)
    make_history_view(session, tables)


def _literal(value: str) -> str:
    return value.replace("'", "''")


def _holds_open_stretches(session: Session, tables: DatasetTables) -> bool:
    """Whether the dataset's history is still the table of earlier releases (every stretch in
    it, open ones too), not the view."""
    found = inspect(session.connection())
    return tables.history.name in found.get_table_names(schema=tables.schema)


def convert_open_stretches(session: Session, tables: DatasetTables) -> None:
    """Convert a history table of earlier releases into this release's layout, in the caller's
    transaction: each row of the dataset's table takes the run that opened its stretch, the
    closed stretches move to ``X_closed``, and the history table gives way to the view (which
    :func:`create_tables` makes). The open stretches are the table's rows already (the rule
    every publication kept), so no stretch is lost."""
    dialect = dialect_of(session)
    old = _quoted(session, tables.schema, tables.history.name)
    current = _quoted(session, tables.schema, tables.current.name)
    kind = String(200).compile(dialect=session.get_bind().dialect)
    # a default fills the rows already there on both databases (SQLite adds no NOT NULL
    # column without one); the statement after it gives each row its opener
    session.execute(
        text(f"ALTER TABLE {current} ADD COLUMN changed_by_run_id {kind} NOT NULL DEFAULT ''")
    )
    session.execute(
        text(
            f"UPDATE {current} SET changed_by_run_id = COALESCE((SELECT h.run_id FROM {old} h "  # noqa: S608 - quoted identifiers
            f"WHERE h.entity_key = {current}.entity_key AND h.valid_to IS NULL), run_id)"
        )
    )
    if dialect == "postgresql":
        session.execute(text(f"ALTER TABLE {current} ALTER COLUMN changed_by_run_id DROP DEFAULT"))
    tables.closed.create(session.connection(), checkfirst=True)
    names = ", ".join(
        session.get_bind().dialect.identifier_preparer.quote(c.name) for c in tables.closed.columns
    )
    session.execute(
        text(
            f"INSERT INTO {_quoted(session, tables.schema, tables.closed.name)} ({names}) "  # noqa: S608 - quoted identifiers
            f"SELECT {names} FROM {old} WHERE valid_to IS NOT NULL ORDER BY entity_key, valid_from"
        )
    )
    session.execute(text(f"DROP TABLE {old}"))


def ensure_tables(uow: UnitOfWork, dataset: Dataset, schema: str) -> None:
    """Make sure the dataset's tables exist, in a short transaction of their own."""
    with uow.begin() as session:
        create_tables(session, dataset, schema)
        session.commit()


def new_columns(known: tuple[Column, ...], fields: Iterable[str]) -> tuple[Column, ...]:
    """``text`` columns for the fields no registered column is cast from, named as
    :func:`config.columns.default_columns` names them."""
    return default_columns(fields, known=known)


def add_columns(
    session: Session, tables: DatasetTables, columns: tuple[Column, ...], schema: str
) -> DatasetTables:
    """Add nullable ``columns`` to the dataset's table and its history (earlier rows hold NULL
    in them) and register them; in the caller's transaction. Returns the tables as they now are."""
    if not columns:
        return tables
    dialect = session.get_bind().dialect
    quote = dialect.identifier_preparer.quote
    if dialect.name == "postgresql":
        session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    drop_history_view(session, tables)
    for table in (tables.current, tables.closed):
        name = tables.qualified(table)
        target = ".".join(quote(part) for part in name.split("."))
        for column in columns:
            kind = sql_type(column).compile(dialect=dialect)
            session.execute(text(f"ALTER TABLE {target} ADD COLUMN {quote(column.name)} {kind}"))
            if dialect.name == "postgresql":
                comment = comment_for(column).replace("'", "''")
                session.execute(
                    text(f"COMMENT ON COLUMN {target}.{quote(column.name)} IS '{comment}'")
                )
    position = session.execute(
        select(func.coalesce(func.max(DatasetColumn.position), -1)).where(
            DatasetColumn.dataset == tables.dataset
        )
    ).scalar_one()
    for offset, column in enumerate(columns, start=1):
        session.add(
            DatasetColumn(
                dataset=tables.dataset,
                column_name=column.name,
                field=column.field,
                type=column.type,
                decimal=column.decimal,
                position=position + offset,
            )
        )
    session.flush()
    grown = tables_for(
        tables.dataset, tables.columns + columns, dialect=dialect.name, schema=schema
    )
    make_history_view(session, grown)
    return grown
