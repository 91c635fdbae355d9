"""Staging one job's records and merging them into observations, whichever way they are staged."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from sync.bootstrap import Services
from sync.identity import RecordIdentity
from sync.ingest.direct_copy import DirectCopy
from sync.ingest.staging import ObservationStager, Source, UpsertCounts
from sync.models import Observation

pytestmark = pytest.mark.postgres

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _merge(
    services: Services,
    attempt: str,
    records: list[dict[str, Any]],
    *,
    run_id: str = "r",
    early: bool = True,
) -> tuple[bool, Any]:
    """Stage ``records`` into ``run_id`` and merge them under ``attempt`` (``early``: two
    records at a time while they are staged, where the run holds rows); (keys first?, counts)."""
    stager, counts = _sync(services, attempt, records, run_id=run_id, straight=False, early=early)
    return stager.keys_first, counts


def _sync(
    services: Services,
    attempt: str,
    records: list[dict[str, Any]],
    *,
    run_id: str,
    straight: bool,
    window: str = "2026-12-03",
    early: bool = True,
) -> tuple[ObservationStager, UpsertCounts]:
    """Stage ``records`` into ``run_id`` as a sync does (``straight``: offering a run's first
    sync the copy straight into observations; ``early``: a later one the merge while staging,
    two records at a time) and merge them; (the stager, its counts)."""
    identify = RecordIdentity(services.datasets.get("products"), window)
    source = Source("products", run_id, window, 1, attempt, NOW)
    with services.uow.begin() as session:
        stager = ObservationStager(
            session,
            run_id=run_id,
            source=source if straight or early else None,
            merge_early=early,
            merge_batch=2,
        )
        for record in records:
            staged = identify(record)
            assert staged is not None
            stager.add(staged)
        stager.flush()  # the end of the export
        counts = stager.merge(source, now=NOW)
        session.commit()
    return stager, counts


def _stored(services: Services, run_id: str) -> dict[str, tuple[Any, ...]]:
    """entity key -> what its observation in ``run_id`` holds, besides run, window and key."""
    o = Observation.__table__.c
    with services.uow.begin() as session:
        rows = session.execute(
            select(
                o.entity_key,
                o.dataset,
                o.partition,
                o.start_url,
                o.payload,
                o.payload_hash,
                o.source_job_id,
                o.source_attempt_id,
                o.first_seen_at,
                o.last_changed_at,
            ).where(o.run_id == run_id)
        ).all()
    return {r[0]: tuple(r[1:]) for r in rows}


def product(sku: str, price: str, **more: Any) -> dict[str, Any]:
    """A record of the products dataset."""
    return {"sku": sku, "price": price, "retailer": "r.example", **more}


def test_a_runs_first_sync_goes_straight_in_and_stores_what_staging_stores(
    services: Services,
) -> None:
    """A run's first sync is copied straight into observations, and stores and counts exactly
    what staging and merging the same records does."""
    records = [
        product(f"S{i}", f"{i}.50", title=f"T{i}", **{"web-scraper-start-url": "https://x.test/"})
        for i in range(300)
    ]
    straight, counts = _sync(services, "a1", records, run_id="straight", straight=True)
    staged, staged_counts = _sync(
        services, "a1", records, run_id="staged", straight=False, window="2026-12-04", early=False
    )
    assert straight.copied == 300  # every record went straight in
    assert staged.copied is None
    assert counts == staged_counts == UpsertCounts(300, 300, 0, 0, 0, 0)
    assert _stored(services, "straight") == _stored(services, "staged")


def test_a_key_twice_in_a_first_sync_undoes_the_straight_copy_and_the_last_record_wins(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """The copy straight in cannot take a key seen twice: it is undone (and the log says why),
    every record is staged from the local spool instead, and the merge counts the duplicate and
    lets the last win."""
    records = [product(f"S{i}", "1") for i in range(50)]
    records += [product("S7", "2"), product("S9", "1")]  # S7 changed, S9 repeated as it was
    with caplog.at_level("INFO", logger="scrapesync.staging"):
        stager, counts = _sync(services, "a1", records, run_id="r", straight=True)
    assert stager.copied is None
    (undone,) = [r for r in caplog.records if r.getMessage() == "staging.copy_undone"]
    assert (undone.run_id, undone.refused) == ("r", "UniqueViolation")  # type: ignore[attr-defined]
    assert counts == UpsertCounts(
        staged=52, inserted=50, updated=0, unchanged=0, duplicate_keys=2, conflicting_duplicates=1
    )
    stored = _stored(services, "r")
    assert len(stored) == 50
    assert stored["S7"][3]["price"] == "2"
    assert {row[6] for row in stored.values()} == {"a1"}


def test_keys_first_staging_writes_and_counts_what_whole_rows_do(services: Services) -> None:
    """Into a run that holds observations, only keys and hashes are staged and the payloads of
    new and changed records sent after: new rows inserted, changed ones updated, unchanged
    ones untouched, and the last record of a key wins."""

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


def test_a_key_found_outside_the_runs_rows_is_still_merged_and_counted_exactly(
    services: Services,
) -> None:
    """The merge looks for stored keys among the run's own rows (a key names its window, so
    that is where it lives). A key stored under another run all the same is not taken for new:
    the insert meets it, and the upsert writes and counts it as the unchanged or changed row
    it is."""
    _merge(services, "a0", [product("A", "1"), product("B", "1")], run_id="elsewhere")
    _merge(services, "a1", [product("C", "1")], run_id="r")
    records = [product("A", "1"), product("B", "2"), product("C", "1"), product("D", "5")]
    keys_first, counts = _merge(services, "a2", records, run_id="r")
    assert keys_first
    assert counts == UpsertCounts(
        staged=4, inserted=1, updated=1, unchanged=2, duplicate_keys=0, conflicting_duplicates=0
    )
    o = Observation.__table__.c
    with services.uow.begin() as session:
        rows = session.execute(select(o.entity_key, o.run_id, o.payload, o.source_attempt_id))
        stored = {key: (run, payload["price"], attempt) for key, run, payload, attempt in rows}
    assert stored == {
        "A": ("elsewhere", "1", "a0"),
        "B": ("elsewhere", "2", "a2"),
        "C": ("r", "1", "a1"),
        "D": ("r", "5", "a2"),
    }


def test_records_merged_while_staged_store_and_count_what_a_merge_after_staging_does(
    services: Services,
) -> None:
    """Into a run that holds observations, the parsed records are merged a few at a time while
    they are staged: new rows inserted, changed ones updated, unchanged ones left as they were
    (their attempt and times), with the counts and rows that merging after staging gives."""
    first = [product(f"S{i}", "1") for i in range(6)]
    later = [
        product("S0", "1"),
        product("S1", "2"),
        product("S7", "3"),
        product("S2", "1"),
        product("S3", "9"),
        product("S8", "4"),
        product("S5", "1"),
    ]
    for run_id, window, early in (("early", "2026-12-03", True), ("after", "2026-12-04", False)):
        _sync(services, "a1", first, run_id=run_id, straight=False, window=window, early=early)
        stager, counts = _sync(
            services, "a2", later, run_id=run_id, straight=False, window=window, early=early
        )
        assert stager.keys_first
        assert stager.merged_early is early
        assert counts == UpsertCounts(
            staged=7, inserted=2, updated=2, unchanged=3, duplicate_keys=0, conflicting_duplicates=0
        )
    early_rows, after_rows = _stored(services, "early"), _stored(services, "after")
    assert early_rows == after_rows
    assert {key: row[6] for key, row in early_rows.items()} == {
        "S0": "a1",
        "S1": "a2",
        "S2": "a1",
        "S3": "a2",
        "S4": "a1",
        "S5": "a1",
        "S7": "a2",
        "S8": "a2",
    }


# every character COPY's text format reads specially, beside text it does not (no NUL: no text
# holds one, and a record carrying one is set aside before it is staged)
_awkward = st.lists(
    st.one_of(
        st.sampled_from(["\\", "\t", "\n", "\r", "\\N", "\\.", "'", '"', "\u2028", "é", "★"]),
        st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
    ),
    max_size=8,
).map("".join)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    values=st.lists(
        st.tuples(_awkward, st.none() | _awkward, st.none() | _awkward, _awkward),
        min_size=1,
        max_size=5,
        unique_by=lambda v: v[0],
    ),
    shape=st.none() | _awkward,
    digest=st.none() | st.binary(min_size=16, max_size=16),
)
def test_what_a_first_sync_copies_straight_in_reads_back_exactly(
    services: Services,
    values: list[tuple[str, str | None, str | None, str]],
    shape: str | None,
    digest: bytes | None,
) -> None:
    """Every value a run's first sync copies straight in is stored exactly as it came: keys,
    partitions, start URLs, payloads, shapes and marks holding what the copy's text format
    escapes (backslashes, tabs, line breaks), and the line's digest; its spool gives back
    every record as it came, for staging should the copy fail."""
    run_id = f"r-{uuid.uuid4().hex}"
    source = Source("products", run_id, "2026-12-03", 7, "a1", NOW)
    rows, spooled = {}, []
    with services.uow.begin() as session:
        copy = DirectCopy(session.connection(), source)
        for key, partition, start_url, title in values:
            payload = orjson.dumps({"sku": key, "title": title}, option=orjson.OPT_SORT_KEYS)
            staged = (
                hashlib.sha256(f"{run_id}\x1f{key}".encode()).hexdigest(),
                key,
                partition,
                start_url,
                payload.decode(),
                hashlib.sha256(payload).hexdigest(),
            )
            copy.add(staged, digest, shape, shape)
            rows[key] = (partition, start_url, {"sku": key, "title": title}, staged[5])
            spooled.append((staged, digest))
        assert copy.finish()
        assert list(copy.spooled()) == spooled  # what staging would read, should the copy fail
        copy.spool.close()
        o = Observation.__table__.c
        stored = session.execute(
            select(
                o.entity_key,
                o.partition,
                o.start_url,
                o.payload,
                o.payload_hash,
                o.line_digest,
                o.shape,
                o.plain_for,
                o.source_job_id,
                o.source_attempt_id,
                o.first_seen_at,
            ).where(o.run_id == run_id)
        ).all()
        session.rollback()
    assert {r[0]: tuple(r[1:5]) for r in stored} == rows
    assert {(r[5], r[6], r[7]) for r in stored} == {(digest, shape, shape)}
    assert {r[8:] for r in stored} == {(7, "a1", NOW)}
