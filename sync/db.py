"""Engines and the unit of work: a transaction that rolls back unless ``commit()`` is called."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).with_name("migrations")


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and foreign keys."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


class UnitOfWork:
    """Opens sessions; each ``with uow.begin() as session`` commits only if the block calls
    ``session.commit()`` and rolls back otherwise."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._factory = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def begin(self) -> Iterator[Session]:
        """A session whose uncommitted work is rolled back on exit."""
        session = self._factory()
        try:
            yield session
        finally:
            session.rollback()
            session.close()

    @property
    def dialect(self) -> str:
        """``postgresql`` or ``sqlite``."""
        return self.engine.dialect.name


def alembic_config(url: str) -> Config:
    """The Alembic configuration for the migrations shipped with the package."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Revert migrations down to ``revision``."""
    command.downgrade(alembic_config(url), revision)
