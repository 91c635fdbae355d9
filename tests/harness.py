"""The test harness of the sync path, loaded as a pytest plugin by tests/conftest.py: the
simulator as Cloud (in-process and on loopback), services wired to the real databases, the web
app, and real worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from flask import Flask
from redis import Redis
from rq import SimpleWorker
from sqlalchemy import select

from config.datasets import Datasets, parse_datasets
from config.settings import Settings
from simulator import CloudState, serve
from simulator import create_app as create_simulator
from simulator.server import SimServer
from sync import bootstrap
from sync.bootstrap import Services
from sync.cloud.budget import MemoryApiBudget
from sync.db import UnitOfWork
from sync.ingest.store import count_rows
from sync.models import Attempt, Observation, SyncTask
from sync.queue import RQDispatcher
from sync.worker import BoundedUnsubscribe
from webhooks import create_app

API_TOKEN = "sim-token"
WEBHOOK_TOKEN = "hook-secret-123"

DATASETS_TOML = """
[datasets.products]
sitemap = "products"
entity_key = ["sku"]
window = "daily"
partition = "retailer"
required = ["sku", "price"]
[datasets.products.quality]
parsers = { price = "number" }
"""


def datasets_from(toml: str = DATASETS_TOML) -> Datasets:
    """The datasets a test deployment reads from this datasets file's text."""
    return parse_datasets(toml, source="tests")


def write_datasets(folder: Path, toml: str = DATASETS_TOML, *, name: str = "datasets.toml") -> Path:
    """Write a datasets file into ``folder`` for a process to read (``SCRAPESYNC_DATASETS``,
    ``--datasets``); its path."""
    path = folder / name
    path.write_text(toml, encoding="utf-8")
    return path


@pytest.fixture
def datasets() -> Datasets:
    """The test deployment's datasets file."""
    return datasets_from(DATASETS_TOML)


@pytest.fixture
def cloud() -> Iterator[CloudState]:
    """A simulated Cloud account with the ``products`` sitemap."""
    state = CloudState(api_token=API_TOKEN, notify_delays=(0.05, 0.1))
    state.add_sitemap("products", start_urls=["https://alpha.example/"])
    yield state
    state.close()


def products_sitemap(cloud: CloudState) -> int:
    """The id of the ``products`` sitemap."""
    return next(sid for sid, s in cloud.sitemaps.items() if s.name == "products")


@pytest.fixture
def sleeps() -> list[float]:
    """The waits the Cloud client asked for (it does not really sleep in tests)."""
    return []


@pytest.fixture
def services(
    database_url: str,
    uow: UnitOfWork,
    redis_conn: Redis,
    cloud: CloudState,
    datasets: Datasets,
    sleeps: list[float],
) -> Iterator[Services]:
    """Services wired to the test database, real Redis and the in-process simulator."""
    settings = Settings(
        database_url=database_url,
        redis_url=None,
        api_url="http://cloud.test/api/v1/",
        api_token=API_TOKEN,
        webhook_token=WEBHOOK_TOKEN,
        lease_seconds=60.0,
    )
    built = wire(settings, datasets, uow, redis_conn, cloud, sleeps)
    yield built
    bootstrap.use(None)


def wire(
    settings: Settings,
    datasets: Datasets,
    uow: UnitOfWork,
    redis_conn: Redis,
    cloud: CloudState,
    sleeps: list[float],
) -> Services:
    """Services built as production builds them, on the test database, Redis and simulator."""
    built = bootstrap.build(
        settings,
        datasets=datasets,
        redis=redis_conn,
        transport=httpx.WSGITransport(app=create_simulator(cloud)),
        budget=MemoryApiBudget(limit=1000, window=900.0),
        sleep=sleeps.append,
        uow=uow,
    )
    bootstrap.use(built)
    return built


@pytest.fixture
def web(services: Services) -> Flask:
    """The web process's Flask app on the same services."""
    app = create_app(services)
    app.testing = True
    return app


def notify(web: Flask, job_id: int, status: str = "finished", **extra: str) -> Any:
    """Post a Cloud-shaped notification to the web app."""
    form = {
        "scrapingjob_id": str(job_id),
        "status": status,
        "sitemap_id": "1",
        "sitemap_name": "products",
        "custom_id": "",
        **extra,
    }
    return web.test_client().post(f"/webhooks/webscraper/{WEBHOOK_TOKEN}", data=form)


class DrainWorker(BoundedUnsubscribe, SimpleWorker):
    """RQ's in-process worker, leaving as quickly as the production worker does."""


def drain(services: Services) -> int:
    """Run every queued RQ job in this process, as a worker would; returns how many ran."""
    dispatcher = services.dispatcher
    assert isinstance(dispatcher, RQDispatcher)
    worker = DrainWorker(
        [dispatcher.queue], connection=dispatcher.redis, serializer=dispatcher.queue.serializer
    )
    ran = 0
    while dispatcher.queue.count:
        ran += dispatcher.queue.count
        worker.work(burst=True)
    return ran


def at_time(services: Services, moment: datetime) -> Services:
    """The same services, seeing the clock stopped at ``moment``."""
    return replace(services, clock=lambda: moment)


def task_of(services: Services, key: str) -> SimpleNamespace:
    """A sync task's row as plain values."""
    with services.uow.begin() as session:
        row = (
            session.execute(select(SyncTask.__table__).where(SyncTask.task_key == key))
            .mappings()
            .one()
        )
        return SimpleNamespace(**row)


def attempts_of(services: Services, key: str) -> list[SimpleNamespace]:
    """A sync task's attempts as plain values, oldest first."""
    with services.uow.begin() as session:
        rows = (
            session.execute(
                select(Attempt.__table__)
                .where(Attempt.task_key == key)
                .order_by(Attempt.started_at)
            )
            .mappings()
            .all()
        )
        return [SimpleNamespace(**r) for r in rows]


def observation_count(services: Services) -> int:
    """How many observations the database holds."""
    with services.uow.begin() as session:
        return count_rows(session, Observation)


BIN = Path(sys.executable).parent


@pytest.fixture
def sim(cloud: CloudState) -> Iterator[SimServer]:
    """The simulator on a loopback socket, as a worker process reaches Cloud."""
    with serve(cloud, host="127.0.0.1", port=0) as server:
        yield server


def deployment_env(
    tmp_path: Path,
    *,
    database_url: str,
    sim: SimServer,
    datasets_toml: str = DATASETS_TOML,
    **extra: str,
) -> dict[str, str]:
    """The environment of a web or worker process of a test deployment."""
    from tests.conftest import REDIS_URL

    datasets_file = write_datasets(tmp_path, datasets_toml)
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
        "WEBSCRAPER_API_URL": sim.api_url,
        "WEBSCRAPER_API_TOKEN": API_TOKEN,
        "WEBHOOK_TOKEN": WEBHOOK_TOKEN,
        "SCRAPESYNC_DATASETS": str(datasets_file),
        **extra,
    }


def run_worker(
    env: Mapping[str, str], kill_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the Procfile's worker in burst mode until the queue is empty (SIGKILLed at
    ``kill_at`` if given)."""
    extra = {"SCRAPESYNC_KILL_AT": kill_at} if kill_at else {}
    return subprocess.run(
        [
            str(BIN / "rq"),
            "worker",
            "--burst",
            "--worker-class",
            "sync.worker.SyncWorker",
            "--serializer",
            "rq.serializers.JSONSerializer",
            "--url",
            env["REDIS_URL"],
            "scrapesync",
        ],
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
