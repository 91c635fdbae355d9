"""The schema migrates up from empty and back down, on PostgreSQL and on SQLite."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import Engine, inspect, select, text
from sqlalchemy.exc import IntegrityError

from sync import db
from sync.acceptance import row_states
from sync.db import UnitOfWork
from sync.models import Base, Observation, OutboxEvent, SyncTask
from tests.conftest import table_names

EXPECTED_TABLES = {t.name for t in Base.metadata.sorted_tables}
NOW = datetime(2026, 12, 7, 6, 0)


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


def test_the_verdicts_written_into_rows_carry_over_to_the_verdicts_per_partition(
    database_url: str, engine: Engine, uow: UnitOfWork
) -> None:
    """Rows a verdict marked before 0016 keep their state (valid, quarantined) once the
    verdict is kept per partition, and rows written since that verdict stay pending; going back
    down writes each row's state into it again."""
    db.downgrade(database_url, "0015")
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO runs (run_id, dataset, collection_window, state, reasons, "
                    "revision, data_version, evaluated_version, created_at, updated_at) VALUES "
                    "('r', 'products', 'w', 'published', '[]', 1, 3, 2, :now, :now)"
                ),
                {"now": NOW},
            )
            for partition, state in (("p1", "passed"), ("p2", "quarantined")):
                conn.execute(
                    text(
                        "INSERT INTO partition_verdicts (run_id, partition, state, records, "
                        "reasons, evaluated_at) VALUES ('r', :p, :s, 2, '[]', :now)"
                    ),
                    {"p": partition, "s": state, "now": NOW},
                )
            rows = [
                ("k1", "p1", "a", "valid"),
                ("k2", "p1", "b", "pending"),  # written by a sync since the verdict
                ("k3", "p2", "a", "quarantined"),
                ("k4", "p2", "b", "pending"),
            ]
            for key, partition, attempt, state in rows:
                conn.execute(
                    text(
                        "INSERT INTO observations (observation_key, dataset, entity_key, run_id, "
                        "collection_window, partition, payload, payload_hash, source_job_id, "
                        "source_attempt_id, validation_state, first_seen_at, last_changed_at) "
                        "VALUES (:k, 'products', :e, 'r', 'w', :p, '{}', 'h', 1, :a, :s, :now, "
                        ":now)"
                    ),
                    {"k": key, "e": key, "p": partition, "a": attempt, "s": state, "now": NOW},
                )
        db.upgrade(database_url)
        with uow.begin() as session:
            found = dict(
                session.execute(
                    select(Observation.entity_key, row_states.state(session, "r")).where(
                        Observation.run_id == "r"
                    )
                ).all()
            )
        assert found == {s[0]: s[3] for s in rows}
        db.downgrade(database_url, "0015")
        with engine.connect() as conn:
            back = dict(
                conn.execute(text("SELECT entity_key, validation_state FROM observations")).all()
            )
        assert back == {s[0]: s[3] for s in rows}
    finally:
        db.upgrade(database_url)
        with engine.begin() as conn:
            for table in ("observations", "partition_verdicts", "run_imports", "runs"):
                conn.execute(text(f"DELETE FROM {table} WHERE run_id = 'r'"))  # noqa: S608
