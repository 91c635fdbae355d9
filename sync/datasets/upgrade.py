"""Bringing each dataset's tables in line with the datasets file, as ``scrapesync db upgrade``
does after the migrations (the release phase, before new workers start).

For each dataset: its tables are created if missing; then, comparing the registry with the
file's columns (with no ``columns`` table, every registered column as ``text``):

- a new column is added, registered, and filled for the rows already there by casting the
  kept payload of each row's run (the observation of its run id and entity key; NULL where
  retention deleted it);
- a removed column is dropped;
- a column whose field, type or decimal mark changed is rebuilt: a new column is added and
  filled the same way, then swapped in for the old one;
- every column's comment (``COMMENT ON``, PostgreSQL) names its field and type;
- the history view is made again over the tables' new columns.

Tables of earlier releases, whose history was a table that held the open stretches too, are
converted first, in one transaction (:func:`sync.datasets.schema.convert_open_stretches`).
Their indexes that no query needs are dropped, and on PostgreSQL the dataset's table gets the
fillfactor tables are made with now (half of each page free for the next run's versions).

Each step commits on its own and the filling goes in batches, so the web process's readers wait
only for the short ``ALTER TABLE`` statements, never for the filling.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
from sqlalchemy import Text, bindparam, cast, select, text, tuple_, update
from sqlalchemy.orm import Session

from config.columns import Column
from config.datasets import Dataset, Datasets
from sync import casts
from sync.datasets import schema as dataset_schema
from sync.datasets.columns import registered_columns
from sync.datasets.rows import chunks, target_name
from sync.datasets.tables import (
    CURRENT_FILLFACTOR,
    DatasetTables,
    comment_for,
    retired_indexes,
    sql_type,
    tables_for,
)
from sync.db import UnitOfWork
from sync.identity import observation_key
from sync.models import Observation, Run

BATCH = 2000  # rows filled per transaction
_SWAP_PREFIX = "_new_"


@dataclass(frozen=True)
class Reconciled:
    """What an upgrade changed in one dataset's tables."""

    dataset: str
    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    rebuilt: tuple[str, ...] = ()
    filled: int = 0

    def describe(self) -> str:
        """One line for the operator."""
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("added", self.added),
                ("dropped", self.dropped),
                ("rebuilt", self.rebuilt),
            )
            if names
        ]
        if not parts:
            return f"dataset {self.dataset}: tables match the datasets file"
        return f"dataset {self.dataset}: {'; '.join(parts)} ({self.filled} rows filled)"


def target_columns(dataset: Dataset, registered: tuple[Column, ...]) -> tuple[Column, ...]:
    """The columns the datasets file asks for: its configured ones, or with none every
    registered column as ``text`` (the fields seen so far)."""
    if dataset.columns:
        return dataset.columns
    return tuple(replace(c, type="text", decimal=".") for c in registered)


def upgrade_datasets(uow: UnitOfWork, datasets: Datasets, schema: str) -> list[Reconciled]:
    """Create and reconcile every configured dataset's tables; what changed, per dataset."""
    return [upgrade_dataset(uow, d, schema) for d in datasets]


def upgrade_dataset(uow: UnitOfWork, dataset: Dataset, schema: str) -> Reconciled:
    """Create and reconcile one dataset's tables (see the module)."""
    with uow.begin() as session:
        tables = dataset_schema.create_tables(session, dataset, schema)
        registered = registered_columns(session, dataset.name)
        target = target_columns(dataset, registered)
        have = {c.name: c for c in registered}
        want = {c.name: c for c in target}
        added = [c for c in target if c.name not in have]
        dropped = [c for c in registered if c.name not in want]
        rebuilt = [c for c in target if c.name in have and have[c.name] != c]
        staged = [replace(c, name=f"{_SWAP_PREFIX}{c.name}") for c in rebuilt]
        _alter(session, tables, add=added + staged, drop=[c.name for c in dropped])
        _drop_retired_indexes(session, tables)
        _leave_room(session, tables)
        kept = [c for c in registered if c.name in want]
        dataset_schema.register(session, dataset.name, kept + added)
        if added or staged or dropped:
            dialect = dataset_schema.dialect_of(session)
            now_held = tables_for(dataset.name, (*kept, *added), dialect=dialect, schema=schema)
            dataset_schema.remake_history_view(session, now_held)
        session.commit()
    filled = 0
    if added or staged:
        filled = _fill(uow, dataset, schema, added + staged)
    with uow.begin() as session:
        dataset_schema.lock_dataset(session, dataset.name)
        tables = dataset_schema.tables_in(session, dataset.name, schema)
        if rebuilt:
            dataset_schema.drop_history_view(session, tables)
        for column in rebuilt:
            _swap(session, tables, column.name)
        dataset_schema.register(session, dataset.name, target)
        tables = tables_for(
            dataset.name, target, dialect=dataset_schema.dialect_of(session), schema=schema
        )
        if rebuilt:
            dataset_schema.make_history_view(session, tables)
        _comment(session, tables)
        session.commit()
    return Reconciled(
        dataset.name,
        added=tuple(c.name for c in added),
        dropped=tuple(c.name for c in dropped),
        rebuilt=tuple(c.name for c in rebuilt),
        filled=filled,
    )


def _alter(
    session: Session, tables: DatasetTables, *, add: Sequence[Column], drop: Sequence[str]
) -> None:
    dialect = session.get_bind().dialect
    quote = dialect.identifier_preparer.quote
    if dialect.name == "postgresql":
        session.execute(text(f"SET LOCAL lock_timeout = '{dataset_schema.LOCK_TIMEOUT}'"))
    if add or drop:  # the view names the columns it was made with: made again after
        dataset_schema.drop_history_view(session, tables)
    for table in (tables.current, tables.closed):
        target = target_name(session, table)
        for name in drop:
            session.execute(text(f"ALTER TABLE {target} DROP COLUMN {quote(name)}"))
        for column in add:
            kind = sql_type(column).compile(dialect=dialect)
            session.execute(text(f"ALTER TABLE {target} ADD COLUMN {quote(column.name)} {kind}"))


def _drop_retired_indexes(session: Session, tables: DatasetTables) -> None:
    """Drop the indexes an earlier release made that no query needs (under _alter's lock
    timeout on PostgreSQL)."""
    quote = session.get_bind().dialect.identifier_preparer.quote
    for name in retired_indexes(tables):
        target = f"{quote(tables.schema)}.{quote(name)}" if tables.schema else quote(name)
        session.execute(text(f"DROP INDEX IF EXISTS {target}"))


def _leave_room(session: Session, tables: DatasetTables) -> None:
    """Give a table made by an earlier release the fillfactor tables are made with now (see
    ``CURRENT_FILLFACTOR``), on PostgreSQL, unless it has a fillfactor of its own (an
    operator's choice stands). Pages written from now on keep the room; the pages already full
    get it as a publication moves their rows."""
    if dataset_schema.dialect_of(session) != "postgresql":
        return
    target = target_name(session, tables.current)
    held = session.execute(
        text("SELECT reloptions FROM pg_class WHERE oid = CAST(:table AS regclass)"),
        {"table": target},
    ).scalar_one()
    if not any(option.startswith("fillfactor=") for option in held or ()):
        session.execute(text(f"ALTER TABLE {target} SET (fillfactor={CURRENT_FILLFACTOR})"))


def _swap(session: Session, tables: DatasetTables, name: str) -> None:
    quote = session.get_bind().dialect.identifier_preparer.quote
    for table in (tables.current, tables.closed):
        target = target_name(session, table)
        session.execute(text(f"ALTER TABLE {target} DROP COLUMN {quote(name)}"))
        session.execute(
            text(
                f"ALTER TABLE {target} RENAME COLUMN {quote(_SWAP_PREFIX + name)} TO {quote(name)}"
            )
        )


def _comment(session: Session, tables: DatasetTables) -> None:
    if dataset_schema.dialect_of(session) != "postgresql":
        return
    quote = session.get_bind().dialect.identifier_preparer.quote
    for table in (tables.current, tables.closed, tables.history):
        target = target_name(session, table)
        for column in tables.columns:
            comment = comment_for(column).replace("'", "''")
            session.execute(text(f"COMMENT ON COLUMN {target}.{quote(column.name)} IS '{comment}'"))


def _fill(uow: UnitOfWork, dataset: Dataset, schema: str, columns: Sequence[Column]) -> int:
    """Cast ``columns`` from the kept payloads into the rows of the table (its open stretches)
    and its closed stretches, a batch per transaction; how many rows got a payload."""
    with uow.begin() as session:
        windows = dict(
            session.execute(
                select(Run.run_id, Run.collection_window).where(Run.dataset == dataset.name)
            ).all()
        )
    dialect = uow.dialect
    staged = tables_for(dataset.name, tuple(columns), dialect=dialect, schema=schema)
    filled = 0
    keyed = ((staged.current, ("entity_key",)), (staged.closed, ("entity_key", "valid_from")))
    for table, key in keyed:
        by = [table.c[k] for k in key]
        last: tuple[Any, ...] | None = None
        while True:
            with uow.begin() as session:
                query = (
                    select(*by, table.c.entity_key.label("_entity"), table.c.run_id)
                    .order_by(*by)
                    .limit(BATCH)
                )
                if last is not None:
                    after = (
                        bindparam(None, v, type_=c.type) for c, v in zip(by, last, strict=True)
                    )
                    query = query.where(tuple_(*by) > tuple_(*after))
                rows = [(tuple(r[: len(by)]), r[-2], r[-1]) for r in session.execute(query)]
                if not rows:
                    break
                last = rows[-1][0]
                payloads = _payloads(session, dataset.name, rows, windows)
                values = []
                for row in rows:
                    if row[0] in payloads:
                        cast_values = casts.cast_record(tuple(columns), payloads[row[0]])[0]
                        values.append(
                            {
                                **{f"_k_{k}": v for k, v in zip(key, row[0], strict=True)},
                                **{f"_v_{n}": v for n, v in cast_values.items()},
                            }
                        )
                if values:
                    session.execute(
                        update(table)
                        .where(*(c == bindparam(f"_k_{c.name}", type_=c.type) for c in by))
                        .values({c.name: bindparam(f"_v_{c.name}") for c in columns}),
                        values,
                    )
                filled += len(values)
                session.commit()
    return filled


def _payloads(
    session: Session,
    dataset: str,
    rows: Sequence[Any],
    windows: Mapping[str, str],
) -> dict[Any, dict[str, Any]]:
    """Each row's kept payload (row key -> payload): its run's observation of its entity."""
    wanted: dict[str, Any] = {}
    for key, entity_key, run_id in rows:
        window = windows.get(run_id)
        if window is not None:
            wanted[observation_key(dataset, window, entity_key)] = key
    found: dict[Any, dict[str, Any]] = {}
    o = Observation.__table__.c
    for part in chunks(list(wanted)):
        for obs_key, payload in session.execute(
            select(o.observation_key, cast(o.payload, Text)).where(o.observation_key.in_(part))
        ):
            found[wanted[obs_key]] = orjson.loads(payload)
    return found
