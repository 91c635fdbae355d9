"""Targeted reruns: a recovery batch under the original run repairs a quarantined partition,
the run is promoted, and partitions that passed stay exactly as they were."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from flask import Flask
from sqlalchemy import select

from scrapesync.cli import main
from simulator import CloudState, generate_records
from sync.bootstrap import Services
from sync.models import Attempt, Launch, Observation, OutboxEvent, PartitionVerdict, Run
from sync.models import ScrapingJob as JobRow
from sync.runs import launch, rerun
from tests.harness import drain, notify

pytestmark = pytest.mark.redis

WINDOW = "2026-12-02"
RUN_ID = f"products-{WINDOW}"
BROKEN = "gamma.example"


def _records(*, broken: bool) -> list[dict[str, Any]]:
    records = [dict(r) for r in generate_records(30)]
    for record in records:
        if broken and record["retailer"] == BROKEN:
            record["price"] = "call us"
    return records


def _run_job(web: Flask, services: Services, cloud: CloudState, job_id: int, records: Any) -> None:
    cloud.set_records(job_id, records)
    cloud.run_job(job_id)
    assert notify(web, job_id, custom_id=cloud.job(job_id).custom_id or "").status_code == 200
    drain(services)


def _run(services: Services) -> dict[str, Any]:
    with services.uow.begin() as session:
        run = session.get(Run, RUN_ID)
        assert run is not None
        verdicts = dict(
            session.execute(
                select(PartitionVerdict.partition, PartitionVerdict.state).where(
                    PartitionVerdict.run_id == RUN_ID
                )
            ).all()
        )
        return {"state": run.state, "partitions": verdicts, "reasons": list(run.reasons)}


def _rows(services: Services, *, partition: str | None = None) -> dict[str, tuple[Any, ...]]:
    """Each observation of the run: payload hash, last change, source attempt, payload."""
    with services.uow.begin() as session:
        query = select(Observation).where(Observation.run_id == RUN_ID)
        if partition is not None:
            query = query.where(Observation.partition == partition)
        return {
            o.observation_key: (
                o.payload_hash,
                o.last_changed_at,
                o.source_attempt_id,
                o.source_job_id,
                o.partition,
                dict(o.payload),
            )
            for o in session.execute(query).scalars()
        }


@pytest.fixture
def rejected_run(web: Flask, services: Services, cloud: CloudState) -> int:
    """A launched run whose gamma.example partition has prices that do not parse: rejected."""
    outcome = launch.launch(services, "products", window=WINDOW)
    assert outcome.job_id is not None
    _run_job(web, services, cloud, outcome.job_id, _records(broken=True))
    run = _run(services)
    assert run["state"] == "rejected"
    assert run["partitions"] == {
        "alpha.example": "passed",
        "beta.example": "passed",
        BROKEN: "quarantined",
    }
    return outcome.job_id


@pytest.mark.slow
def test_a_rerun_of_the_quarantined_partition_promotes_the_run_and_leaves_the_rest_alone(
    web: Flask, services: Services, cloud: CloudState, rejected_run: int
) -> None:
    """`scrapesync rerun RUN --partition P`: one recovery job with P's start URLs under the
    original run; its repaired records take the same observation keys; the run is accepted
    and published; the partitions that passed keep every row byte for byte."""
    others = {k: v for k, v in _rows(services).items() if v[4] != BROKEN}
    assert len(others) == 20
    broken_before = _rows(services, partition=BROKEN)
    result = CliRunner().invoke(main, ["rerun", RUN_ID, "--partition", BROKEN])
    assert result.exit_code == 0, result.output
    batch = f"{RUN_ID}~r1"
    assert f"recovery batch {batch} with 1 start URLs" in result.output
    (recovery,) = [j.id for j in cloud.jobs.values() if j.custom_id == batch]
    assert cloud.job(recovery).start_urls == ["https://alpha.example/"]
    assert _run(services)["state"] == "candidate"
    with services.uow.begin() as session:
        row = session.get(Launch, batch)
        assert row is not None
        assert (row.kind, row.partition, row.state, row.job_id) == (
            "rerun",
            BROKEN,
            "created",
            recovery,
        )
        assert sorted(row.manifest["partitions"]) == ["alpha.example", "beta.example"]

    repaired = [r for r in _records(broken=False) if r["retailer"] == BROKEN]
    _run_job(web, services, cloud, recovery, repaired)

    run = _run(services)
    assert run["state"] == "published"
    assert set(run["partitions"].values()) == {"passed"}
    after = _rows(services)
    assert {k: v for k, v in after.items() if v[4] != BROKEN} == others
    fixed = _rows(services, partition=BROKEN)
    assert set(fixed) == set(broken_before)  # the same observation keys, rewritten
    assert {v[3] for v in fixed.values()} == {recovery}
    assert all(v[5]["price"] != "call us" for v in fixed.values())
    assert rerun.frozen_partitions_intact(services, batch) == {
        "alpha.example": True,
        "beta.example": True,
    }
    with services.uow.begin() as session:
        job = session.get(JobRow, recovery)
        assert job is not None
        assert (job.run_id, job.recovery_batch) == (RUN_ID, batch)
        batches = session.execute(
            select(Attempt.recovery_batch).where(Attempt.job_id == recovery)
        ).scalars()
        assert list(batches) == [batch]
        published = session.execute(
            select(OutboxEvent.event_type).where(OutboxEvent.run_id == RUN_ID)
        ).scalars()
        assert "dataset.published" in list(published)


def test_a_partition_that_passed_is_not_rerun(
    services: Services, cloud: CloudState, rejected_run: int
) -> None:
    """Partitions that passed are left untouched: rerunning one is refused, no job is made."""
    with pytest.raises(rerun.RerunError, match="left untouched"):
        rerun.rerun(services, RUN_ID, partition="alpha.example")
    assert len(cloud.jobs) == 1


def test_a_rerun_of_given_urls_launches_them_once(
    services: Services, cloud: CloudState, rejected_run: int
) -> None:
    """--url: those pages only; a second rerun is a new batch with its own number."""
    first = rerun.rerun(
        services, RUN_ID, urls=["https://gamma.example/p/2", "https://gamma.example/p/5"]
    )
    assert first.batch_id == f"{RUN_ID}~r1"
    assert cloud.job(first.job_id or 0).start_urls == [
        "https://gamma.example/p/2",
        "https://gamma.example/p/5",
    ]
    second = rerun.rerun(services, RUN_ID, urls=["https://gamma.example/p/8"])
    assert second.batch_id == f"{RUN_ID}~r2"
    with pytest.raises(rerun.RerunError, match="not an http"):
        rerun.rerun(services, RUN_ID, urls=["gamma.example/p/8"])


@pytest.mark.slow
def test_an_uncertain_rerun_is_resumed_not_repeated(
    services: Services, cloud: CloudState, rejected_run: int
) -> None:
    """A recovery create that got a 503 is resumed by the next rerun: one batch, one job."""
    cloud.inject_fault("status", path_contains="scraping-job", status=503, method="POST")
    first = rerun.rerun(services, RUN_ID, partition=BROKEN)
    assert first.state == "uncertain"
    assert _run(services)["state"] == "rejected"
    again = rerun.rerun(services, RUN_ID, partition=BROKEN)
    assert (again.batch_id, again.state) == (first.batch_id, "created")
    assert [j.id for j in cloud.jobs.values() if j.custom_id == first.batch_id] == [again.job_id]
    assert _run(services)["state"] == "candidate"


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "asked-of-cloud"])
def test_a_failed_pages_rerun_takes_the_problematic_urls_of_the_runs_jobs(
    web: Flask, services: Services, cloud: CloudState, stored: bool
) -> None:
    """--failed-pages: the failed and empty pages of the run's jobs, as evaluation stored them
    or, when a job's list was never stored, as Cloud lists them now."""
    outcome = launch.launch(services, "products", window=WINDOW)
    assert outcome.job_id is not None
    cloud.set_generated(outcome.job_id, 30)
    problems = [
        ("https://beta.example/p/900", "failed"),
        ("https://beta.example/p/901", "failed"),
        ("https://gamma.example/p/902", "empty"),
    ]
    cloud.run_job(outcome.job_id, problematic_urls=problems)
    notify(web, outcome.job_id, custom_id=RUN_ID)
    drain(services)
    assert _run(services)["state"] == "rejected"
    if not stored:
        with services.uow.begin() as session:
            session.execute(JobRow.__table__.update().values(problematic_urls=None))
            session.commit()
    cloud.requests.clear()
    result = CliRunner().invoke(main, ["rerun", RUN_ID, "--failed-pages", "--json"])
    assert result.exit_code == 0, result.output
    (recovery,) = [j for j in cloud.jobs.values() if j.custom_id == f"{RUN_ID}~r1"]
    assert recovery.start_urls == [url for url, _ in problems]
    asked = [p for _, p in cloud.requests if p.endswith("/problematic-urls")]
    assert len(asked) == (0 if stored else 1)
    assert json.loads(result.output)["start_urls"] == [url for url, _ in problems]


def test_a_rerun_needs_a_known_run_and_one_choice(services: Services, cloud: CloudState) -> None:
    """An unknown run, or no/two choices of what to rerun, is an error before any call."""
    none = CliRunner().invoke(main, ["rerun", RUN_ID])
    assert none.exit_code == 2
    assert "exactly one of" in none.output
    unknown = CliRunner().invoke(main, ["rerun", "products-1999-01-01", "--partition", "x"])
    assert unknown.exit_code == 1
    assert "no run 'products-1999-01-01'" in unknown.output
    assert cloud.requests == []


@pytest.mark.slow
def test_a_failed_pages_rerun_that_scrapes_them_cleanly_promotes_the_run(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A run rejected for failed pages is accepted and published once a recovery job under it
    has scraped those pages without a problem."""
    outcome = launch.launch(services, "products", window=WINDOW)
    assert outcome.job_id is not None
    cloud.set_generated(outcome.job_id, 30)
    problems = [(f"https://beta.example/p/{900 + i}", "failed") for i in range(3)]
    cloud.run_job(outcome.job_id, problematic_urls=problems)
    notify(web, outcome.job_id, custom_id=RUN_ID)
    drain(services)
    run = _run(services)
    assert run["state"] == "rejected"
    assert "failed_pages" in {r["code"] for r in run["reasons"]}

    result = rerun.rerun(services, RUN_ID, failed_pages=True)
    assert result.job_id is not None
    repaired = [
        {
            "sku": f"SKU-9{i:02d}",
            "title": "t",
            "price": "9.99",
            "url": url,
            "retailer": "beta.example",
        }
        for i, (url, _) in enumerate(problems)
    ]
    cloud.set_records(result.job_id, repaired)
    cloud.run_job(result.job_id, problematic_urls=[])
    notify(web, result.job_id, custom_id=result.batch_id)
    drain(services)
    run = _run(services)
    assert run["state"] == "published", run["reasons"]
    assert "failed_pages" not in {r["code"] for r in run["reasons"]}


@pytest.mark.slow
def test_a_recovery_batch_never_rewrites_a_partition_that_passed(
    web: Flask, services: Services, cloud: CloudState, rejected_run: int
) -> None:
    """A recovery page that also lists an item of a passing partition leaves that row alone and
    counts the record as protected on the attempt."""
    others = {k: v for k, v in _rows(services).items() if v[4] != BROKEN}
    outcome = rerun.rerun(services, RUN_ID, partition=BROKEN)
    assert outcome.job_id is not None
    repaired = [r for r in _records(broken=False) if r["retailer"] == BROKEN]
    stray = dict(next(r for r in _records(broken=False) if r["retailer"] == "alpha.example"))
    stray["price"] = "0.01"
    _run_job(web, services, cloud, outcome.job_id, [*repaired, stray])
    assert {k: v for k, v in _rows(services).items() if v[4] != BROKEN} == others
    with services.uow.begin() as session:
        protected = session.execute(
            select(Attempt.protected).where(Attempt.job_id == outcome.job_id)
        ).scalar_one()
    assert protected == 1
    assert _run(services)["state"] == "published"
