"""What ``scrapesync db downgrade`` would drop, said before anything is dropped.

Going below head reverts migrations; going to ``base`` empties the system of record, and the
datasets' own tables (``datasets.*``, or ``datasets_*`` on SQLite) go with it, so that nothing
is left behind that a later ``db upgrade`` would mistake for published data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text

from sync import db
from sync.datasets.tables import SQLITE_PREFIX


@dataclass(frozen=True)
class DowngradePlan:
    """The revisions a downgrade reverts and the tables it drops."""

    current: tuple[str, ...]
    target: str
    head: str
    reverted: tuple[str, ...]  # "0009: run data versions", newest first
    tables: tuple[str, ...] = field(default=())  # the system of record's, at base
    dataset_objects: tuple[str, ...] = field(default=())  # the datasets' tables and views

    @property
    def below_head(self) -> bool:
        """Whether the downgrade reverts anything."""
        return bool(self.reverted)

    def lines(self) -> list[str]:
        """What the downgrade drops, as the lines the command prints before asking."""
        at = ", ".join(self.current) or "an empty schema"
        lines = [f"the database is at {at}; downgrading to {self.target} reverts:"]
        lines += [f"  - {r}" for r in self.reverted]
        if self.tables:
            lines.append(
                f"and drops every table of the system of record ({len(self.tables)}): "
                + ", ".join(self.tables)
            )
        if self.dataset_objects:
            lines.append(
                f"and the datasets' tables and views ({len(self.dataset_objects)}): "
                + ", ".join(self.dataset_objects)
            )
        return lines


def _dataset_objects(conn: Connection, schema: str) -> list[str]:
    if conn.dialect.name == "postgresql":
        found = inspect(conn)
        if schema not in found.get_schema_names():
            return []
        names = found.get_table_names(schema=schema) + found.get_view_names(schema=schema)
        return sorted(f"{schema}.{name}" for name in names)
    found = inspect(conn)
    names = found.get_table_names() + found.get_view_names()
    return sorted(n for n in names if n.startswith(SQLITE_PREFIX))


def plan(url: str, target: str, data_schema: str) -> DowngradePlan:
    """What downgrading the database at ``url`` to ``target`` reverts and drops."""
    script = ScriptDirectory.from_config(db.alembic_config(url))
    head = script.get_current_head() or "base"
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            current = tuple(MigrationContext.configure(conn).get_current_heads())
            tables = sorted(t for t in inspect(conn).get_table_names() if t != "alembic_version")
            objects = _dataset_objects(conn, data_schema)
    finally:
        engine.dispose()
    reverted: list[str] = []
    if current:
        for rev in script.iterate_revisions(current[0], target):
            if rev.revision == target:
                continue
            doc = (rev.doc or "").strip().splitlines()[0] if rev.doc else ""
            reverted.append(f"{rev.revision}: {doc}" if doc else rev.revision)
    at_base = target == "base"
    return DowngradePlan(
        current=current,
        target=target,
        head=head,
        reverted=tuple(reverted),
        tables=tuple(tables) if at_base else (),
        dataset_objects=tuple(objects) if at_base else (),
    )


def drop_dataset_objects(url: str, data_schema: str) -> None:
    """Drop the datasets' tables and views (after a downgrade to base)."""
    engine = db.make_engine(url)
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{data_schema}" CASCADE'))
                return
            found = inspect(conn)
            for view in found.get_view_names():
                if view.startswith(SQLITE_PREFIX):
                    conn.execute(text(f'DROP VIEW IF EXISTS "{view}"'))
            for table in found.get_table_names():
                if table.startswith(SQLITE_PREFIX):
                    conn.execute(text(f'DROP TABLE IF EXISTS "{table}"'))
    finally:
        engine.dispose()
