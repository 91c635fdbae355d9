"""Judging runs against their dataset's history, end to end: Cloud notifies, the worker syncs and
evaluates each run against the profiles of the accepted runs before it, kept in the database."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import select

from config.datasets import Datasets
from simulator import CloudState
from sync.bootstrap import Services
from sync.models import RunProfile
from tests.acceptance.flow import (
    PER_RETAILER,
    RETAILERS,
    collect,
    exported,
    history_datasets,
    product_records,
    published,
    three_accepted_runs,
    use_datasets,
    verdict,
)
from tests.harness import datasets_from

pytestmark = pytest.mark.redis


@pytest.fixture
def datasets() -> Datasets:
    """Every test here runs on the history dataset."""
    return datasets_from(history_datasets())


def test_each_accepted_run_leaves_its_profile_in_the_database(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Record count, records per partition, fill rates overall and per partition, fields."""
    records = product_records(400)
    alpha = records[0]["retailer"]
    for record in records:
        if record["retailer"] == alpha:
            record["title"] = ""
    run_id = collect(web, services, cloud, records)
    assert verdict(services, run_id).state == "published"
    with services.uow.begin() as session:
        profile = session.get(RunProfile, run_id)
        assert profile is not None
        assert (profile.dataset, profile.records) == ("products", 400)
        assert profile.partitions == dict.fromkeys(RETAILERS, PER_RETAILER)
        assert profile.fill_rates["title"] == 75.0
        assert profile.fill_rates["price"] == 100.0
        assert profile.partition_fill_rates[alpha]["title"] == 0.0
        assert profile.partition_fill_rates[records[1]["retailer"]]["title"] == 100.0
        assert set(profile.fields) == {"sku", "title", "price", "url", "retailer"}


@pytest.mark.slow
def test_a_run_with_30_percent_fewer_records_is_rejected_for_record_drop(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """280 records against a baseline of 400: rejected with got, baseline and allowed; the
    last accepted run stays published, and the rejected run leaves no profile."""
    accepted = three_accepted_runs(web, services, cloud)
    run_id = collect(web, services, cloud, product_records(280, start=5000))
    found = verdict(services, run_id)
    assert found.state == "rejected"
    (reason,) = found.reasons
    assert (reason["code"], reason["got"], reason["baseline"], reason["expected"]) == (
        "record_drop",
        280,
        400,
        300,
    )
    assert reason["detail"] == {"drop_percent": 30.0, "max_drop_percent": 25, "baseline_runs": 3}
    assert published(services) == accepted[-1]
    with services.uow.begin() as session:
        assert session.get(RunProfile, run_id) is None


@pytest.mark.slow
def test_price_emptied_across_partitions_is_rejected_for_fill_rate_drop(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A selector that stopped matching: price empty in 40% of every retailer's records,
    which no fixed rule of this dataset catches; rejected, naming price."""
    three_accepted_runs(web, services, cloud)
    records = product_records(400, start=5000)
    for i, record in enumerate(records):
        if i % 5 < 2:
            record["price"] = ""
    found = verdict(services, collect(web, services, cloud, records))
    assert found.state == "rejected"
    (reason,) = found.reasons
    assert (reason["code"], reason["partition"], reason["detail"]["field"]) == (
        "fill_rate_drop",
        None,
        "price",
    )
    assert (reason["got"], reason["baseline"], reason["expected"]) == (60, 100, 85)
    assert "'price'" in reason["message"]
    assert {p["state"] for p in found.partitions} == {"passed"}


@pytest.mark.slow
def test_a_field_missing_from_the_export_is_rejected_for_field_missing(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """title is gone from every record: rejected with field_missing naming it."""
    three_accepted_runs(web, services, cloud)
    records = product_records(400, start=5000)
    for record in records:
        del record["title"]
    found = verdict(services, collect(web, services, cloud, records))
    assert found.state == "rejected"
    (reason,) = found.reasons
    assert (reason["code"], reason["detail"]["field"], reason["got"], reason["baseline"]) == (
        "field_missing",
        "title",
        "absent",
        100,
    )


@pytest.mark.slow
def test_one_retailer_at_a_tenth_is_quarantined_and_the_rest_published(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """publish_passing: one retailer returns 10 records instead of 100; it is quarantined for
    partition_drop and the other three are published and exported."""
    services = use_datasets(services, history_datasets(policy="publish_passing"))
    three_accepted_runs(web, services, cloud)
    small, *others = RETAILERS
    records = product_records(300, start=5000, retailers=tuple(others))
    records += product_records(10, start=6000, retailers=(small,))
    run_id = collect(web, services, cloud, records)
    found = verdict(services, run_id)
    assert (found.state, found.is_published) == ("published", True)
    by_partition = {p["partition"]: p for p in found.partitions}
    assert by_partition[small]["state"] == "quarantined"
    (reason,) = by_partition[small]["reasons"]
    assert (reason["code"], reason["got"], reason["baseline"], reason["expected"]) == (
        "partition_drop",
        10,
        100,
        50,
    )
    assert {by_partition[p]["state"] for p in others} == {"passed"}
    assert [r["code"] for r in found.reasons] == ["partition_quarantined"]
    exported_records, manifest = exported(services, tmp_path)
    assert (len(exported_records), manifest["run_id"]) == (300, run_id)
    assert small not in {r["retailer"] for r in exported_records}


@pytest.mark.slow
def test_rejected_runs_never_enter_the_baseline(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Two big rejected runs after three accepted ones of 400 records: with a baseline of the
    last three runs, the next run of 400 is still judged against the accepted 400s."""
    services = use_datasets(services, history_datasets(quality="baseline_runs = 3"))
    three_accepted_runs(web, services, cloud)
    for i in range(2):
        big = product_records(2000, start=10_000 + 2000 * i, garbage=RETAILERS[1])
        assert verdict(services, collect(web, services, cloud, big)).state == "rejected"
    found = verdict(services, collect(web, services, cloud, product_records(400, start=20_000)))
    assert (found.state, found.reasons) == ("published", [])


def test_a_40_percent_drop_after_two_accepted_runs_is_rejected_with_its_figures(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Before three runs were accepted the last accepted run is the baseline: 240 records after
    400 and 400 is a record_drop with got, baseline and allowed, and the last run stays
    published."""
    collect(web, services, cloud, product_records(400))
    second = collect(web, services, cloud, product_records(400, start=400))
    run_id = collect(web, services, cloud, product_records(240, start=800))
    found = verdict(services, run_id)
    assert found.state == "rejected"
    (reason,) = found.reasons
    assert (reason["code"], reason["got"], reason["baseline"], reason["expected"]) == (
        "record_drop",
        240,
        400,
        300,
    )
    assert reason["detail"] == {"drop_percent": 40.0, "max_drop_percent": 25, "baseline_runs": 1}
    assert "against a baseline of 400 (the last accepted run)" in reason["message"]
    assert published(services) == second
    with services.uow.begin() as session:
        assert len(session.execute(select(RunProfile)).all()) == 2
