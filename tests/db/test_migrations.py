"""The schema migrates up from empty and back down, on PostgreSQL and on SQLite."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, inspect
from sqlalchemy.exc import IntegrityError

from sync import db
from sync.db import UnitOfWork
from sync.models import Base, Observation, OutboxEvent, SyncTask
from tests.conftest import table_names

EXPECTED_TABLES = {t.name for t in Base.metadata.sorted_tables}


def test_migrations_go_down_to_empty_and_back_up(database_url: str, engine: Engine) -> None:
    """Downgrading to base removes every table; upgrading to head brings them all back."""
    db.downgrade(database_url, "base")
    assert table_names(engine) & EXPECTED_TABLES == set()
    db.upgrade(database_url)
    assert table_names(engine) >= EXPECTED_TABLES


def test_migrated_schema_matches_the_models(engine: Engine) -> None:
    """Every model column exists in the migrated schema, so the code and migrations agree."""
    inspector = inspect(engine)
    for table in Base.metadata.sorted_tables:
        columns = {c["name"] for c in inspector.get_columns(table.name)}
        assert {c.name for c in table.columns} == columns, table.name


def _observation() -> Observation:
    return Observation(
        observation_key="k" * 64,
        dataset="products",
        entity_key="SKU-1",
        run_id="products-2026-12-02",
        collection_window="2026-12-02",
        payload={"sku": "SKU-1"},
        payload_hash="h" * 64,
        source_job_id=1,
        source_attempt_id="a",
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: SyncTask(task_key="job-1", job_id=1),
        lambda: OutboxEvent(event_id="evt-1", event_type="run.accepted", payload={}),
        _observation,
    ],
    ids=["task_key", "event_id", "observation_key"],
)
def test_stable_keys_are_enforced_by_the_database(uow: UnitOfWork, make: object) -> None:
    """A second row with the same task key, event id or observation key is refused."""
    assert callable(make)
    with uow.begin() as session:
        session.add(make())
        session.commit()
    with uow.begin() as session:
        session.add(make())
        with pytest.raises(IntegrityError):
            session.flush()
