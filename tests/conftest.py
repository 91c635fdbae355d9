"""Shared fixtures: a real database (PostgreSQL by default, SQLite when asked) and real Redis."""

from __future__ import annotations

import fcntl
import functools
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

# A machine that sets PYTHONDONTWRITEBYTECODE (containers often do) would have every test
# process compile each test module, rewrite its asserts, and compile the product's modules, on
# every run: seconds of each loop. The tests keep their bytecode in .pytest_cache instead, out
# of the source tree, for this process and the commands it starts.
if sys.dont_write_bytecode:
    _PYCACHE = str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "pycache")
    sys.pycache_prefix = _PYCACHE
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = _PYCACHE
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import pytest
from sqlalchemy import Connection, Engine, MetaData, inspect, make_url, text

from sync import db
from sync.models import Base

pytest_plugins = ["tests.harness"]

# Two test sessions may run at once on one machine (a developer's and CI's), each spread over
# worker processes: each process that runs tests claims a slot, held by a file lock for as long as
# it lives, and takes that slot's PostgreSQL database and Redis databases. A crashed process's lock
# goes with it. The slot is claimed on first use, so the process that only hands tests out to the
# workers holds none.
SLOTS = ((14, 15), (12, 13), (10, 11), (4, 5), (2, 3))  # Redis dbs: the sync path's, the client's
_held: list[int] = []


@functools.cache
def _slot() -> int:
    for slot in range(len(SLOTS)):
        path = os.path.join(tempfile.gettempdir(), f"scrapesync-tests-slot-{slot}.lock")
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _held.append(fd)
        return slot
    raise RuntimeError(f"all {len(SLOTS)} test slots are taken: too many test processes at once")


def _session_database_name() -> str:
    return f"scrapesync_test_{_slot()}"


def _redis_url() -> str:
    default = f"redis://127.0.0.1:6379/{SLOTS[_slot()][0]}"
    return os.environ.get("SCRAPESYNC_TEST_REDIS_URL", default)


def __getattr__(name: str) -> object:
    """``REDIS_URL`` and ``CLIENT_REDIS_URL``: this process's Redis databases, its slot claimed
    on first use."""
    if name == "REDIS_URL":
        return _redis_url()
    if name == "CLIENT_REDIS_URL":
        default = f"redis://127.0.0.1:6379/{SLOTS[_slot()][1]}"
        return os.environ.get("SCRAPESYNC_TEST_CLIENT_REDIS_URL", default)
    raise AttributeError(name)


BASE_DATABASE_URL = os.environ.get(
    "SCRAPESYNC_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
ON_SQLITE = BASE_DATABASE_URL.startswith("sqlite")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long fuzz runs only when ``-m fuzz`` asks; on the SQLite pass, leave out tests that
    need PostgreSQL."""
    if "fuzz" not in (config.option.markexpr or ""):
        fuzz = [item for item in items if "fuzz" in item.keywords]
        if fuzz:
            config.hook.pytest_deselected(items=fuzz)
            items[:] = [item for item in items if "fuzz" not in item.keywords]
    if not ON_SQLITE:
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL; this pass runs on SQLite")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


DATA_SCHEMA = "datasets"  # the tests' SCRAPESYNC_DATA_SCHEMA (the default)


def _drop_everything(engine: Engine) -> None:
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {DATA_SCHEMA} CASCADE"))
    meta = MetaData()
    meta.reflect(engine)
    meta.drop_all(engine)


def dataset_tables(conn: Connection) -> list[str]:
    """The datasets' tables that exist now, as SQL names (``datasets.products``)."""
    if conn.dialect.name == "postgresql":
        names = conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = :schema"),
            {"schema": DATA_SCHEMA},
        ).scalars()
        return [f"{DATA_SCHEMA}.{name}" for name in names]
    return list(
        conn.execute(
            text("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE :prefix"),
            {"prefix": f"{DATA_SCHEMA}_%"},
        ).scalars()
    )


def _session_database(base_url: str, *, create: bool) -> str:
    """The session's own PostgreSQL database beside ``base_url``'s, dropped (and made afresh)."""
    name = _session_database_name()
    admin = db.make_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            if create:
                conn.execute(text(f"CREATE DATABASE {name}"))
    finally:
        admin.dispose()
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of the session's own test database, migrated to head once per session."""
    url = BASE_DATABASE_URL
    if ON_SQLITE and url in ("sqlite://", "sqlite:///:memory:", "sqlite:///"):
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'scrapesync.db'}"
    if not ON_SQLITE:
        url = _session_database(BASE_DATABASE_URL, create=True)
    engine = db.make_engine(url)
    _drop_everything(engine)
    engine.dispose()
    db.upgrade(url)
    yield url
    if not ON_SQLITE:
        _session_database(BASE_DATABASE_URL, create=False)


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    """One engine for the session."""
    engine = db.make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def uow(engine: Engine) -> db.UnitOfWork:
    """A unit of work over empty tables, their id sequences started afresh. The tables are
    emptied with DELETE, children first: on the few rows a test leaves that takes milliseconds,
    where PostgreSQL's TRUNCATE of every table takes a quarter of a second per test. The
    datasets' tables are emptied too and kept, so that a test does not pay for creating them
    again when it asks for the same columns (empty tables holding other columns than the
    registry, emptied here too, are made afresh)."""
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with engine.begin() as conn:
        for name in dataset_tables(conn):
            conn.execute(text(f"DELETE FROM {name}"))  # noqa: S608 - names read from the catalog
        for name in tables:
            conn.execute(text(f"DELETE FROM {name}"))  # noqa: S608 - table names come from the models
        if engine.dialect.name == "postgresql":
            conn.execute(
                text("SELECT setval(oid::regclass, 1, false) FROM pg_class WHERE relkind = 'S'")
            )
    return db.UnitOfWork(engine)


@pytest.fixture
def redis_conn() -> Iterator[object]:
    """A real Redis connection on a database the tests own, emptied before and after."""
    import redis

    conn = redis.Redis.from_url(_redis_url())
    conn.flushdb()
    yield conn
    conn.flushdb()
    conn.close()


def table_names(engine: Engine) -> set[str]:
    """The tables the database has now."""
    return set(inspect(engine).get_table_names())
