"""One bad value costs one value: a record set aside at import (a NUL in one field) keeps its
entity's last published row in ``datasets.X``, flagged stale with the value at fault, and is
never recorded or announced as removed."""

from __future__ import annotations

from decimal import Decimal

import pytest
from flask import Flask
from sqlalchemy import select, text

from simulator import CloudState
from sync.bootstrap import Services
from sync.models import Publication, SetAsideRecord
from tests.acceptance.flow import collect, product_records, published, settle, verdict
from tests.datasets.flow import (
    assert_rows_are_open_stretches,
    change_rows,
    current_rows,
    tables,
)
from tests.fakes import Receiver

pytestmark = pytest.mark.redis


def test_a_record_with_a_nul_keeps_its_entity_stale_and_is_never_announced_removed(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Run 2 holds one record with a NUL in its title (and a new price): the run is published,
    the entity keeps run 1's title and price with stale = true and the title named in
    set_aside; no removed change is recorded or sent; run 3 with the record clean again clears
    the flag."""
    first = collect(web, services, cloud, product_records(400))
    clean = {r["sku"]: r for r in product_records(400)}
    records = product_records(400)
    poisoned = records[7]
    key = poisoned["sku"]
    poisoned["title"] = "half\x00a title"
    poisoned["price"] = "999.00"
    second = collect(web, services, cloud, records)
    assert verdict(services, second).state == "published"
    assert published(services) == second
    settle(services)

    rows = current_rows(services)
    assert len(rows) == 400
    row = rows[key]
    assert row["title"] == clean[key]["title"]
    assert Decimal(row["price"]) == Decimal(clean[key]["price"])
    assert row["stale"] is True
    assert row["run_id"] == first
    (value,) = row["set_aside"]
    assert (value["field"], value["reason"], value["run_id"]) == ("title", "nul_character", second)
    assert value["line"] == 8
    assert not any(r["stale"] for k, r in rows.items() if k != key)
    assert all(r["run_id"] == second for k, r in rows.items() if k != key)
    assert_rows_are_open_stretches(services)

    assert [c for c in change_rows(services) if c["kind"] == "removed"] == []
    with services.uow.begin() as session:
        counts = session.execute(
            select(Publication.changes).where(Publication.run_id == second)
        ).scalar_one()
        kept = session.execute(select(SetAsideRecord)).scalars().all()
        assert [(k.run_id, k.entity_key, k.reason) for k in kept] == [
            (second, key, "nul_character")
        ]
    assert counts["removed"] == 0
    for delivered in receiver.of_type("dataset.changed"):
        data = delivered.body["data"]
        assert not data.get("removed"), data
        assert (data.get("counts") or {}).get("removed", 0) == 0

    third = collect(web, services, cloud, product_records(400))
    assert verdict(services, third).state == "published"
    row = current_rows(services)[key]
    assert (row["stale"], row["set_aside"], row["run_id"]) == (False, None, third)


def test_a_dataset_table_of_an_earlier_release_gains_the_stale_columns(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A table made before the stale and set_aside columns existed gets them when its tables
    are next ensured: its rows are not stale, and a later publication writes them."""
    collect(web, services, cloud, product_records(40))
    found = tables(services)
    name = found.qualified(found.current)
    with services.uow.begin() as session:
        session.execute(text(f"ALTER TABLE {name} DROP COLUMN stale"))
        session.execute(text(f"ALTER TABLE {name} DROP COLUMN set_aside"))
        session.commit()
    second = collect(web, services, cloud, product_records(40, start=40))
    assert verdict(services, second).state == "published"
    rows = current_rows(services)
    assert len(rows) == 40
    assert {(r["stale"], r["set_aside"]) for r in rows.values()} == {(False, None)}
