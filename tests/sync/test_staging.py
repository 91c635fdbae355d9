"""Staging one job's records and merging them into observations, whichever way they are staged."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select

from sync.bootstrap import Services
from sync.identity import RecordIdentity
from sync.models import Observation
from sync.staging import ObservationStager, UpsertCounts

pytestmark = pytest.mark.postgres

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _merge(services: Services, attempt: str, records: list[dict[str, Any]]) -> tuple[bool, Any]:
    """Stage ``records`` into run r and merge them under ``attempt``; (keys first?, counts)."""
    identify = RecordIdentity(services.datasets.get("products"), "2026-12-03")
    with services.uow.begin() as session:
        stager = ObservationStager(session, run_id="r")
        for record in records:
            staged = identify(record)
            assert staged is not None
            stager.add(staged)
        counts = stager.merge(
            dataset="products",
            run_id="r",
            window="2026-12-03",
            job_id=1,
            attempt_id=attempt,
            now=NOW,
        )
        session.commit()
    return stager.keys_first, counts


def test_keys_first_staging_writes_and_counts_what_whole_rows_do(services: Services) -> None:
    """Into a run that holds observations, only keys and hashes are staged and the payloads of
    new and changed records sent after: new rows inserted, changed ones updated, unchanged
    ones untouched, and the last record of a key wins."""

    def product(sku: str, price: str) -> dict[str, Any]:
        return {"sku": sku, "price": price, "retailer": "r.example"}

    keys_first, _ = _merge(services, "a1", [product("A", "1"), product("B", "3")])
    assert not keys_first  # an empty run: whole rows at once
    records = [product("A", "1"), product("B", "4"), product("D", "7"), product("D", "8")]
    keys_first, counts = _merge(services, "a2", [*records, product("E", "9")])
    assert keys_first
    assert counts == UpsertCounts(
        staged=5, inserted=2, updated=1, unchanged=1, duplicate_keys=1, conflicting_duplicates=1
    )
    o = Observation.__table__.c
    with services.uow.begin() as session:
        rows = session.execute(select(o.entity_key, o.payload, o.source_attempt_id)).all()
    stored = {key: (payload["price"], attempt) for key, payload, attempt in rows}
    assert stored == {"A": ("1", "a1"), "B": ("4", "a2"), "D": ("8", "a2"), "E": ("9", "a2")}
