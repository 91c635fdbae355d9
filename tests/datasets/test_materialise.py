"""Publication's effect on the typed tables, driven without Cloud: observations written as a
sync leaves them, then published, published again, withdrawn."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from config.columns import Column
from config.datasets import Dataset
from sync.bootstrap import Services
from sync.casts import PlainValues, cast_record
from sync.datasets import first_publication, materialise, schema
from sync.datasets.columns import columns_of
from sync.datasets.rows import target_name
from sync.identity import observation_key
from sync.ingest import run_rows
from sync.models import Observation, PartitionVerdict, Publication, Run
from sync.runs import publication
from sync.runs.shapes import PENDING
from sync.states import PartitionState, RunState
from tests.datasets.flow import (
    assert_rows_are_open_stretches,
    change_rows,
    current_rows,
    history_rows,
    tables,
)

Records = Mapping[str, Mapping[str, str]]  # entity key -> payload
DAY = datetime(2026, 11, 1, tzinfo=UTC)


def products(services: Services, **changes: object) -> Dataset:
    """The typed products dataset, in daily windows."""
    return replace(services.datasets.get("products"), window="daily", **changes)  # type: ignore[arg-type]


@pytest.fixture(params=["through Python", "set-based"])
def dataset(request: pytest.FixtureRequest, services: Services) -> Dataset:
    """The typed products dataset, published both ways: with its watch list through Python, and
    without one by set-based statements where the database is PostgreSQL
    (:mod:`sync.datasets.changed_publication`)."""
    found = products(services)
    return found if request.param == "through Python" else replace(found, watch=())


def records(n: int, *, price: str = "10.00", start: int = 0) -> dict[str, dict[str, str]]:
    """``n`` products of one retailer at one price."""
    return {
        f"S{i:05d}": {"sku": f"S{i:05d}", "title": f"T{i}", "price": price, "retailer": "r1"}
        for i in range(start, start + n)
    }


def _judged(session: Session, run: Run) -> None:
    """Judge the run's rows (written under attempt ``a``) as a verdict does."""
    session.flush()
    run_rows.record_import(session, run.run_id, "a", run.data_version)
    run.judged_version = run.data_version
    session.flush()


def publish(
    services: Services,
    dataset: Dataset,
    day: int,
    found: Records,
    *,
    partitions: Mapping[str, Records] | None = None,
    quarantined: frozenset[str] = frozenset(),
    pending: bool = False,
    marked: bool = False,
) -> str:
    """Write one daily window's observations (``found`` in partition ``r1``, plus any others)
    and publish the run as an accepted verdict does, the ``quarantined`` partitions failed;
    its run id. ``pending``: when the dataset's published run is this one, published as the
    verdict on a "Continue" does, from the ids of the rows written since (here, all of them).
    ``marked``: each row whose values are all plain is marked so, as a copy straight in marks
    it (the others, as a merge writes them, are not)."""
    window = (DAY + timedelta(days=day)).strftime("%Y-%m-%d")
    run_id = dataset.run_id_for(window)
    now = DAY + timedelta(days=day, hours=6)
    groups = {"r1": found, **(partitions or {})}
    schema.ensure_tables(services.uow, dataset, services.settings.data_schema)
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        if run is None:
            run = Run(run_id=run_id, dataset=dataset.name, collection_window=window, created_at=now)
            session.add(run)
            session.flush()
        marks = PlainValues.of(columns_of(session, dataset.name, dataset.columns))
        rows = [
            {
                "observation_key": observation_key(dataset.name, window, key),
                "dataset": dataset.name,
                "entity_key": key,
                "run_id": run_id,
                "collection_window": window,
                "partition": partition,
                "payload": payload,
                "payload_hash": hashlib.sha256(
                    json.dumps(payload, sort_keys=True).encode()
                ).hexdigest(),
                "source_job_id": day,
                "source_attempt_id": "a",
                "plain_for": marks.fingerprint
                if marked and marks is not None and marks.holds(payload)
                else None,
            }
            for partition, group in groups.items()
            for key, payload in group.items()
        ]
        session.execute(Observation.__table__.delete().where(Observation.run_id == run_id))
        insert_observations(session, rows, now)
        session.execute(
            PartitionVerdict.__table__.delete().where(PartitionVerdict.run_id == run_id)
        )
        for partition in groups:
            state = (
                PartitionState.QUARANTINED if partition in quarantined else PartitionState.PASSED
            )
            session.add(PartitionVerdict(run_id=run_id, partition=partition, state=state))
        _judged(session, run)
        run.revision += 1
        run.state = RunState.ACCEPTED
        previous = publication.current_publication(session, dataset.name)
        again = pending and previous is not None and previous.run_id == run_id
        if again:
            session.execute(text(f"CREATE TEMP TABLE {PENDING} (id bigint) ON COMMIT DROP"))
            session.execute(
                text(f"INSERT INTO {PENDING} SELECT id FROM observations WHERE run_id = :run"),  # noqa: S608 - a constant name
                {"run": run_id},
            )
        publication.publish(
            session,
            dataset,
            run,
            records=len(rows),
            previous=previous,
            now=now,
            schema=services.settings.data_schema,
            pending_ids=PENDING if again else None,
        )
        session.commit()
    return run_id


def insert_observations(session: Session, rows: list[dict[str, Any]], now: datetime) -> None:
    """Write ``rows`` as observations: by COPY on PostgreSQL (as the import writes them, and a
    tenth of the time of an executemany for the thirty windows of ten thousand below), by an
    executemany elsewhere."""
    if not rows:
        return
    if session.get_bind().dialect.name != "postgresql":
        session.execute(Observation.__table__.insert(), rows)
        return
    columns = [*rows[0], "first_seen_at", "last_changed_at"]
    cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
    with cursor.copy(f"COPY observations ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            values = [json.dumps(v) if k == "payload" else v for k, v in row.items()]
            copy.write_row([*values, now, now])


def withdraw(services: Services, dataset: Dataset, run_id: str) -> None:
    """The published run is rejected on a later evaluation."""
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        run.revision += 1
        run.state = RunState.REJECTED
        publication.withdraw(
            session, dataset, run, run.updated_at, schema=services.settings.data_schema
        )
        session.commit()


def stretches(services: Services, key: str) -> list[tuple[object, datetime, datetime | None]]:
    """One entity's history: (price, valid_from, valid_to)."""
    return [
        (h["price"], h["valid_from"], h["valid_to"])
        for h in history_rows(services)
        if h["entity_key"] == key
    ]


def test_valid_from_and_valid_to_are_window_starts_and_an_entity_that_returns_opens_a_stretch(
    services: Services,
    dataset: Dataset,
) -> None:
    """Gone on day 1, back on day 2: two stretches, from midnight UTC of their windows."""
    publish(services, dataset, 0, records(3))
    publish(services, dataset, 1, records(2))
    publish(services, dataset, 2, records(3))
    assert stretches(services, "S00002") == [
        (Decimal("10.00"), DAY, DAY + timedelta(days=1)),
        (Decimal("10.00"), DAY + timedelta(days=2), None),
    ]
    row = current_rows(services)["S00002"]
    assert (row["first_seen_at"], row["last_changed_at"]) == (DAY, DAY + timedelta(days=2))
    assert current_rows(services)["S00000"]["last_changed_at"] == DAY
    assert_rows_are_open_stretches(services)


def test_a_run_published_again_corrects_its_own_stretches_in_place(
    services: Services, dataset: Dataset
) -> None:
    """A second revision of one window rewrites what the first opened: no stretch of zero
    length, and a value set back to the earlier one reopens the earlier stretch."""
    publish(services, dataset, 0, records(3))
    changed = records(3)
    changed["S00000"] = {**changed["S00000"], "price": "12.00"}
    changed["S00001"] = {**changed["S00001"], "price": "13.00"}
    publish(services, dataset, 1, changed)
    again = records(3)
    again["S00000"] = {**again["S00000"], "price": "14.00"}  # corrected
    del again["S00002"]  # gone after all
    publish(services, dataset, 1, again)  # S00001 back at 10.00
    day1 = DAY + timedelta(days=1)
    assert stretches(services, "S00000") == [
        (Decimal("10.00"), DAY, day1),
        (Decimal("14.00"), day1, None),
    ]
    assert stretches(services, "S00001") == [(Decimal("10.00"), DAY, None)]
    assert stretches(services, "S00002") == [(Decimal("10.00"), DAY, day1)]
    assert all(
        h["valid_to"] is None or h["valid_to"] > h["valid_from"] for h in history_rows(services)
    )
    second = [c for c in change_rows(services) if c["revision"] == 2]
    assert sorted((c["entity_key"], c["kind"]) for c in second) == [
        ("S00000", "changed"),
        ("S00001", "changed"),
        ("S00002", "removed"),
    ]
    assert_rows_are_open_stretches(services)


def ledger(services: Services) -> dict[str, list[tuple[object, ...]]]:
    """The history as users read it: entity key -> its stretches (price, opening run, from,
    to, closing run), oldest first."""
    found: dict[str, list[tuple[object, ...]]] = {}
    for h in history_rows(services):
        found.setdefault(h["entity_key"], []).append(
            (h["price"], h["run_id"], h["valid_from"], h["valid_to"], h["closed_by_run_id"])
        )
    return found


def closed_count(services: Services) -> int:
    """How many rows the closed stretches' table holds."""
    with services.uow.begin() as session:
        closed = tables(services).closed
        return int(session.execute(select(func.count()).select_from(closed)).scalar_one())


def test_history_reads_the_same_through_a_republish_a_quarantine_and_a_withdrawal(
    services: Services,
    dataset: Dataset,
) -> None:
    """Each stretch, with the runs that opened and closed it, is what the history says after
    every step; a first publication writes no stretch of its own (the rows are the open ones)
    and only closed stretches are ever written to ``X_closed``."""
    d0, d1, d2 = (DAY + timedelta(days=n) for n in range(3))
    r2 = {"S00005": {"sku": "S00005", "title": "T5", "price": "10.00", "retailer": "r2"}}
    run0 = publish(services, dataset, 0, records(3), partitions={"r2": r2})
    assert closed_count(services) == 0
    ten = Decimal("10.00")
    first = {k: [(ten, run0, d0, None, None)] for k in ("S00000", "S00001", "S00002", "S00005")}
    assert ledger(services) == first

    day1 = records(3)
    day1["S00000"] = {**day1["S00000"], "price": "11.00"}
    del day1["S00001"]
    run1 = publish(services, dataset, 1, day1, partitions={"r2": r2})
    assert ledger(services) == {
        **first,
        "S00000": [(ten, run0, d0, d1, run1), (Decimal("11.00"), run1, d1, None, None)],
        "S00001": [(ten, run0, d0, d1, run1)],
    }

    again = records(3)  # day 1 published again: S00001 back, S00000 corrected
    again["S00000"] = {**again["S00000"], "price": "12.00"}
    publish(services, dataset, 1, again, partitions={"r2": r2})
    republished = {
        **first,
        "S00000": [(ten, run0, d0, d1, run1), (Decimal("12.00"), run1, d1, None, None)],
    }
    assert ledger(services) == republished

    day2 = dict(again)
    day2["S00002"] = {**day2["S00002"], "price": "13.00"}
    quarantined = {"S00005": {**r2["S00005"], "price": "99.00"}}
    run2 = publish(
        services, dataset, 2, day2, partitions={"r2": quarantined}, quarantined=frozenset({"r2"})
    )
    assert ledger(services) == {
        **republished,
        "S00002": [(ten, run0, d0, d2, run2), (Decimal("13.00"), run2, d2, None, None)],
    }
    assert current_rows(services)["S00005"]["run_id"] == run1  # its last accepted row

    withdraw(services, dataset, run2)
    assert ledger(services) == republished
    closed = [h for h in history_rows(services) if h["valid_to"] is not None]
    assert closed_count(services) == len(closed) == 1
    rows = current_rows(services)
    assert {k: (r["changed_by_run_id"], r["last_changed_at"]) for k, r in rows.items()} == {
        "S00000": (run1, d1),
        "S00001": (run0, d0),
        "S00002": (run0, d0),
        "S00005": (run0, d0),
    }
    assert_rows_are_open_stretches(services)


def test_a_withdrawn_run_is_undone_in_history_and_the_table_falls_back(
    services: Services,
    dataset: Dataset,
) -> None:
    """Day 1 is rejected after its publication: the table is day 0's again, day 1's stretches
    are gone and those it closed are open again; the fallback's changes are reported."""
    publish(services, dataset, 0, records(3))
    after_day0 = history_rows(services)
    changed = records(2, price="11.00")
    changed.update(records(1, start=9))
    day1 = publish(services, dataset, 1, changed)
    withdraw(services, dataset, day1)
    assert current_rows(services).keys() == records(3).keys()
    assert {r["price"] for r in current_rows(services).values()} == {Decimal("10.00")}
    assert history_rows(services) == after_day0
    fallback = [c for c in change_rows(services) if c["run_id"] != day1]
    assert sorted((c["entity_key"], c["kind"]) for c in fallback) == [
        ("S00000", "changed"),
        ("S00001", "changed"),
        ("S00002", "added"),
        ("S00009", "removed"),
    ]
    with services.uow.begin() as session:
        current = publication.current_publication(session, "products")
        assert current is not None
        assert current.changes == {
            "added": 1,
            "removed": 1,
            "changed": 2,
            "baseline": False,
            "previous_run_id": day1,
        }
    assert_rows_are_open_stretches(services)


def test_a_withdrawn_run_with_nothing_to_fall_back_on_empties_the_table(
    services: Services,
    dataset: Dataset,
) -> None:
    """The only published run is rejected: no rows, and its stretches undone like any
    withdrawn run's (a rejected run's values never stay in datasets.*); all reported removed."""
    day0 = publish(services, dataset, 0, records(3))
    withdraw(services, dataset, day0)
    assert current_rows(services) == {}
    assert history_rows(services) == []
    assert sorted(c["kind"] for c in change_rows(services)) == ["removed"] * 3
    assert_rows_are_open_stretches(services)


def test_a_quarantined_partition_keeps_its_rows_and_a_passing_one_moves_on(
    services: Services,
    dataset: Dataset,
) -> None:
    """Entities of a partition the run quarantined stay as the last accepted run left them,
    with its run id, and are not reported removed; those of a passing partition move on."""
    day0 = publish(services, dataset, 0, records(2), partitions={"r2": records(2, start=5)})
    day1 = publish(
        services,
        dataset,
        1,
        records(1),
        partitions={"r2": records(1, start=5, price="99.00")},
        quarantined=frozenset({"r2"}),
    )
    rows = current_rows(services)
    assert {k: (r["run_id"], r["price"]) for k, r in rows.items()} == {
        "S00000": (day1, Decimal("10.00")),
        "S00005": (day0, Decimal("10.00")),
        "S00006": (day0, Decimal("10.00")),
    }
    assert [(c["entity_key"], c["kind"]) for c in change_rows(services)] == [("S00001", "removed")]
    assert_rows_are_open_stretches(services)


@pytest.mark.slow
def test_many_entities_are_published_in_bulk_and_an_unchanged_repeat_writes_no_change(
    services: Services,
) -> None:
    """Above COPY's threshold the same rows arrive; a next window of the same values moves the
    rows to its run and changes nothing else."""
    dataset = products(services)
    publish(services, dataset, 0, records(1200))
    day1 = publish(services, dataset, 1, records(1200))
    rows = current_rows(services)
    assert len(rows) == 1200
    assert {r["run_id"] for r in rows.values()} == {day1}
    assert len(history_rows(services)) == 1200
    assert change_rows(services) == []
    with services.uow.begin() as session:
        counts = (
            session.execute(select(Publication.changes).order_by(Publication.id)).scalars().all()
        )
    assert [c["baseline"] for c in counts] == [True, False]  # type: ignore[index]
    assert counts[0]["added"] == 1200  # type: ignore[index]
    assert counts[1] == {
        "added": 0,
        "removed": 0,
        "changed": 0,
        "baseline": False,
        "previous_run_id": dataset.run_id_for("2026-11-01"),
    }


@pytest.mark.slow
def test_thirty_windows_of_ten_thousand_with_one_percent_changed_grow_history_by_the_changes(
    services: Services,
) -> None:
    """History grows with changes, not with windows: 10,000 + 30 x 100 stretches."""
    dataset = products(services)
    found = records(10_000)
    publish(services, dataset, 0, found)
    for day in range(1, 31):
        for i in range(100):
            key = f"S{(day * 100 + i) % 10_000:05d}"
            found[key] = {**found[key], "price": f"{10 + day}.00"}
        publish(services, dataset, day, found)
    h = tables(services).history
    with services.uow.begin() as session:
        total = session.execute(select(func.count()).select_from(h)).scalar_one()
    assert total == 10_000 + 30 * 100
    assert_rows_are_open_stretches(services)


@pytest.mark.parametrize("marked", [False, True], ids=["checked", "marked"])
def test_a_first_publication_reads_every_value_as_the_casts_do(
    services: Services, monkeypatch: pytest.MonkeyPatch, marked: bool
) -> None:
    """A first publication on PostgreSQL has the database cast the rows whose values are all
    plain and Python the rest: whichever path a row takes, it holds exactly what
    ``sync.casts`` gives for its payload, with the same failures, and every row is counted.
    So too when the import marked the rows it found plain (which the database then casts
    without a check): a text that is not blank but that the database's own check leaves to
    Python, a blank one and a number in a text column are among them."""
    columns = (
        Column("sku", "sku"),
        Column("title", "title"),
        Column("price", "price", "numeric"),
        Column("stock", "stock", "integer"),
        Column("in_stock", "in_stock", "boolean"),
        Column("seen", "seen", "timestamp"),
        Column("tags", "tags", "json"),
    )
    dataset = products(services, columns=columns)
    odd: list[dict[str, Any]] = [
        {"title": "Café", "price": "12.50", "stock": "7", "in_stock": True},
        {"title": "  padded  ", "price": "-0.5", "stock": 12, "in_stock": False},
        {"title": "", "price": "", "stock": "", "in_stock": None},
        {"title": "\u00a0", "price": "$1,299.00", "stock": "1,200", "in_stock": "yes"},
        {"title": "\t", "price": "n/a", "stock": "3.5", "in_stock": "maybe"},
        {"title": 12, "price": 12.5, "stock": 3.0, "seen": "2026-12-03"},
        {"title": "…", "price": 7, "stock": "9" * 19, "tags": ["a"]},
        {"title": ["x"], "price": "007.10", "stock": "-0042", "tags": {}},
        {"title": "ok", "price": "1e3", "stock": True, "tags": "x"},
        {"title": "-", "price": "1", "stock": "2"},
        {"title": "~\u00a0", "price": "1.0"},
        {"title": " \u3000 "},
        {"title": "  \u2605", "price": "-12", "stock": -(10**17), "in_stock": None},
        {"title": "\u2605", "price": 10**17, "stock": "1" * 18, "seen": ""},
        {"title": " ", "price": "1.5", "stock": "2"},
        {},
    ]
    if services.uow.engine.dialect.name == "postgresql":  # the bounds of the database's path
        odd += [  # (SQLite keeps a numeric to 15 digits, whichever way it is written)
            {"title": "widest", "price": "1" * 30 + "." + "5" * 30, "stock": "-" + "9" * 18},
            {"title": "too wide", "price": "-" + "9" * 31, "stock": 10**18},
            {"title": "wide fraction", "price": "0." + "5" * 31, "stock": "9" * 18},
        ]
    found = {
        f"S{i:03d}": {"sku": f"S{i:03d}", "retailer": "r1", **extra} for i, extra in enumerate(odd)
    }
    copied: list[int] = []
    real = first_publication.copy_plain_rows

    def spy(*args: Any, **kwargs: Any) -> int:
        copied.append(real(*args, **kwargs))
        return copied[-1]

    monkeypatch.setattr(first_publication, "copy_plain_rows", spy)
    publish(services, dataset, 0, cast(Any, found), marked=marked)
    if services.uow.engine.dialect.name == "postgresql":  # both paths were taken
        assert 0 < copied[0] < len(found)
    else:
        assert copied == []
    with services.uow.begin() as session:
        marks = session.execute(select(Observation.entity_key, Observation.plain_for)).all()
    plain = {key for key, mark in marks if mark is not None}
    if marked:  # a row of each kind, marked or not (so both casts were read)
        assert {"S000", "S001", "S012", "S013"} <= plain
        assert not plain & {"S003", "S005", "S011", "S014"}
    else:
        assert plain == set()
    rows = current_rows(services)
    assert set(rows) == set(found)
    names = [c.name for c in columns]
    for key, payload in found.items():
        expected, failures = cast_record(columns, payload)
        assert {n: rows[key][n] for n in names} == expected, key
        assert rows[key]["cast_failures"] == ([f.as_dict() for f in failures] or None), key
    assert_rows_are_open_stretches(services)
    with services.uow.begin() as session:
        counts = session.execute(select(Publication.changes)).scalar_one()
    assert counts["baseline"] is True
    assert counts["added"] == len(found)


def _target(services: Services) -> str:
    """The dataset's table, as SQL names it."""
    with services.uow.begin() as session:
        return target_name(session, tables(services).current)


def _key_of(services: Services) -> tuple[str, str] | None:
    """The dataset table's primary key: its name and definition."""
    target = _target(services)
    with services.uow.begin() as session:
        found = session.execute(
            text(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = CAST(:t AS regclass) AND contype = 'p'"
            ),
            {"t": target},
        ).one_or_none()
    return None if found is None else (found[0], found[1])


def _statements(services: Services) -> tuple[list[str], Any]:
    """Every statement the services' engine sends, and the listener to remove."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(" ".join(statement.split()))

    event.listen(services.uow.engine, "before_cursor_execute", record)
    return sent, record


@pytest.mark.postgres
def test_a_first_publication_builds_the_tables_key_after_its_rows_and_keeps_it(
    services: Services,
) -> None:
    """A first publication writes its rows with the table's primary key set aside and builds
    the key from them after: the table ends with the same key, enforced, and every row; the
    transaction's other statements wait for locks as long as they did before."""
    dataset = products(services)
    schema.ensure_tables(services.uow, dataset, services.settings.data_schema)
    key = _key_of(services)
    assert key is not None
    assert key[1] == "PRIMARY KEY (entity_key)"
    timeouts: list[str] = []
    real = first_publication.copy_plain_rows

    def copying(session: Session, *args: Any, **kwargs: Any) -> int:
        session.execute(text("SET LOCAL lock_timeout = '7s'"))  # as a column being added sets it
        copied = real(session, *args, **kwargs)
        timeouts.append(session.execute(text("SHOW lock_timeout")).scalar_one())
        return copied

    sent, record = _statements(services)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(first_publication, "copy_plain_rows", copying)
        try:
            publish(services, dataset, 0, records(300))
        finally:
            event.remove(services.uow.engine, "before_cursor_execute", record)

    assert any(f"DROP CONSTRAINT {key[0]}" in s for s in sent)  # set aside while rows went in
    assert timeouts == ["7s"]
    assert _key_of(services) == key
    assert len(current_rows(services)) == 300
    target = tables(services).current
    row = dict(current_rows(services)["S00001"])
    with pytest.raises(IntegrityError), services.uow.begin() as session:  # the key is enforced
        session.execute(target.insert().values(**row))
    assert_rows_are_open_stretches(services)


@pytest.mark.postgres
def test_a_reader_holding_a_new_table_leaves_its_key_in_place_and_its_rows_go_in(
    services: Services,
) -> None:
    """A reader that holds the dataset's (empty) table does not stop its first publication: the
    key stays where it is, the rows are written beside it, and the reader still reads."""
    dataset = products(services)
    schema.ensure_tables(services.uow, dataset, services.settings.data_schema)
    key = _key_of(services)
    assert key is not None
    target = _target(services)
    with services.uow.engine.connect() as reader:
        assert reader.execute(text(f"SELECT count(*) FROM {target}")).scalar_one() == 0  # noqa: S608
        sent, record = _statements(services)
        try:
            publish(services, dataset, 0, records(300))
        finally:
            event.remove(services.uow.engine, "before_cursor_execute", record)
        # the publication did not wait for the reader, who reads its rows once it commits
        assert reader.execute(text(f"SELECT count(*) FROM {target}")).scalar_one() == 300  # noqa: S608
        reader.rollback()

    assert any(f"DROP CONSTRAINT {key[0]}" in s for s in sent)  # it asked
    assert not any("ADD CONSTRAINT" in s for s in sent)  # and left the key where it was
    assert _key_of(services) == key
    assert len(current_rows(services)) == 300
    assert_rows_are_open_stretches(services)


@pytest.mark.postgres
def test_a_users_foreign_key_to_a_new_table_keeps_its_key_and_the_rows_go_in(
    services: Services,
) -> None:
    """A table of the user's whose foreign key refers to the dataset's (empty) table keeps the
    dataset's key from being set aside: the first publication writes its rows beside it."""
    dataset = products(services)
    schema.ensure_tables(services.uow, dataset, services.settings.data_schema)
    key = _key_of(services)
    target = _target(services)
    with services.uow.begin() as session:
        session.execute(
            text(f"CREATE TABLE user_notes (sku text REFERENCES {target} (entity_key))")
        )
        session.commit()
    try:
        publish(services, dataset, 0, records(300))
        assert _key_of(services) == key
        assert len(current_rows(services)) == 300
        with services.uow.begin() as session:  # the user's key still holds
            session.execute(text("INSERT INTO user_notes VALUES ('S00001')"))
            session.commit()
        with pytest.raises(IntegrityError), services.uow.begin() as session:
            session.execute(text("INSERT INTO user_notes VALUES ('nowhere')"))
    finally:
        with services.uow.begin() as session:
            session.execute(text("DROP TABLE user_notes"))
            session.commit()


@pytest.mark.postgres
def test_a_run_planned_from_statistics_that_predate_it_is_still_compared_by_a_hash_join(
    services: Services,
) -> None:
    """Right after a sync the planner's statistics know nothing of the run being published (they
    were taken while every observation was pending), so a run of thousands looks like one row;
    the search for entities the run no longer has must still join the whole run once, by hash,
    never scan it once per row of the table."""
    dataset = products(services)
    publish(services, dataset, 0, records(N_STALE))
    window = (DAY + timedelta(days=1)).strftime("%Y-%m-%d")
    run_id = dataset.run_id_for(window)

    def observations(start: int) -> list[dict[str, Any]]:
        return [
            {
                "observation_key": observation_key(dataset.name, window, key),
                "dataset": dataset.name,
                "entity_key": key,
                "run_id": run_id,
                "collection_window": window,
                "partition": "r1",
                "payload": payload,
                "payload_hash": "h",
                "source_job_id": 1,
                "source_attempt_id": "a",
            }
            for key, payload in records(N_STALE, start=start).items()
        ]

    o = Observation.__table__
    with services.uow.begin() as session:  # one transaction: no autovacuum sees any of it
        run = Run(run_id=run_id, dataset=dataset.name, collection_window=window)
        session.add(run)
        session.execute(text("ANALYZE observations"))  # as before a sync: nothing of the run
        session.execute(o.insert(), observations(start=10))
        session.add(PartitionVerdict(run_id=run_id, partition="r1", state=PartitionState.PASSED))
        _judged(session, run)
        t = schema.tables_in(session, dataset.name, services.settings.data_schema)
        query = materialise.missing_query(session, t, run_id)

        def plan(statement: Any) -> str:
            sql = statement.compile(session.get_bind(), compile_kwargs={"literal_binds": True})
            return "\n".join(session.execute(text(f"EXPLAIN {sql}")).scalars())

        def nestloop() -> str:
            return str(session.execute(text("SHOW enable_nestloop")).scalar_one())

        run_rows = plan(select(o.c.entity_key).where(o.c.run_id == run_id))
        assert " rows=1 " in run_rows.splitlines()[0], run_rows  # the run looks like one row
        with materialise.whole_set_joins(session):
            assert nestloop() == "off"
            guarded = plan(query)
        assert "Nested Loop" not in guarded, guarded
        assert "Hash Anti Join" in guarded or "Merge Anti Join" in guarded, guarded
        assert nestloop() == "on"  # the guard ends with its statement
        gone = set(session.execute(query).scalars())
    assert gone == {f"S{i:05d}" for i in range(10)}


N_STALE = 2_000
