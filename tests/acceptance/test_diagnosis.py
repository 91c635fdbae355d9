"""The diagnosis of a rejection: a fill-rate drop in one partition names the field, the sitemap
selector behind it and sample records before and after, and prints the ``rerun`` command that
fixes it; run here, that command repairs the partition and the run is published."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner
from flask import Flask

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from tests.acceptance.flow import (
    RETAILERS,
    collect,
    history_datasets,
    product_records,
    published,
    settle,
    use_datasets,
    verdict,
)
from tests.fakes import Receiver
from tests.harness import notify
from webhooks import create_app

pytestmark = pytest.mark.redis

BROKEN = RETAILERS[0]


def cli(*args: str) -> tuple[int, str]:
    """Run ``scrapesync ARGS``; its exit code and output."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_a_fill_rate_drop_names_field_selector_samples_and_the_rerun_that_repairs_it(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Price emptied in 60% of one retailer's records after two clean runs: the partition is
    quarantined and the run rejected; status RUN, its JSON, check, /status and run.rejected
    name field price, selector 'price', two records before and two after, and print
    `scrapesync rerun RUN --partition P`; running it with the retailer repaired publishes the
    run."""
    services = use_datasets(services, history_datasets())
    collect(web, services, cloud, product_records(400))
    previous = collect(web, services, cloud, product_records(400))
    records = product_records(400)
    broken = [r for r in records if r["retailer"] == BROKEN]
    for record in broken[: int(len(broken) * 0.6)]:
        record["price"] = ""
    run_id = collect(web, services, cloud, records)
    found = verdict(services, run_id)
    assert found.state == "rejected"
    assert published(services) == previous

    code, out = cli("status", run_id, "--json")
    assert code == 0, out
    diagnosis = json.loads(out)["diagnosis"]
    (failure,) = diagnosis["failures"]
    assert (failure["code"], failure["partition"]) == ("fill_rate_drop", BROKEN)
    (field,) = failure["fields"]
    assert field["field"] == "price"
    assert field["selector"]["id"] == "price"
    assert field["selector"]["selector"] == ".price"
    assert len(failure["samples"]["after"]) == 2
    assert all(s["price"] == "" for s in failure["samples"]["after"])
    assert len(failure["samples"]["before"]) == 2
    assert all(s["price"] for s in failure["samples"]["before"])
    after_keys = {s["_entity_key"] for s in failure["samples"]["after"]}
    assert {s["_entity_key"] for s in failure["samples"]["before"]} == after_keys
    assert "problematic_urls" in failure
    rerun = f"scrapesync rerun {run_id} --partition {BROKEN}"
    assert diagnosis["next"][0] == rerun

    code, out = cli("status", run_id)
    assert "field 'price': selector 'price' (SelectorText, '.price')" in out
    assert out.count("    before: ") == 2
    assert out.count("    after: ") == 2
    assert f"next: {rerun}" in out
    code, out = cli("check", run_id)
    assert f"baseline: the last accepted run, {previous} (2 accepted run(s)" in out
    assert f"next: {rerun}" in out
    assert "field 'price': selector 'price'" in out
    settle(services)
    (event,) = [r.body for r in receiver.of_type("run.rejected")]
    assert event["data"]["diagnosis"]["next"][0] == rerun
    assert event["data"]["diagnosis"]["failures"][0]["fields"][0]["selector"]["id"] == "price"
    app = create_app(
        dataclasses.replace(
            services, settings=dataclasses.replace(services.settings, status_token="tok")
        )
    )
    page = app.test_client().get("/status?token=tok").get_data(as_text=True)
    assert rerun in page

    code, out = cli(*rerun.split()[1:])
    assert code == 0, out
    (recovery,) = [j for j in cloud.jobs.values() if (j.custom_id or "").startswith(run_id + "~")]
    repaired = [r for r in product_records(400) if r["retailer"] == BROKEN]
    cloud.set_records(recovery.id, repaired)
    cloud.run_job(recovery.id)
    notify(web, recovery.id, custom_id=recovery.custom_id or "")
    settle(services)
    found = verdict(services, run_id)
    assert (found.state, found.is_published) == ("published", True)
    assert {p["state"] for p in found.partitions} == {"passed"}
