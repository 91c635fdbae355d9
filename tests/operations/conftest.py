"""Fixtures of the retention tests: a dataset that keeps seven windows, runs and observations
written in bulk, and the dataset's own tables made for the test and dropped after it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, func, insert, literal, select, text
from sqlalchemy.orm import Session

from sync.bootstrap import Services
from sync.datasets.tables import DatasetTables, tables_for
from sync.models import Observation, Publication, Run
from tests.harness import datasets_from

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
FIRST_DAY = datetime(2026, 11, 1, tzinfo=UTC)

RETENTION_TOML = """
[datasets.pruned]
sitemap = "pruned"
entity_key = ["sku"]
window = "daily"
retain_windows = 7

[datasets.everything]
sitemap = "everything"
entity_key = ["sku"]
window = "daily"
"""


@pytest.fixture
def kept(services: Services) -> Services:
    """Services whose datasets file has ``pruned`` (seven windows kept) and ``everything`` (no
    retain_windows), on a stopped clock."""
    return dataclasses.replace(
        services,
        datasets=datasets_from(RETENTION_TOML),
        clock=lambda: NOW,
    )


def window(day: int) -> str:
    """The daily collection window ``day`` days after the first one."""
    return (FIRST_DAY + timedelta(days=day)).strftime("%Y-%m-%d")


def add_runs(session: Session, dataset: str, days: range, *, state: str = "accepted") -> list[str]:
    """One run per daily window, created on its day; returns their run ids in window order."""
    run_ids = []
    for day in days:
        run_id = f"{dataset}-{window(day)}"
        session.add(
            Run(
                run_id=run_id,
                dataset=dataset,
                collection_window=window(day),
                state=state,
                created_at=FIRST_DAY + timedelta(days=day, hours=1),
            )
        )
        run_ids.append(run_id)
    session.flush()
    return run_ids


def publish(session: Session, dataset: str, run_id: str) -> None:
    """Make ``run_id`` the dataset's current publication."""
    session.add(Publication(dataset=dataset, run_id=run_id, is_current=True, published_at=NOW))
    session.flush()


def observe(session: Session, dataset: str, run_ids: list[str], entities: int) -> None:
    """``entities`` observations under each run: the first run's written in one statement, the
    others copied from it in SQL (fast at hundreds of thousands of rows)."""
    o = Observation.__table__
    first, *rest = run_ids
    first_window = first.removeprefix(f"{dataset}-")
    session.execute(
        insert(o),
        [
            {
                "observation_key": f"{first_window}:SKU-{n:05d}",
                "dataset": dataset,
                "entity_key": f"SKU-{n:05d}",
                "run_id": first,
                "collection_window": first_window,
                "payload": {"sku": f"SKU-{n:05d}", "price": str(n)},
                "payload_hash": "h" * 64,
                "source_job_id": 1,
                "source_attempt_id": "a",
                "first_seen_at": NOW,
                "last_changed_at": NOW,
            }
            for n in range(entities)
        ],
    )
    copied = [
        "observation_key",
        "dataset",
        "entity_key",
        "run_id",
        "collection_window",
        "payload",
        "payload_hash",
        "source_job_id",
        "source_attempt_id",
        "first_seen_at",
        "last_changed_at",
    ]
    for run_id in rest:
        other = run_id.removeprefix(f"{dataset}-")
        session.execute(
            insert(o).from_select(
                copied,
                select(
                    literal(f"{other}:") + o.c.entity_key,
                    o.c.dataset,
                    o.c.entity_key,
                    literal(run_id),
                    literal(other),
                    o.c.payload,
                    o.c.payload_hash,
                    o.c.source_job_id,
                    o.c.source_attempt_id,
                    o.c.first_seen_at,
                    o.c.last_changed_at,
                ).where(o.c.run_id == first),
            )
        )


def windows_left(session: Session, dataset: str) -> dict[str, int]:
    """How many observations each window of ``dataset`` still has."""
    o = Observation.__table__
    rows = session.execute(
        select(o.c.collection_window, func.count())
        .where(o.c.dataset == dataset)
        .group_by(o.c.collection_window)
    ).all()
    return {window: count for window, count in rows}


@pytest.fixture
def pruned_tables(engine: Engine) -> Iterator[DatasetTables]:
    """The ``pruned`` dataset's current, history and changes tables, dropped after the test."""
    tables = tables_for("pruned", (), dialect=engine.dialect.name, schema="datasets")
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("CREATE SCHEMA IF NOT EXISTS datasets"))
    tables.metadata.drop_all(engine)
    tables.metadata.create_all(engine)
    yield tables
    tables.metadata.drop_all(engine)
