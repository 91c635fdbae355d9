"""No configured secret, raw or URL-encoded, reaches a log line, a stored row, an error message
or CLI output, even when Cloud echoes it back."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from flask import Flask
from sqlalchemy import select

from scrapesync.cli import main
from simulator import CloudState
from sync import logs
from sync.bootstrap import Services
from sync.models import SyncTask
from tests.harness import drain, notify, products_sitemap
from tests.security.conftest import echoing_422, leaked, stored_text
from webhooks import create_app

pytestmark = pytest.mark.redis


@pytest.fixture
def log_text() -> Iterator[io.StringIO]:
    """Every line scrapesync's and RQ's loggers write, as the JSON formatter renders it."""
    logs.configure()
    sink = io.StringIO()
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logs.JsonFormatter())
    watched = [logging.getLogger(name) for name in ("scrapesync", "rq.worker", "httpx")]
    for logger in watched:
        logger.addHandler(handler)
    yield sink
    for logger in watched:
        logger.removeHandler(handler)


def test_a_secret_cloud_echoes_during_a_sync_reaches_no_row_and_no_log_line(
    guarded: Services, cloud: CloudState, log_text: io.StringIO
) -> None:
    """A 422 quoting every secret: the task is quarantined, its error says why, nothing leaks."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, n=3)
    echoing_422(cloud, f"scraping-job/{job_id}")
    web: Flask = create_app(guarded)
    assert notify(web, job_id).status_code == 200
    drain(guarded)
    with guarded.uow.begin() as session:
        task = session.execute(select(SyncTask)).scalar_one()
        assert task.state == "quarantined"
        assert task.last_error is not None
        assert "HTTP 422" in task.last_error
        assert "***" in task.last_error
    stored = stored_text(guarded)
    assert leaked(stored) == []
    assert "attempt.settled" in log_text.getvalue()
    assert leaked(log_text.getvalue()) == []


def test_reconcile_prints_and_stores_no_secret_cloud_echoes(
    guarded: Services, cloud: CloudState
) -> None:
    """The job listing answered with a 422 quoting every secret: plain and JSON output and the
    maintenance row say the listing failed, with every secret masked."""
    echoing_422(cloud, "scraping-jobs")
    plain = CliRunner().invoke(main, ["reconcile"])
    as_json = CliRunner().invoke(main, ["reconcile", "--json"])
    for result in (plain, as_json):
        assert "HTTP 422" in result.output
        assert leaked(result.output) == []
    assert "HTTP 422" in stored_text(guarded)
    assert leaked(stored_text(guarded)) == []
