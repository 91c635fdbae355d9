"""Jobs of sitemaps outside the datasets file: ``ignored``, not failed, in the sync path and in
``reconcile`` alike, listed by ``status`` with the reason, and no alert rule fires for them."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from sync.models import SyncTask
from tests.harness import drain, notify, task_of
from webhooks import create_app

pytestmark = pytest.mark.redis

STATUS_TOKEN = "ignored-status-token-77"
RULES = Path(__file__).parents[2] / "docs" / "operations.md"


def _foreign_job(web: Flask, services: Services, cloud: CloudState) -> int:
    """A finished job of a sitemap no dataset names, notified as Cloud notifies every job."""
    other = cloud.add_sitemap("someone-elses-sitemap")
    job_id = cloud.create_job(other)
    cloud.run_job(job_id, n=3)
    assert notify(web, job_id, sitemap_name="someone-elses-sitemap").status_code == 200
    drain(services)
    return job_id


def _task_alerts(services: Services) -> dict[str, float]:
    """Each alert rule of the docs on ``scrapesync_tasks``, evaluated on a real scrape: the sum
    of the task states its selector matches."""
    settings = dataclasses.replace(services.settings, status_token=STATUS_TOKEN)
    app = create_app(dataclasses.replace(services, settings=settings))
    body = app.test_client().get("/metrics", headers={"Authorization": f"Bearer {STATUS_TOKEN}"})
    assert body.status_code == 200
    tasks = {
        s.labels["state"]: s.value
        for family in text_string_to_metric_families(body.get_data(as_text=True))
        for s in family.samples
        if s.name == "scrapesync_tasks"
    }
    assert "ignored" in tasks
    rules = re.findall(
        r"alert: (\w+)\n\s+expr: sum\(scrapesync_tasks\{state=~\"([^\"]+)\"\}\) > 0",
        RULES.read_text(encoding="utf-8"),
    )
    assert rules, "the docs' alert rules on scrapesync_tasks were not found"
    return {
        name: sum(v for state, v in tasks.items() if re.fullmatch(pattern, state))
        for name, pattern in rules
    }


def test_a_foreign_sitemaps_job_is_ignored_listed_and_fires_no_alert(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """The task is ``ignored`` with the sitemap named; ``status`` lists it with its reason; no
    alert rule of the docs (ScrapesyncSyncsFailing) fires; ``reconcile`` agrees."""
    job_id = _foreign_job(web, services, cloud)
    task = task_of(services, f"job-{job_id}")
    assert task.state == "ignored"
    assert "someone-elses-sitemap" in task.last_error
    shown = CliRunner().invoke(main, ["status"])
    assert shown.exit_code == 0, shown.output
    (line,) = [x for x in shown.output.splitlines() if f"job {job_id}" in x]
    assert line.strip().startswith("ignored")
    assert "feeds no dataset" in line
    listed = json.loads(CliRunner().invoke(main, ["status", "--json"]).output)["attention"]
    assert listed["counts"]["ignored"] == 1
    assert listed["tasks"][0]["job_id"] == job_id
    alerts = _task_alerts(services)
    assert alerts.get("ScrapesyncSyncsFailing") == 0
    assert all(v == 0 for v in alerts.values())
    report = json.loads(CliRunner().invoke(main, ["reconcile", "--json"]).output)
    assert report["ignored"] == 1
    assert job_id not in report["needs_attention"]
    assert job_id not in [w["job_id"] for w in report["wanted"]]
    assert task_of(services, f"job-{job_id}").state == "ignored"


def test_reconcile_marks_a_foreign_job_left_quarantined_as_ignored(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A task an older release quarantined for the same reason is set ``ignored`` by the next
    reconcile, so the failing-syncs alert clears."""
    job_id = _foreign_job(web, services, cloud)
    with services.uow.begin() as session:
        session.execute(
            update(SyncTask).where(SyncTask.job_id == job_id).values(state="quarantined")
        )
        session.commit()
    assert _task_alerts(services)["ScrapesyncSyncsFailing"] == 1
    result = CliRunner().invoke(main, ["reconcile", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ignored_tasks"] == [job_id]
    assert task_of(services, f"job-{job_id}").state == "ignored"
    assert _task_alerts(services)["ScrapesyncSyncsFailing"] == 0


def test_status_lists_a_quarantined_task_with_its_reason(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A task Cloud refuses to show (403) is listed by `status` as quarantined, with the error
    class and message."""
    sitemap = next(iter(cloud.sitemaps))
    job_id = cloud.create_job(sitemap)
    cloud.run_job(job_id, n=3)
    cloud.inject_fault("status", path_contains=f"scraping-job/{job_id}", times=None, status=403)
    notify(web, job_id)
    drain(services)
    assert task_of(services, f"job-{job_id}").state == "quarantined"
    text = CliRunner().invoke(main, ["status"]).output
    (line,) = [x for x in text.splitlines() if f"job {job_id}" in x]
    assert line.strip().startswith("quarantined")
    assert "CloudAuthError" in line
    assert "quarantined" in text.split("tasks needing attention")[1].splitlines()[0]
