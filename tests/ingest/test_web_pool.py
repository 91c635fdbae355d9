"""The web process's connection budget: at most two connections per gunicorn process, both kept
while requests keep coming, one once no request is in flight."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from flask import Flask
from sqlalchemy import Engine, text
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from sync import db
from sync.bootstrap import Services
from tests.harness import notify
from webhooks import QuietPool, create_app

pytestmark = pytest.mark.postgres


@pytest.fixture
def web_name() -> str:
    """The application name of this test's web connections in pg_stat_activity."""
    return f"scrapesync-web-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def web_engine(database_url: str, web_name: str) -> Iterator[Engine]:
    """An engine built as the web process builds its own, under a name of its own in
    pg_stat_activity (a short wait for a connection, so that a third one is refused at once)."""
    engine = db.make_engine(
        database_url,
        role="web",
        pool_timeout=0.2,
        connect_args={"connect_timeout": db.CONNECT_TIMEOUT, "application_name": web_name},
    )
    yield engine
    engine.dispose()


def _pool(engine: Engine) -> db.BurstPool:
    pool = engine.pool
    assert isinstance(pool, db.BurstPool)
    return pool


def _open_both(engine: Engine) -> None:
    """Two threads' worth of database at once: both of the pool's connections opened."""
    first, second = engine.connect(), engine.connect()
    first.close()
    second.close()


def _eventually(check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + 10
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _backends(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        count = conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :name"),
            {"name": name},
        )
        return int(count.scalar_one())


def _web_backends(engine: Engine, name: str, expected: int) -> bool:
    """Whether the web engine's backends number ``expected`` (a closed connection's backend
    leaves pg_stat_activity a moment after the client let go of it)."""
    return _eventually(lambda: _backends(engine, name) == expected)


def test_the_web_pool_keeps_two_connections_until_it_is_shrunk(
    web_engine: Engine, engine: Engine, web_name: str
) -> None:
    """Two connections used at once both stay open, a third is never opened, and shrinking
    closes the idle one beyond the first."""
    pool = _pool(web_engine)
    _open_both(web_engine)
    assert pool.checkedin() == 2
    assert _web_backends(engine, web_name, 2)
    held = [web_engine.connect(), web_engine.connect()]
    with pytest.raises(PoolTimeoutError):
        web_engine.connect()
    for conn in held:
        conn.close()
    assert pool.shrink(keep=1) == 1
    assert pool.checkedin() == 1
    assert _web_backends(engine, web_name, 1)
    assert pool.shrink(keep=1) == 0


def _held_request(web: Flask) -> tuple[threading.Event, threading.Event]:
    """A route that stays in flight until released; returns (entered, release)."""
    entered, release = threading.Event(), threading.Event()

    @web.get("/held")
    def held() -> str:
        entered.set()
        release.wait(10)
        return "done"

    return entered, release


def test_a_busy_web_process_keeps_both_connections_and_a_quiet_one_holds_one(
    services: Services, web_engine: Engine, engine: Engine, web_name: str
) -> None:
    """While a request is in flight both connections stay open, however long it takes; once
    the process has been quiet a moment it gives the second back."""
    web = create_app(dataclasses.replace(services, uow=db.UnitOfWork(web_engine)))
    middleware = web.wsgi_app
    assert isinstance(middleware, QuietPool)
    middleware.quiet_seconds = 0.05
    pool = _pool(web_engine)
    entered, release = _held_request(web)
    other = threading.Thread(target=lambda: web.test_client().get("/held"))
    other.start()
    assert entered.wait(10)
    _open_both(web_engine)
    assert notify(web, 5001).status_code == 200
    time.sleep(10 * middleware.quiet_seconds)  # the watcher looked several times meanwhile
    assert pool.checkedin() == 2  # a request is in flight: the spare stays
    release.set()
    other.join(10)
    assert _eventually(lambda: pool.checkedin() == 1)
    assert _web_backends(engine, web_name, 1)


def _kill_web_backends(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        killed = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = :name"
            ),
            {"name": name},
        )
        conn.commit()
        return int(killed.scalar_one())


def test_a_connection_idle_past_the_ping_threshold_is_checked_and_replaced(
    services: Services,
    web_engine: Engine,
    engine: Engine,
    web_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kept connection whose backend died while it sat idle is found out before use: the
    notification is stored on a fresh connection and answered 200."""
    web = create_app(dataclasses.replace(services, uow=db.UnitOfWork(web_engine)))
    assert notify(web, 5101).status_code == 200
    assert _kill_web_backends(engine, web_name) == 1
    monkeypatch.setattr(db, "PING_AFTER_IDLE_SECONDS", 0.0)  # as if it had sat idle a while
    assert notify(web, 5102).status_code == 200
    assert _web_backends(engine, web_name, 1)


def test_a_connection_back_in_use_at_once_is_not_pinged_and_a_dead_one_costs_one_503(
    services: Services,
    web_engine: Engine,
    engine: Engine,
    web_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within the ping threshold a notification is one round trip, unchecked; if the database
    went away in between, that notification is answered 503 (Cloud sends it again) with nothing
    stored, and the next one gets a fresh connection."""
    web = create_app(dataclasses.replace(services, uow=db.UnitOfWork(web_engine)))
    assert notify(web, 5201).status_code == 200
    monkeypatch.setattr(db, "PING_AFTER_IDLE_SECONDS", 3600.0)
    assert _kill_web_backends(engine, web_name) == 1
    assert notify(web, 5202).status_code == 503
    assert notify(web, 5202).status_code == 200
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM notifications WHERE job_id = 5202"))
        assert stored.scalar_one() == 1
