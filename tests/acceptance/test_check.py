"""``scrapesync check``: an existing run judged again under the current or another datasets file,
every rule's verdict printed with got / baseline / allowed, and nothing changed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from flask import Flask
from redis import Redis
from sqlalchemy import select

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from sync.models import Base
from tests.acceptance.flow import (
    RETAILERS,
    collect,
    history_datasets,
    notify,
    product_records,
    three_accepted_runs,
    use_datasets,
    verdict,
)
from tests.harness import write_datasets
from webhooks import create_app

pytestmark = pytest.mark.redis


def snapshot(services: Services) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in primary-key order."""
    with services.uow.begin() as session:
        return {
            table.name: [
                tuple(row)
                for row in session.execute(select(table).order_by(*table.primary_key.columns)).all()
            ]
            for table in Base.metadata.sorted_tables
        }


@pytest.fixture
def rejected(web: Flask, services: Services, cloud: CloudState) -> tuple[str, list[str]]:
    """Three accepted runs of 400 records, then a run of 280 rejected for record_drop; the
    rejected run's id and the accepted ones'."""
    services = use_datasets(services, history_datasets())
    accepted = three_accepted_runs(web, services, cloud)
    run_id = collect(web, services, cloud, product_records(280, start=5000))
    assert [r["code"] for r in verdict(services, run_id).reasons] == ["record_drop"]
    return run_id, accepted


def row_of(output: str, rule: str, subject: str = "-") -> list[str]:
    """The cells of one check row of the printed table."""
    for line in output.splitlines():
        cells = line.split()
        if cells[:2] == [rule, subject]:
            return cells
    raise AssertionError(f"no row for {rule} {subject} in:\n{output}")


@pytest.mark.slow
def test_a_looser_datasets_file_shows_the_rejected_run_would_be_accepted_and_changes_nothing(
    services: Services, redis_conn: Redis, rejected: tuple[str, list[str]], tmp_path: Path
) -> None:
    """max_record_drop_percent = 40: the 30% drop passes, the command says the run would be
    accepted, exits 0, and every table and the queue are exactly as they were."""
    run_id, accepted = rejected
    looser = write_datasets(
        tmp_path, history_datasets(quality="max_record_drop_percent = 40"), name="looser.toml"
    )
    before, queued = snapshot(services), sorted(redis_conn.keys())
    result = CliRunner().invoke(main, ["check", run_id, "--datasets", str(looser)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"run {run_id} (now rejected) under {looser}: would be accepted"
    assert lines[1] == (
        "baseline: the median of 3 accepted run(s): " + ", ".join(reversed(accepted))
    )
    assert row_of(result.output, "record_drop")[2:6] == ["pass", "280", "400", ">="]
    assert row_of(result.output, "record_drop")[6] == "240"
    assert row_of(result.output, "fill_rate_drop", "price")[2:5] == ["pass", "100", "100"]
    assert row_of(result.output, "min_records")[2:4] == ["pass", "280"]
    assert "reasons:" not in lines
    assert snapshot(services) == before
    assert sorted(redis_conn.keys()) == queued
    assert verdict(services, run_id).state == "rejected"


@pytest.mark.slow
def test_the_current_datasets_file_gives_the_stored_verdict_with_every_figure(
    services: Services, rejected: tuple[str, list[str]]
) -> None:
    """Under the deployment's own file the run would be rejected again (exit 1), with the
    failing rule's got, baseline and allowed."""
    run_id, _ = rejected
    result = CliRunner().invoke(main, ["check", run_id])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[0].endswith(": would be rejected")
    assert row_of(result.output, "record_drop")[2:7] == ["fail", "280", "400", ">=", "300"]
    assert any(
        line.startswith("  - record_drop: 280 records") for line in result.output.splitlines()
    )


@pytest.mark.slow
def test_check_json_has_the_verdict_the_baseline_and_every_check(
    services: Services, rejected: tuple[str, list[str]], tmp_path: Path
) -> None:
    """--json: the current and the would-be state, the baseline's runs and each check."""
    run_id, accepted = rejected
    looser = write_datasets(
        tmp_path, history_datasets(quality="max_record_drop_percent = 40"), name="looser.toml"
    )
    result = CliRunner().invoke(main, ["check", run_id, "--json", "--datasets", str(looser)])
    assert result.exit_code == 0, result.output
    values = json.loads(result.output)
    assert (values["current_state"], values["would_be"]) == ("rejected", "accepted")
    assert values["baseline"]["runs"] == list(reversed(accepted))
    assert values["datasets_file"] == str(looser)
    drop = next(c for c in values["checks"] if c["rule"] == "record_drop")
    assert (drop["verdict"], drop["got"], drop["baseline"]) == ("pass", 280, 400)
    assert values["profile"]["records"] == 280
    assert values["reasons"] == []


def test_check_refuses_an_unknown_run_or_an_unreadable_datasets_file(
    services: Services, tmp_path: Path
) -> None:
    """A clear error and a non-zero exit, nothing judged."""
    unknown = CliRunner().invoke(main, ["check", "products-job-404"])
    assert unknown.exit_code == 1
    assert "no run 'products-job-404'" in unknown.output
    missing = CliRunner().invoke(main, ["check", "x", "--datasets", str(tmp_path / "no.toml")])
    assert missing.exit_code == 2
    assert "not found" in missing.output
    broken = write_datasets(
        tmp_path, history_datasets(quality="max_record_drop = 40"), name="broken.toml"
    )
    refused = CliRunner().invoke(main, ["check", "x", "--datasets", str(broken)])
    assert refused.exit_code == 2
    assert "unknown keys ['max_record_drop']" in refused.output


@pytest.mark.slow
def test_a_run_before_its_history_is_judged_by_the_fixed_rules_and_says_so(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """The first run of a dataset: no baseline yet, and check says how many runs it waits for."""
    services = use_datasets(services, history_datasets())
    run_id = collect(web, services, cloud, product_records(400))
    result = CliRunner().invoke(main, ["check", run_id])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == (
        "baseline: none (0 accepted run(s) before this one; the history rules wait for 3)"
    )
    assert "record_drop" not in result.output


@pytest.mark.slow
def test_a_run_waiting_for_a_sync_names_the_baseline_it_will_be_held_against(
    web: Flask, services: Services, cloud: CloudState, rejected: tuple[str, list[str]]
) -> None:
    """Cloud's "Continue" of the rejected run's job, notified and not synced yet: check says
    the run waits for that sync, and names the same baseline its verdict was held against (it
    said "none" and that the history rules wait, as if the dataset had no history)."""
    run_id, accepted = rejected
    job_id = int(run_id.removeprefix("products-job-"))
    cloud.continue_job(job_id, product_records(20, start=9000))
    cloud.finish_job(job_id)
    notify(web, job_id)
    result = CliRunner().invoke(main, ["check", run_id])
    lines = result.output.splitlines()
    assert lines[0].endswith(": would stay candidate"), result.output
    baseline = ", ".join(reversed(accepted))
    assert lines[1] == f"baseline: the median of 3 accepted run(s): {baseline}"
    assert any("tasks_not_committed" in line for line in lines)


STATUS_TOKEN = "status-token-for-history"


@pytest.mark.slow
def test_status_shows_the_baseline_beside_each_figure_of_a_reason(
    services: Services, rejected: tuple[str, list[str]]
) -> None:
    """`scrapesync status`, /api/runs and /status give the rejected run's record_drop with what
    it got, its baseline and what was allowed."""
    run_id, _ = rejected
    table = CliRunner().invoke(main, ["status"])
    assert table.exit_code == 0, table.output
    (line,) = [x for x in table.output.splitlines() if x.startswith("  - record_drop:")]
    assert line.endswith("[got 280, baseline 400, allowed >= 300]")
    guarded = replace(services, settings=replace(services.settings, status_token=STATUS_TOKEN))
    client = create_app(guarded).test_client()
    auth = {"Authorization": f"Bearer {STATUS_TOKEN}"}
    runs = {r["run_id"]: r for r in client.get("/api/runs", headers=auth).json["runs"]}
    (detail,) = runs[run_id]["reason_details"]
    assert (detail["code"], detail["got"], detail["baseline"], detail["allowed"]) == (
        "record_drop",
        280,
        400,
        300,
    )
    html = client.get("/status", headers=auth).get_data(as_text=True)
    assert '<span class="figures">got 280, baseline 400, allowed &gt;= 300</span>' in html


@pytest.mark.slow
def test_status_shows_a_partitions_baseline_beside_its_figures(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A retailer quarantined for partition_drop: its reason in status carries its baseline."""
    services = use_datasets(services, history_datasets(policy="publish_passing"))
    three_accepted_runs(web, services, cloud)
    records = product_records(300, start=5000, retailers=RETAILERS[1:])
    records += product_records(10, start=6000, retailers=RETAILERS[:1])
    collect(web, services, cloud, records)
    table = CliRunner().invoke(main, ["status"])
    (line,) = [
        x for x in table.output.splitlines() if x.startswith(f"  - partition {RETAILERS[0]}")
    ]
    assert "partition_drop: 10 records" in line
    assert "[got 10, baseline 100, allowed >= 50]" in line
