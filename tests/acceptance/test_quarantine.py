"""An evaluation that fails every time: after a bounded number of tries through the worker its
run is ``quarantined`` with the error class as its reason, the sweep stops queueing it, and it is
never accepted later by accident (only an operator's decision moves it)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from flask import Flask

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from sync.ingest import run_rows
from sync.runs import due
from sync.runs.quarantine import EVALUATION_TRIES
from tests.acceptance.flow import product_records, published, verdict
from tests.harness import drain, notify, products_sitemap

pytestmark = pytest.mark.redis

RUN_ID = "products-2026-W54"  # a week no year has: the publication cannot place it in time


def test_an_evaluation_that_raises_every_time_quarantines_the_run_after_n_tries(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """The run's job syncs; each evaluation raises (ValueError); the sweep queues it again
    until EVALUATION_TRIES failures, then the run is quarantined with the error class, no
    sweep queues it, new data leaves it quarantined, and nothing was published."""
    with services.uow.begin() as session:
        run_rows.ensure_run(
            session,
            run_id=RUN_ID,
            dataset="products",
            window="2026-W54",
            sitemap_id=None,
            sitemap_name=None,
            now=services.clock(),
        )
        session.commit()
    job_id = cloud.create_job(products_sitemap(cloud), custom_id=RUN_ID)
    cloud.run_job(job_id, records=product_records(40))
    notify(web, job_id)
    drain(services)
    for _ in range(EVALUATION_TRIES + 3):
        assert verdict(services, RUN_ID).state != "accepted"
        due.redrive(services)
        drain(services)
    found = verdict(services, RUN_ID)
    assert found.state == "quarantined"
    (reason,) = found.reasons
    assert reason["code"] == "evaluation_failed"
    assert reason["detail"] == {"error_class": "ValueError", "tries": EVALUATION_TRIES}
    assert published(services) is None
    with services.uow.begin() as session:
        assert RUN_ID not in due.runs_due_for_evaluation(session)

    # new data for the run (Cloud's "Continue"): judged as held, still quarantined
    cloud.run_job(job_id, records=product_records(50))
    notify(web, job_id)
    drain(services)
    due.redrive(services)
    drain(services)
    assert verdict(services, RUN_ID).state == "quarantined"

    result = CliRunner().invoke(main, ["status", RUN_ID])
    assert result.exit_code == 0, result.output
    assert "state: quarantined" in result.output
    assert "ValueError" in result.output

    # the operator's accept cannot apply while the evaluation still fails: it stays quarantined
    # and the sweep does not start again; a cancel settles it
    result = CliRunner().invoke(main, ["accept", RUN_ID, "--reason", "looks fine"])
    assert result.exit_code == 0, result.output
    assert f"run {RUN_ID}: accepted by the operator (looks fine); still quarantined for now" in (
        result.output
    )
    assert "still fails" in result.output
    assert verdict(services, RUN_ID).state == "quarantined"
    with services.uow.begin() as session:
        assert RUN_ID not in due.runs_due_for_evaluation(session)
    result = CliRunner().invoke(main, ["cancel", RUN_ID, "--reason", "no such week"])
    assert result.exit_code == 0, result.output
    assert verdict(services, RUN_ID).state == "cancelled"
    assert published(services) is None
