"""``GET /metrics``: Prometheus text read from SQL at scrape time, behind the status token."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from datetime import timedelta

import pytest
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from config.datasets import Datasets
from config.settings import Settings
from simulator import CloudState
from sync import bootstrap, jobs
from sync.bootstrap import Services
from sync.cloud.budget import MemoryApiBudget
from sync.delivery import relay
from sync.ingest import store
from sync.operations import reconcile
from tests.acceptance.flow import (
    DATASETS_TOML,
    SECRET,
    accept_quietly,
    finished_job,
    settle,
    wire_receiver,
)
from tests.fakes import Receiver
from tests.harness import at_time, datasets_from, notify
from webhooks import create_app

pytestmark = pytest.mark.redis

STATUS_TOKEN = "metrics-token-51c0ffee"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def guarded_app(services: Services) -> Flask:
    """The web app of these services with a status token configured."""
    settings = dataclasses.replace(services.settings, status_token=STATUS_TOKEN)
    app = create_app(dataclasses.replace(services, settings=settings))
    app.testing = True
    return app


@pytest.fixture
def datasets() -> Datasets:
    """The acceptance tests' dataset: one run per job, announced to a signed HTTP receiver."""
    return datasets_from(DATASETS_TOML)


@pytest.fixture
def receiver() -> Receiver:
    """The dataset's HTTP destination (signature-checking)."""
    return Receiver(secret=SECRET)


@pytest.fixture
def services(services: Services, receiver: Receiver) -> Services:
    """The sync fixtures' services with the receiver wired as the relay's transport."""
    return wire_receiver(services, receiver)


def scraped(app: Flask) -> Samples:
    """Scrape /metrics as Prometheus does and parse it with prometheus-client's own parser."""
    response = app.test_client().get(
        "/metrics", headers={"Authorization": f"Bearer {STATUS_TOKEN}"}
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest.fixture
def scrape(services: Services, receiver: Receiver) -> Callable[[], Samples]:
    """A scrape of this deployment's web process."""
    app = guarded_app(services)
    return lambda: scraped(app)


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value, which must be there."""
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_need_the_status_token(services: Services) -> None:
    """Without the token the answer is 401; without a configured token the page is off."""
    client = guarded_app(services).test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get(f"/metrics?token={STATUS_TOKEN}").status_code == 200
    off = create_app(services).test_client().get(f"/metrics?token={STATUS_TOKEN}")
    assert off.status_code == 403


def test_a_scrape_shows_notifications_attempts_tasks_runs_budget_and_ages(
    web: Flask, services: Services, cloud: CloudState, scrape: Callable[[], Samples]
) -> None:
    """After one job is notified twice, synced and published, every figure says so."""
    before = scrape()
    assert value(before, "scrapesync_notifications_received_total") == 0
    assert value(before, "scrapesync_tasks", state="committed") == 0
    assert value(before, "scrapesync_last_reconcile_age_seconds") == math.inf
    assert value(before, "scrapesync_last_maintenance_age_seconds") == math.inf
    assert value(before, "scrapesync_database_up") == 1
    job_id = finished_job(cloud)
    notify(web, job_id)
    notify(web, job_id)
    settle(services)
    reconcile.reconcile(services)
    jobs.maintain()
    after = scrape()
    assert value(after, "scrapesync_notifications_received_total") == 2
    assert value(after, "scrapesync_attempts_total", outcome="committed") == 1
    assert ("scrapesync_attempts_total", (("outcome", "running"),)) not in after
    assert value(after, "scrapesync_attempts_running") == 0
    assert value(after, "scrapesync_tasks", state="committed") == 1
    assert value(after, "scrapesync_tasks", state="leased") == 0
    assert value(after, "scrapesync_oldest_lease_age_seconds") == 0
    assert value(after, "scrapesync_runs", state="published") == 1
    assert value(after, "scrapesync_runs", state="rejected") == 0
    assert value(after, "scrapesync_outbox_backlog") == 0
    assert 0 <= value(after, "scrapesync_last_reconcile_age_seconds") < math.inf
    assert 0 <= value(after, "scrapesync_last_maintenance_age_seconds") < math.inf
    limit = value(after, "scrapesync_api_budget_limit")
    assert limit == services.settings.api_budget_limit
    budget = services.budget
    assert budget is not None
    assert value(after, "scrapesync_api_budget_remaining") == budget.remaining() < 1000


def test_the_outbox_backlog_goes_up_when_events_wait_and_down_when_delivered(
    services: Services,
    cloud: CloudState,
    receiver: Receiver,
    scrape: Callable[[], Samples],
) -> None:
    """Three announcements written but not sent (accepted, published, changed) raise the
    backlog; the relay brings it to zero."""
    assert value(scrape(), "scrapesync_outbox_backlog") == 0
    _run_id, events = accept_quietly(services, cloud)
    waiting = scrape()
    assert value(waiting, "scrapesync_outbox_backlog") == len(events) == 3
    assert value(waiting, "scrapesync_outbox_oldest_undelivered_age_seconds") >= 0
    report = relay.relay(services)
    assert report.delivered == 3
    assert len(receiver.requests) == 3
    drained = scrape()
    assert value(drained, "scrapesync_outbox_backlog") == 0
    assert value(drained, "scrapesync_outbox_oldest_undelivered_age_seconds") == 0


def test_two_web_processes_answer_the_same_figures(
    web: Flask, services: Services, cloud: CloudState, scrape: Callable[[], Samples]
) -> None:
    """A second web process, wired on its own, reads the same numbers from the same database."""
    job_id = finished_job(cloud)
    notify(web, job_id)
    settle(services)
    other_settings = Settings(
        database_url=services.settings.database_url,
        api_token="sim-token",
        webhook_token="another-process-hook",
        status_token=STATUS_TOKEN,
    )
    other = bootstrap.build(
        other_settings,
        datasets=services.datasets,
        redis=services.redis,
        budget=MemoryApiBudget(limit=services.settings.api_budget_limit),
    )
    try:
        second = create_app(other).test_client().get(f"/metrics?token={STATUS_TOKEN}")
        assert second.status_code == 200
        theirs = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(second.get_data(as_text=True))
            for s in family.samples
            if not s.name.startswith("scrapesync_api_budget")
            and not s.name.endswith("_age_seconds")
        }
        ours = {key: v for key, v in scrape().items() if key in theirs}
        assert ours == theirs
        assert theirs[("scrapesync_notifications_received_total", ())] == 1
        assert theirs[("scrapesync_runs", (("state", "published"),))] == 1
    finally:
        other.uow.engine.dispose()


def test_a_lease_a_worker_holds_shows_its_age_and_a_running_attempt(
    services: Services, cloud: CloudState
) -> None:
    """A worker took a task's lease and has not ended its attempt (working, or SIGKILLed): the
    task counts as leased, its attempt as running, and the lease ages as the clock moves on."""
    job_id = finished_job(cloud)
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        lease = store.claim(
            session, wish.task_key, owner="worker.1", lease_seconds=600, now=services.clock()
        )
        session.commit()
    assert lease is not None
    held = scraped(guarded_app(at_time(services, services.clock() + timedelta(seconds=90))))
    assert value(held, "scrapesync_tasks", state="leased") == 1
    assert value(held, "scrapesync_attempts_running") == 1
    assert value(held, "scrapesync_oldest_lease_age_seconds") >= 90
