"""The typed tables through the worker: a publication brings ``datasets.products`` to the run,
keeps its history and announces what changed, in the transaction that moves the pointer."""

from __future__ import annotations

from decimal import Decimal

import pytest
from flask import Flask
from sqlalchemy import Engine, inspect, select, text

from simulator import CloudState
from sync.bootstrap import Services
from sync.models import Publication, Run
from sync.runs import evidence
from tests.acceptance.flow import (
    finished_job,
    product_records,
    run_id_of,
    settle,
    use_datasets,
    verdict,
)
from tests.datasets.flow import (
    assert_rows_are_open_stretches,
    change_rows,
    current_rows,
    history_rows,
    tables,
    typed_datasets,
)
from tests.fakes import Receiver
from tests.harness import notify

GONE = ("SKU-000000", "SKU-000001")
NEW = ("SKU-002000", "SKU-002001", "SKU-002002")
ABOVE = ("SKU-000010", "SKU-000011", "SKU-000012")  # price up 10%: reported
BELOW = ("SKU-000020", "SKU-000021")  # price up by a cent, under 1%: kept quiet
RETITLED = "SKU-000030"


def collect(
    web: Flask, services: Services, cloud: CloudState, records: list[dict[str, str]]
) -> str:
    """A finished job with these records, notified, synced, evaluated, delivered; its run."""
    job_id = finished_job(cloud, records)
    notify(web, job_id)
    settle(services)
    return run_id_of(job_id)


def run_b(records: list[dict[str, str]]) -> list[dict[str, str]]:
    """Run A's records with 2 gone, 3 new, 5 prices changed (3 by 10%, 2 by a cent) and one
    new title."""
    changed = []
    for record in records:
        if record["sku"] in GONE:
            continue
        record = dict(record)
        price = Decimal(record["price"])
        if record["sku"] in ABOVE:
            record["price"] = str((price * Decimal("1.10")).quantize(Decimal("0.01")))
        elif record["sku"] in BELOW:
            record["price"] = str(price + Decimal("0.01"))
        elif record["sku"] == RETITLED:
            record["title"] = "Renamed " + record["title"]
        changed.append(record)
    return changed + product_records(3, start=2000)


def prices_above_two(records: list[dict[str, str]]) -> bool:
    """Every price the test moves by a cent is over 2, so a cent stays under 1%."""
    return all(Decimal(r["price"]) > 2 for r in records if r["sku"] in BELOW)


@pytest.fixture
def typed(services: Services) -> Services:
    """The services on the products dataset with typed columns and a watch list."""
    return use_datasets(services, typed_datasets())


@pytest.mark.slow
def test_run_b_after_run_a_gives_the_table_its_history_and_one_signed_change_event(
    web: Flask, typed: Services, cloud: CloudState, receiver: Receiver, engine: Engine
) -> None:
    """2,000 entities, then 2 gone, 3 new, 3 prices over the tolerance, 2 under, 1 title: the
    table holds 2,001 rows with a numeric price, the history both prices of every changed
    entity, the change feed 3 added, 2 removed, 4 changed, and one signed event says so."""
    a_records = product_records(2000)
    assert prices_above_two(a_records)
    a = collect(web, typed, cloud, a_records)
    assert verdict(typed, a).state == "published"
    assert len(current_rows(typed)) == 2000
    assert change_rows(typed) == []  # the first publication is a baseline
    b_records = run_b(a_records)
    b = collect(web, typed, cloud, b_records)
    assert verdict(typed, b).state == "published"

    rows = current_rows(typed)
    assert len(rows) == 2001
    assert set(GONE).isdisjoint(rows)
    assert set(NEW) <= set(rows)
    by_sku = {r["sku"]: r for r in b_records}
    assert rows["SKU-000010"]["price"] == Decimal(by_sku["SKU-000010"]["price"])
    assert {r["run_id"] for r in rows.values()} == {b}
    if engine.dialect.name == "postgresql":
        found = tables(typed)
        kinds = {
            c["name"]: str(c["type"])
            for c in inspect(engine).get_columns(found.current.name, schema=found.schema)
        }
        assert kinds["price"] == "NUMERIC"

    with typed.uow.begin() as session:
        starts = {
            run_id: session.get(Run, run_id).created_at  # type: ignore[union-attr]
            for run_id in (a, b)
        }
    history = history_rows(typed)
    a_by_sku = {r["sku"]: r for r in a_records}
    for sku in ABOVE + BELOW:
        stretches = [
            (h["price"], h["valid_from"], h["valid_to"]) for h in history if h["entity_key"] == sku
        ]
        assert stretches == [
            (Decimal(a_by_sku[sku]["price"]), starts[a], starts[b]),
            (Decimal(by_sku[sku]["price"]), starts[b], None),
        ]
    for sku in GONE:
        assert [
            (h["valid_from"], h["valid_to"], h["closed_by_run_id"])
            for h in history
            if h["entity_key"] == sku
        ] == [(starts[a], starts[b], b)]
    assert len(history) == 2000 + 3 + 5 + 1
    assert_rows_are_open_stretches(typed)

    changes = change_rows(typed)
    assert {c["run_id"] for c in changes} == {b}
    kinds_of = {
        kind: sorted({c["entity_key"] for c in changes if c["kind"] == kind})
        for kind in ("added", "removed", "changed")
    }
    assert kinds_of == {
        "added": list(NEW),
        "removed": list(GONE),
        "changed": sorted((*ABOVE, RETITLED)),
    }
    retitled = next(c for c in changes if c["entity_key"] == RETITLED)
    assert (retitled["column_name"], retitled["before"], retitled["after"]) == (
        "title",
        a_by_sku[RETITLED]["title"],
        by_sku[RETITLED]["title"],
    )
    with typed.uow.begin() as session:
        publication = session.execute(
            select(Publication).where(Publication.run_id == b)
        ).scalar_one()
        assert publication.changes == {
            "added": 3,
            "removed": 2,
            "changed": 4,
            "baseline": False,
            "previous_run_id": a,
        }

    events = [e for e in receiver.of_type("dataset.changed") if e.body["data"]["run_id"] == b]
    assert len(events) == 1
    (event,) = events
    assert event.signed
    data = event.body["data"]
    assert (data["counts"], data["page"], data["pages"], data["baseline"]) == (
        {"added": 3, "removed": 2, "changed": 4},
        1,
        1,
        False,
    )
    assert [e["entity_key"] for e in data["added"]] == list(NEW)
    assert [e["entity_key"] for e in data["removed"]] == list(GONE)
    assert data["removed"][0]["values"]["price"] == float(a_by_sku[GONE[0]]["price"])
    changed = {e["entity_key"]: e["columns"] for e in data["changed"]}
    assert set(changed) == {*ABOVE, RETITLED}
    assert changed["SKU-000010"]["price"] == {
        "before": float(a_by_sku["SKU-000010"]["price"]),
        "after": float(by_sku["SKU-000010"]["price"]),
    }
    assert changed[RETITLED] == {
        "title": {"before": a_by_sku[RETITLED]["title"], "after": by_sku[RETITLED]["title"]}
    }


@pytest.mark.postgres
def test_a_reader_holding_a_snapshot_sees_the_old_run_whole_and_a_rejected_run_changes_nothing(
    web: Flask, typed: Services, cloud: CloudState, engine: Engine
) -> None:
    """A REPEATABLE READ reader opened before B's publication still reads A's rows after it;
    a new reader reads B's; a rejected run C changes nothing in datasets.*."""
    a_records = product_records(40)
    collect(web, typed, cloud, a_records)
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as reader:
        reader.begin()
        assert reader.execute(text("SELECT count(*) FROM datasets.products")).scalar_one() == 40
        b = collect(web, typed, cloud, product_records(30, start=20))
        assert verdict(typed, b).state == "published"
        held = reader.execute(text("SELECT entity_key FROM datasets.products")).scalars().all()
        assert len(held) == 40
        assert "SKU-000000" in held
        reader.rollback()
    with engine.connect() as fresh:
        keys = fresh.execute(text("SELECT entity_key FROM datasets.products")).scalars().all()
    assert sorted(keys) == [r["sku"] for r in product_records(30, start=20)]

    before = (current_rows(typed), history_rows(typed), change_rows(typed))
    c = collect(web, typed, cloud, product_records(40, start=100, garbage="alpha.example"))
    assert verdict(typed, c).state == "rejected"
    assert (current_rows(typed), history_rows(typed), change_rows(typed)) == before


def test_a_value_that_does_not_cast_is_null_kept_with_its_raw_value_and_counted(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """ "n/a" in a numeric column: NULL in the table, the failure kept on the row, and counted
    by the unparsable rule (within the allowance here, so the run is published)."""
    typed = use_datasets(services, typed_datasets(quality="max_invalid_records_percent = 20"))
    records = product_records(40)
    records[4]["price"] = "n/a"
    run_id = collect(web, typed, cloud, records)
    assert verdict(typed, run_id).state == "published"
    row = current_rows(typed)[records[4]["sku"]]
    assert row["price"] is None
    assert row["cast_failures"] == [
        {"column": "price", "raw": "n/a", "why": "not a number (read with a decimal point)"}
    ]
    assert current_rows(typed)[records[5]["sku"]]["cast_failures"] is None
    with typed.uow.begin() as session:
        tallies, _ = evidence.tally(session, run_id, typed.datasets.get("products"))
    partition = records[4]["retailer"]
    assert tallies[partition].unparsable == {"price": 1}
    assert tallies[partition].samples["unparsable:price"] == ["n/a"]


def test_too_many_values_that_do_not_cast_reject_the_run_with_the_numbers(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Over the allowance, the cast failures quarantine the partition like any unparsable
    value, with a sample; nothing of the run reaches the table."""
    typed = use_datasets(services, typed_datasets())
    records = product_records(40)
    records[4]["price"] = "n/a"
    run_id = collect(web, typed, cloud, records)
    found = verdict(typed, run_id)
    assert found.state == "rejected"
    reasons = [r for p in found.partitions for r in p["reasons"]]
    assert [r["code"] for r in reasons] == ["unparsable"]
    assert "'price' does not cast to its column's type in 1 of 10 records" in reasons[0]["message"]
    assert "'n/a'" in reasons[0]["message"]
    assert current_rows(typed) == {}


def test_a_quarantined_partition_keeps_its_last_accepted_rows_and_is_not_reported_removed(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """publish_passing: B's garbage retailer is quarantined; its entities keep A's rows (with
    A's run id), the other retailers take B's, and nothing is reported removed."""
    typed = use_datasets(services, typed_datasets(policy="publish_passing"))
    a = collect(web, typed, cloud, product_records(40))
    b_records = product_records(40, garbage="alpha.example")
    for record in b_records:
        if record["retailer"] == "beta.example":
            record["title"] = "Renamed " + record["title"]
    b = collect(web, typed, cloud, b_records)
    assert verdict(typed, b).state == "published"
    rows = current_rows(typed)
    assert len(rows) == 40
    runs_by_retailer = {(r["retailer"], r["run_id"]) for r in rows.values()}
    assert runs_by_retailer == {
        ("alpha.example", a),
        ("beta.example", b),
        ("gamma.example", b),
        ("delta.example", b),
    }
    assert all(r["price"] is not None for r in rows.values())
    changes = change_rows(typed)
    assert {c["kind"] for c in changes} == {"changed"}
    assert len(changes) == 10  # beta's titles
    (event,) = [e for e in receiver.of_type("dataset.changed") if e.body["data"]["run_id"] == b]
    assert event.body["data"]["counts"] == {"added": 0, "removed": 0, "changed": 10}
    assert_rows_are_open_stretches(typed)


def test_with_no_columns_table_every_field_is_a_text_column_added_when_first_seen(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Default mode: each business field becomes a text column; a field first seen in a later
    run gets its column then, NULL for the rows of entities it did not touch."""
    plain = use_datasets(services, typed_datasets(columns=""))
    collect(web, plain, cloud, product_records(40))
    assert [c.name for c in tables(plain).columns] == ["price", "retailer", "sku", "title", "url"]
    later = product_records(40)
    later[0]["Colour name"] = "red"
    collect(web, plain, cloud, later)
    assert [c.name for c in tables(plain).columns][-1] == "colour_name"
    rows = current_rows(plain)
    assert rows["SKU-000000"]["colour_name"] == "red"
    assert rows["SKU-000001"]["colour_name"] is None
    assert rows["SKU-000001"]["price"] == product_records(2)[1]["price"]
    assert_rows_are_open_stretches(plain)
