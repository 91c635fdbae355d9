"""Engines and the unit of work: a transaction that rolls back unless ``commit()`` is called."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool
from sqlalchemy.util.queue import Empty

if TYPE_CHECKING:  # Alembic is imported when migrating, not by every process that starts
    from alembic.config import Config

from config.settings import DEFAULT_DATABASE_URL, ConfigError

MIGRATIONS = Path(__file__).with_name("migrations")

CONNECT_TIMEOUT = 10  # a database that does not answer fails a pass; it never hangs one
RECYCLE_SECONDS = 1800  # under the idle cut-off of hosted PostgreSQL and of PgBouncer
# A web connection back in use within this many seconds is not checked again first, so a
# notification costs one round trip to PostgreSQL; one idle longer is pinged before use.
PING_AFTER_IDLE_SECONDS = 1.0
POOLS: dict[str, dict[str, Any]] = {
    # Each gunicorn process uses at most two connections and its threads wait for them rather
    # than take connections the workers need. Both stay open while requests keep coming; the
    # web app gives the second back (``BurstPool.shrink``) once no request has been in flight
    # for a moment, so an idle process holds one.
    "web": {"pool_size": 2, "max_overflow": 0, "pool_timeout": 5},
    # A work horse runs one sync: its import transaction and the heartbeat beside it.
    "worker": {"pool_size": 2, "max_overflow": 1, "pool_timeout": 30},
    # The maintenance pass of a worker's main process: one session at a time, and the
    # advisory lock that keeps passes one at a time across workers (sync.operations.maintenance).
    "maintenance": {"pool_size": 1, "max_overflow": 1, "pool_timeout": 10},
    "cli": {"pool_size": 2, "max_overflow": 2, "pool_timeout": 30},
}


class BurstPool(QueuePool):
    """A bounded pool that keeps every connection it opened while its process is busy, and
    closes the idle ones beyond ``keep`` when told that the process has gone quiet.

    SQLAlchemy's overflow connections are closed the moment they come back to a pool that
    already holds an idle one, which under steady load is most of the time: a thread then pays
    for a new PostgreSQL connection (a backend started, cold caches, statements prepared again)
    whenever two threads want the database at once."""

    def shrink(self, keep: int = 1) -> int:
        """Close idle connections beyond ``keep``; how many were closed."""
        closed = 0
        while self._pool.qsize() > keep:
            try:
                record = self._pool.get(False)
            except Empty:  # another thread took it: fewer idle ones, nothing to close
                break
            try:
                record.close()
            finally:
                self._dec_overflow()
            closed += 1
        return closed


def make_engine(url: str, *, role: str = "cli", **kwargs: Any) -> Engine:
    """An engine for ``url`` with a bounded pool sized for the process ``role`` (``web``,
    ``worker``, ``maintenance`` or ``cli``); SQLite gets WAL, a busy timeout and foreign keys."""
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
    options: dict[str, Any] = {
        # pg_stat_activity shows which kind of process holds each connection
        "connect_args": {
            "connect_timeout": CONNECT_TIMEOUT,
            "application_name": f"scrapesync-{role}",
        },
        "pool_pre_ping": True,
        "pool_recycle": RECYCLE_SECONDS,
        **POOLS[role],
        **kwargs,
    }
    ping_when_idle = role == "web" and "pool_pre_ping" not in kwargs
    if ping_when_idle:
        options["pool_pre_ping"] = False
    if role == "web" and "poolclass" not in kwargs:
        options["poolclass"] = BurstPool
    elif options.get("poolclass") is not None:  # e.g. NullPool takes no sizes
        for name in ("pool_size", "max_overflow", "pool_timeout"):
            options.pop(name, None)
    engine = create_engine(url, **options)
    if ping_when_idle:
        _ping_when_idle(engine)
    return engine


def _ping_when_idle(engine: Engine) -> None:
    """Check a pooled connection before use only when it has been idle for
    ``PING_AFTER_IDLE_SECONDS`` or longer; a failed check opens a fresh connection."""

    @event.listens_for(engine, "connect")
    def _fresh(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is not None and time.monotonic() - idle_since < PING_AFTER_IDLE_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:  # whatever the driver raised, the pool retries a new connection
            raise DisconnectionError(f"the pooled connection failed its check: {exc}") from exc


def missing_database_file(url: str) -> Path | None:
    """The file a SQLite URL names when it does not exist yet (connecting would create it
    empty), else None (PostgreSQL, in-memory SQLite, or a file that exists)."""
    if not url.startswith("sqlite"):
        return None
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    path = Path(database)
    return None if path.exists() else path


def require_database(url: str) -> None:
    """Refuse to open a SQLite database that does not exist: only ``db upgrade`` creates one."""
    missing = missing_database_file(url)
    if missing is not None:
        raise ConfigError(
            f"no database at {missing} (DATABASE_URL is "
            f"{'unset: the default' if url == DEFAULT_DATABASE_URL else 'set to'} "
            f"{url}): set DATABASE_URL to the deployment's database, or create this one with "
            "`scrapesync db upgrade`"
        )


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


def insert(session: Session, table: Any) -> postgresql.Insert | sqlite.Insert:
    """An INSERT of ``table`` in the session's dialect, so ``on_conflict_do_update`` and
    ``on_conflict_do_nothing`` are at hand on PostgreSQL and SQLite alike."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


_TRY_LOCK = text("SELECT pg_try_advisory_xact_lock(:space, hashtext(:key))")


@contextmanager
def alone(uow: UnitOfWork, space: int, key: str) -> Iterator[bool]:
    """Whether this block is the only one under way for ``(space, key)`` across all processes:
    PostgreSQL's advisory lock, taken in a transaction of its own connection and held until the
    block ends, so whatever ends the block (a process's death too) lets go. On SQLite, whose
    writers take turns anyway, always True."""
    if uow.dialect != "postgresql":
        yield True
        return
    with uow.engine.connect() as conn:
        try:
            yield bool(conn.execute(_TRY_LOCK, {"space": space, "key": key}).scalar_one())
        finally:
            conn.rollback()


@contextmanager
def planner_method_off(session: Session, setting: str) -> Iterator[None]:
    """On PostgreSQL, the statements of the block are planned without one method (``setting``,
    e.g. ``enable_nestloop``), for this transaction only (SET LOCAL), then with it again. For
    statements whose right plan PostgreSQL's statistics cannot show it; elsewhere a no-op."""
    with local_setting(session, setting, "off"):
        yield


@contextmanager
def local_setting(session: Session, setting: str, value: str) -> Iterator[None]:
    """On PostgreSQL, the statements of the block run with ``setting`` at ``value`` (a
    constant), for this transaction only (SET LOCAL), then with its default again; elsewhere a
    no-op."""
    if session.get_bind().dialect.name != "postgresql":
        yield
        return
    session.execute(text(f"SET LOCAL {setting} = '{value}'"))
    yield  # a statement that fails aborts the transaction, and its rollback drops the setting
    session.execute(text(f"SET LOCAL {setting} TO DEFAULT"))


def alembic_config(url: str) -> Config:
    """The Alembic configuration for the migrations shipped with the package."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision``."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Revert migrations down to ``revision``."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)
