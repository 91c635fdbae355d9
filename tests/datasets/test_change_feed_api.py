"""Thin change events: one ``dataset.changed`` per publication whatever its size, and every
change fetchable page by page from ``GET /api/changes`` and ``scrapesync diff``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from click.testing import CliRunner
from flask import Flask

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from tests.acceptance.flow import collect, product_records, use_datasets, verdict
from tests.datasets.flow import typed_datasets
from tests.fakes import Receiver
from webhooks import create_app

TOKEN = "status-token-for-changes"


def _deployment(services: Services, *, max_changes: int) -> tuple[Services, Flask]:
    """The typed products dataset with ``max_changes`` entries per event, and its web app."""
    text = typed_datasets().replace(
        "[datasets.products.quality]",
        f"max_changes_per_event = {max_changes}\n[datasets.products.quality]",
        1,
    )
    switched = use_datasets(services, text)
    switched = dataclasses.replace(
        switched, settings=dataclasses.replace(switched.settings, status_token=TOKEN)
    )
    use_datasets(switched, text)
    app = create_app(switched)
    app.testing = True
    return switched, app


def _all_pages(web: Flask, run_id: str, limit: int) -> list[dict[str, Any]]:
    """Every page of a publication's changes, following ``next`` from the first."""
    pages: list[dict[str, Any]] = []
    after = ""
    while True:
        answer = web.test_client().get(
            "/api/changes",
            query_string={"dataset": "products", "run": run_id, "after": after, "limit": limit},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert answer.status_code == 200, answer.get_data(as_text=True)
        pages.append(answer.get_json())
        after = pages[-1]["next"]
        if after is None:
            return pages


def test_a_baseline_is_one_delivery_and_every_entity_can_be_fetched_by_pages_and_diff(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """A first publication of 250 entities sends one summary event per destination; the API's
    pages and ``diff --json`` both list all 250 as added, with their typed values."""
    deployed, web = _deployment(services, max_changes=1000)
    records = product_records(250)
    a = collect(web, deployed, cloud, records)
    assert verdict(deployed, a).state == "published"
    (event,) = receiver.of_type("dataset.changed")
    data = event.body["data"]
    assert (data["baseline"], data["inline"], data["counts"]["added"]) == (True, False, 250)
    assert "added" not in data
    assert data["changes_path"] == f"/api/changes?dataset=products&run={a}&revision=1"

    pages = _all_pages(web, a, limit=60)
    assert len(pages) == 5
    entries = [e for page in pages for e in page["changes"]]
    assert {e["kind"] for e in entries} == {"added"}
    assert sorted(e["entity_key"] for e in entries) == sorted(r["sku"] for r in records)
    by_key = {e["entity_key"]: e["after"] for e in entries}
    assert by_key[records[7]["sku"]]["price"] == float(records[7]["price"])

    shown = CliRunner().invoke(main, ["diff", "products", "--json"])
    assert shown.exit_code == 0, shown.output
    changes = json.loads(shown.output)
    assert (changes["previous_run_id"], changes["counts"]["added"]) == (None, 250)
    assert {e["entity_key"]: e["values"] for e in changes["added"]} == by_key


def test_a_change_set_over_the_inline_limit_is_one_summary_event_and_pages_give_every_change(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """With at most 5 entries inline, a publication changing 40 entities sends one event
    without entries; the pages hold exactly the change set ``diff --json`` reports."""
    deployed, web = _deployment(services, max_changes=5)
    first = product_records(100)
    a = collect(web, deployed, cloud, first)
    second = [dict(r, title=f"Renamed {r['title']}") if i < 30 else r for i, r in enumerate(first)]
    second = second[10:] + product_records(10, start=5000)
    b = collect(web, deployed, cloud, second)
    assert verdict(deployed, b).state == "published"
    (event,) = [e for e in receiver.of_type("dataset.changed") if e.body["data"]["run_id"] == b]
    data = event.body["data"]
    assert (data["inline"], data["counts"]) == (False, {"added": 10, "removed": 10, "changed": 20})
    assert data["previous_run_id"] == a

    pages = _all_pages(web, b, limit=7)
    entries = [e for page in pages for e in page["changes"]]
    assert len(entries) == len({(e["entity_key"], e["column"]) for e in entries}) == 40
    changes = json.loads(CliRunner().invoke(main, ["diff", "products", "--json"]).output)
    assert sorted(e["entity_key"] for e in entries if e["kind"] == "added") == [
        e["entity_key"] for e in changes["added"]
    ]
    assert sorted(e["entity_key"] for e in entries if e["kind"] == "removed") == [
        e["entity_key"] for e in changes["removed"]
    ]
    retitled = {e["entity_key"]: e for e in entries if e["kind"] == "changed"}
    assert {
        k: v["columns"]["title"]["after"]
        for k, v in ((e["entity_key"], e) for e in changes["changed"])
    } == {k: e["after"] for k, e in retitled.items()}


def test_a_small_change_set_still_travels_inline_in_its_one_event(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Under the limit the event carries the entries themselves, as before, and says so."""
    deployed, web = _deployment(services, max_changes=1000)
    first = product_records(40)
    collect(web, deployed, cloud, first)
    b = collect(web, deployed, cloud, first[1:])
    (event,) = [e for e in receiver.of_type("dataset.changed") if e.body["data"]["run_id"] == b]
    data = event.body["data"]
    assert data["inline"] is True
    assert [e["entity_key"] for e in data["removed"]] == [first[0]["sku"]]


def test_the_changes_api_wants_the_token_and_names_what_it_cannot_find(
    services: Services, cloud: CloudState
) -> None:
    """No token: 401. An unknown dataset or run: 404 naming it. No dataset named, or a bad
    limit: 400, saying what to send."""
    deployed, web = _deployment(services, max_changes=1000)
    collect(web, deployed, cloud, product_records(5))
    client = web.test_client()
    assert client.get("/api/changes?dataset=products").status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    unknown = client.get("/api/changes?dataset=nope", headers=auth)
    assert unknown.status_code == 404
    assert "unknown dataset 'nope'" in unknown.get_json()["detail"]
    unnamed = client.get("/api/changes?run=products-1999", headers=auth)
    assert unnamed.status_code == 400
    assert unnamed.get_json()["detail"] == (
        "name the dataset: /api/changes?dataset=NAME (known: products)"
    )
    no_run = client.get("/api/changes?dataset=products&run=products-1999", headers=auth)
    assert no_run.status_code == 404
    assert "products-1999" in no_run.get_json()["detail"]
    assert client.get("/api/changes?dataset=products&limit=0", headers=auth).status_code == 400
