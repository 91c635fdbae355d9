"""Clear errors at the door: each process checks its variables at start-up and names the one at
fault, a bad DATABASE_URL is one line with the password masked, no command creates an empty
database by accident, a downgrade says what it drops, wrong tokens are logged and counted, and
/healthz names the store it cannot reach."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import inspect

from simulator import SimServer
from sync import db
from sync.bootstrap import Services
from sync.logs import JsonFormatter
from tests.conftest import dataset_tables
from tests.harness import BIN, WEBHOOK_TOKEN, deployment_env, run_worker
from webhooks import create_app

PASSWORD = "s3cret-db-pass"


def _scrapesync(
    args: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "scrapesync"), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _bare_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    datasets = Path(__file__).parents[2] / "config" / "datasets.toml"
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "SCRAPESYNC_DATASETS": str(datasets),
        **extra,
    }


@pytest.mark.redis
def test_a_worker_without_its_cloud_token_exits_at_start_naming_it(
    tmp_path: Path, database_url: str, sim: SimServer
) -> None:
    """`rq worker` without WEBSCRAPER_API_TOKEN stops at once with the variable's name, rather
    than starting and failing its tasks at info level."""
    env = deployment_env(tmp_path, database_url=database_url, sim=sim)
    del env["WEBSCRAPER_API_TOKEN"]
    done = run_worker(env)
    assert done.returncode != 0
    assert "WEBSCRAPER_API_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("url", "named"),
    [
        (f"postgress://app:{PASSWORD}@db.example/app", "'postgress'"),
        (f"mysql://app:{PASSWORD}@db.example/app", "'mysql'"),
        (f"app:{PASSWORD}@db.example/app", "not a database URL"),
        (f"postgresql://app:{PASSWORD}@nohost.invalid/app", "nohost.invalid"),
    ],
    ids=["misspelt-scheme", "other-scheme", "no-scheme", "unknown-host"],
)
@pytest.mark.parametrize("command", ["status", "doctor"])
def test_a_bad_database_url_is_one_line_naming_scheme_or_host_with_the_password_masked(
    tmp_path: Path, url: str, named: str, command: str
) -> None:
    """A mistyped DATABASE_URL: no traceback, the scheme or host at fault named, the password
    never shown (in `doctor` too)."""
    done = _scrapesync([command], _bare_env(tmp_path, DATABASE_URL=url), tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in output
    assert PASSWORD not in output
    database_lines = [
        x for x in output.splitlines() if named in x and ("DATABASE_URL" in x or "database" in x)
    ]
    assert database_lines, output
    if command == "status":
        assert len(output.strip().splitlines()) == 1
        assert output.startswith("error: ")


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["doctor"]])
def test_no_command_creates_an_empty_database_when_database_url_is_unset(
    tmp_path: Path, command: list[str]
) -> None:
    """`status` with DATABASE_URL unset says there is no database and leaves no empty
    scrapesync.db behind (it said "no such table" and made one)."""
    done = _scrapesync(command, _bare_env(tmp_path), tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in output
    assert "no such table" not in output
    assert "scrapesync.db" in output
    assert not (tmp_path / "scrapesync.db").exists()


def test_db_downgrade_below_head_needs_yes_and_says_what_it_drops(
    tmp_path: Path, database_url: str, services: Services
) -> None:
    """`db downgrade base` without --yes drops nothing and lists the tables it would drop,
    the datasets' tables included; with --yes the schema is empty, datasets.* gone too. With
    --json, it and `db upgrade` print one JSON document of what they did."""
    from sync.datasets.schema import ensure_tables

    own = f"sqlite:///{tmp_path / 'own.db'}"
    db.upgrade(own)
    engine = db.make_engine(own)
    ensure_tables(db.UnitOfWork(engine), services.datasets.get("products"), "datasets")
    with engine.connect() as conn:
        assert dataset_tables(conn)
    env = _bare_env(tmp_path, DATABASE_URL=own)
    refused = _scrapesync(["db", "downgrade", "base"], env, tmp_path)
    assert refused.returncode != 0
    assert "--yes" in refused.stderr
    assert "runs" in refused.stderr
    assert "observations" in refused.stderr
    assert "datasets_products" in refused.stderr
    assert "0001" in refused.stderr
    assert "sync_tasks" in inspect(engine).get_table_names()
    done = _scrapesync(["db", "downgrade", "base", "--yes", "--json"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    dropped = json.loads(done.stdout)  # with --json, standard output is the one document
    assert dropped["revision"] == "base"
    assert {"runs", "observations", "sync_tasks"} <= set(dropped["tables"])
    assert "datasets_products" in dropped["dataset_objects"]
    engine.dispose()
    left = inspect(db.make_engine(own)).get_table_names()
    assert [t for t in left if t != "alembic_version"] == []
    again = _scrapesync(["db", "upgrade", "--json"], env, tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["revision"] == "head"
    assert "sync_tasks" in inspect(db.make_engine(own)).get_table_names()


@pytest.fixture
def scratch_postgres() -> Iterator[str]:
    """A PostgreSQL database of this test's own beside the session's, migrated to head and
    dropped afterwards (a downgrade to base must not take the session's schema with it)."""
    from sqlalchemy import make_url, text

    from tests.conftest import BASE_DATABASE_URL, _session_database_name

    name = f"{_session_database_name()}_downgrade"
    admin = db.make_engine(BASE_DATABASE_URL, isolation_level="AUTOCOMMIT")

    def recreate(*, create: bool) -> None:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            if create:
                conn.execute(text(f"CREATE DATABASE {name}"))

    try:
        recreate(create=True)
        url = make_url(BASE_DATABASE_URL).set(database=name)
        yield url.render_as_string(hide_password=False)
        recreate(create=False)
    finally:
        admin.dispose()


@pytest.mark.postgres
def test_db_downgrade_base_on_postgresql_names_and_drops_the_datasets_schema(
    tmp_path: Path, scratch_postgres: str, services: Services
) -> None:
    """On PostgreSQL, `db downgrade base` without --yes names the datasets.* tables it would
    drop and drops nothing; with --yes no table is left, and the datasets schema is gone too."""
    from sync.datasets.schema import ensure_tables

    db.upgrade(scratch_postgres)
    engine = db.make_engine(scratch_postgres)
    try:
        ensure_tables(db.UnitOfWork(engine), services.datasets.get("products"), "datasets")
        with engine.connect() as conn:
            made = dataset_tables(conn)
        assert "datasets.products" in made
        env = _bare_env(tmp_path, DATABASE_URL=scratch_postgres)
        refused = _scrapesync(["db", "downgrade", "base"], env, tmp_path)
        assert refused.returncode != 0
        assert "--yes" in refused.stderr
        assert "datasets.products" in refused.stderr
        assert "sync_tasks" in refused.stderr
        with engine.connect() as conn:
            assert dataset_tables(conn) == made
        assert "sync_tasks" in inspect(engine).get_table_names()
        done = _scrapesync(["db", "downgrade", "base", "--yes"], env, tmp_path)
        assert done.returncode == 0, done.stderr
        engine.dispose()
        left = inspect(engine)
        assert [t for t in left.get_table_names() if t != "alembic_version"] == []
        assert "datasets" not in left.get_schema_names()
    finally:
        engine.dispose()


@pytest.fixture
def intake_log() -> Iterator[list[str]]:
    """The web process's intake log lines, as the JSON the deployment writes."""
    lines: list[str] = []
    formatter = JsonFormatter()

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(formatter.format(record))

    handler = Keep()
    logger = logging.getLogger("scrapesync.intake")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


@pytest.mark.redis
def test_a_wrong_token_notification_is_logged_masked_and_counted(
    services: Services, intake_log: list[str]
) -> None:
    """A notification with a wrong token: 404, a warning whose path is masked (neither the
    wrong token nor the right one in it), and /metrics counts it."""
    token = "metrics-door-token"
    settings = dataclasses.replace(services.settings, status_token=token)
    app: Flask = create_app(dataclasses.replace(services, settings=settings))
    client = app.test_client()
    for _ in range(2):
        answer = client.post("/webhooks/webscraper/hook-secret-12X", data={"scrapingjob_id": "5"})
        assert answer.status_code == 404
    refused = [x for x in intake_log if "notification.wrong_token" in x]
    assert len(refused) == 2
    assert "/webhooks/webscraper/***" in refused[0]
    assert "hook-secret-12X" not in "".join(intake_log)
    assert WEBHOOK_TOKEN not in "".join(intake_log)
    body = client.get(f"/metrics?token={token}").get_data(as_text=True)
    counted = {
        s.labels.get("reason"): s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if s.name == "scrapesync_notifications_refused_total"
    }
    assert counted == {"wrong_token": 2.0}


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.redis
def test_healthz_answers_503_naming_redis_when_redis_is_down(services: Services) -> None:
    """/healthz is 503 and names Redis when Redis cannot be reached (it said 200)."""
    from sync.bootstrap import connect_redis

    down = dataclasses.replace(services, redis=connect_redis(f"redis://127.0.0.1:{_closed_port()}"))
    answer = create_app(down).test_client().get("/healthz")
    assert answer.status_code == 503
    assert answer.json["unreachable"] == ["redis"]
    assert "Redis" in answer.json["detail"]


def test_healthz_answers_503_naming_postgresql_when_it_is_down(services: Services) -> None:
    """/healthz is 503 and names PostgreSQL when the database cannot be reached."""
    engine = db.make_engine(
        f"postgresql+psycopg://postgres@127.0.0.1:{_closed_port()}/none", role="web"
    )
    down = dataclasses.replace(services, uow=db.UnitOfWork(engine))
    answer = create_app(down).test_client().get("/healthz")
    assert answer.status_code == 503
    assert "database" in answer.json["unreachable"]
    assert "PostgreSQL" in answer.json["detail"]


@pytest.mark.parametrize("args", [["sync", "5"], ["launch", "products"], ["reconcile"]], ids=str)
def test_commands_that_talk_to_cloud_name_the_missing_token_before_doing_anything(
    tmp_path: Path, database_url: str, services: Services, args: list[str]
) -> None:
    """`sync`, `launch` and `reconcile` without WEBSCRAPER_API_TOKEN: one line naming it, exit
    2, and no task or run written before the failure."""
    from sqlalchemy import func, select

    from sync.models import Run, SyncTask

    env = _bare_env(tmp_path, DATABASE_URL=database_url)
    done = _scrapesync(args, env, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ")
    assert "WEBSCRAPER_API_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr
    with services.uow.begin() as session:
        assert session.execute(select(func.count()).select_from(SyncTask)).scalar_one() == 0
        assert session.execute(select(func.count()).select_from(Run)).scalar_one() == 0


@pytest.mark.parametrize(
    ("missing", "present"),
    [("WEBHOOK_TOKEN", {"REDIS_URL": "redis://127.0.0.1:6379/0"}), ("REDIS_URL", {})],
)
def test_the_web_process_names_a_missing_variable_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str, present: dict[str, str]
) -> None:
    """gunicorn's factory without WEBHOOK_TOKEN or REDIS_URL stops with the variable's name."""
    from config.settings import ConfigError

    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'none.db'}")
    monkeypatch.setenv("WEBHOOK_TOKEN", "set")
    for name in ("REDIS_URL", missing):
        monkeypatch.delenv(name, raising=False)
    for name, value in present.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=missing):
        create_app()
