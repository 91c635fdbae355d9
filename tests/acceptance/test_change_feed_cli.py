"""Through the worker: two published runs, then ``scrapesync diff``, ``status`` and the
``dataset.changed`` event a destination received all tell the same change set."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from flask import Flask
from sqlalchemy import select

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from sync.datasets import diff
from tests.acceptance.flow import (
    DATASETS_TOML,
    collect,
    product_records,
    use_datasets,
    verdict,
)
from tests.fakes import Receiver

pytestmark = pytest.mark.redis

TYPED = DATASETS_TOML.replace(
    '[datasets.products.quality]\nparsers = { price = "number" }\n',
    """[datasets.products.columns]
sku = "text"
title = "text"
price = "numeric"
retailer = "text"
url = "text"

[datasets.products.watch]
price = { percent = 1 }
title = true
""",
)


def test_diff_status_and_the_event_agree_on_what_a_publication_changed(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Run B after A: 2 gone, 3 new, 2 prices beyond 1% and 1 within it, 1 new title.
    ``diff --json`` is the dataset.changed event's change set; the history gives the same for
    the pair; status shows the counts; a rejected run C changes none of it."""
    services = use_datasets(services, TYPED)
    first = product_records(40)
    a = collect(web, services, cloud, first)
    second = [dict(r) for r in first[2:]] + product_records(3, start=40)
    second[0]["price"] = f"{float(second[0]['price']) * 1.05:.2f}"
    second[1]["price"] = f"{float(second[1]['price']) * 0.9:.2f}"
    second[2]["price"] = f"{float(second[2]['price']) + 0.01:.2f}"  # far under 1%
    second[3]["title"] = "Renamed"
    b = collect(web, services, cloud, second)
    assert verdict(services, b).state == "published"

    result = CliRunner().invoke(main, ["diff", "products", "--json"])
    assert result.exit_code == 0, result.output
    changes = json.loads(result.output)
    assert (changes["run_id"], changes["previous_run_id"]) == (b, a)
    assert changes["counts"] == {"added": 3, "removed": 2, "changed": 3}
    assert [e["entity_key"] for e in changes["removed"]] == [r["sku"] for r in first[:2]]
    changed = {e["entity_key"]: e["columns"] for e in changes["changed"]}
    assert changed[second[3]["sku"]] == {"title": {"before": first[5]["title"], "after": "Renamed"}}
    assert changed[second[0]["sku"]]["price"]["after"] == float(second[0]["price"])
    assert second[2]["sku"] not in changed

    (event,) = [e for e in receiver.of_type("dataset.changed") if e.body["data"]["run_id"] == b]
    data = dict(event.body["data"])
    assert (data.pop("revision"), data.pop("page"), data.pop("pages")) == (1, 1, 1)
    assert (data.pop("inline"), data.pop("changes_path")) == (
        True,
        f"/api/changes?dataset=products&run={b}&revision=1",
    )
    assert data == changes

    dataset = services.datasets.get("products")
    with services.uow.begin() as session:
        found = diff.diff_in(session, dataset, schema=services.settings.data_schema)
        tables = diff.tables_of(session, dataset, services.settings.data_schema)
        from_history = diff.computed_changes(session, dataset, tables, a, b)
    assert found.stored
    assert from_history.as_dict() == changes

    table = CliRunner().invoke(main, ["status"])
    assert f"products: published {b} (3 added, 2 removed, 3 changed since {a})" in (
        table.output.splitlines()
    )

    broken = [dict(r, price="call us") for r in second]
    c = collect(web, services, cloud, broken)
    assert verdict(services, c).state == "rejected"
    again = CliRunner().invoke(main, ["diff", "products", "--json"])
    assert json.loads(again.output) == changes
    refused = CliRunner().invoke(main, ["diff", "products", "--to", c])
    assert "was never published (it is rejected)" in refused.output


def test_a_quarantined_partition_is_neither_removed_nor_changed(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """publish_passing, one retailer's prices junk in run B: its entities keep A's rows, so
    diff reports none of them, from the stored feed and from the history alike."""
    services = use_datasets(
        services, TYPED.replace('policy = "reject"', 'policy = "publish_passing"')
    )
    first = product_records(40)
    a = collect(web, services, cloud, first)
    second = [dict(r) for r in first]
    for record in second:
        if record["retailer"] == "beta.example":
            record["price"] = "call us"
        elif record["retailer"] == "alpha.example":
            record["title"] += " (new)"
    b = collect(web, services, cloud, second)
    assert verdict(services, b).state == "published"
    result = CliRunner().invoke(main, ["diff", "products", "--json"])
    assert result.exit_code == 0, result.output
    changes = json.loads(result.output)
    alpha = sorted(r["sku"] for r in first if r["retailer"] == "alpha.example")
    assert changes["counts"] == {"added": 0, "removed": 0, "changed": len(alpha)}
    assert [e["entity_key"] for e in changes["changed"]] == alpha
    dataset = services.datasets.get("products")
    with services.uow.begin() as session:
        tables = diff.tables_of(session, dataset, services.settings.data_schema)
        kept = session.execute(
            select(tables.current.c.run_id).where(tables.current.c.partition == "beta.example")
        ).scalars()
        assert set(kept) == {a}
        from_history = diff.computed_changes(session, dataset, tables, a, b)
    assert from_history.as_dict() == changes
