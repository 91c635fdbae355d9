"""Alembic environment: runs the package's migrations against ``sqlalchemy.url``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from sync.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")
assert url is not None


def run() -> None:
    """Run migrations online, batch mode on SQLite so ALTERs work there too."""
    connectable = context.config.attributes.get("connection")
    if connectable is None:
        engine = create_engine(url, poolclass=pool.NullPool)
        with engine.connect() as connection:
            _configure(connection)
        engine.dispose()
    else:
        _configure(connectable)


def _configure(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=Base.metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run()
