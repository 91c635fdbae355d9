"""Reconcile: lost notifications, changed jobs, stuck tasks, unevaluated runs and undelivered
events are found by asking Cloud, and a second pass right after does nothing."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from redis import Redis
from sqlalchemy import func, select

from simulator import CloudState, generate_records
from simulator import create_app as create_simulator
from sync import bootstrap, jobs
from sync.bootstrap import Services
from sync.cloud.budget import MemoryApiBudget
from sync.cloud.client import CloudClient
from sync.ingest import store, tasks
from sync.models import (
    Attempt,
    Launch,
    MaintenanceRun,
    Observation,
    OutboxEvent,
    Run,
    SyncTask,
)
from sync.operations import reconcile
from sync.operations.reconcile import Wanted
from sync.queue import RecordingDispatcher, RQDispatcher
from sync.runs import due
from tests.harness import API_TOKEN, DATASETS_TOML, datasets_from, drain, notify, products_sitemap

pytestmark = pytest.mark.redis


def _finished_job(cloud: CloudState, n: int = 30, **job: Any) -> int:
    job_id = cloud.create_job(products_sitemap(cloud), **job)
    cloud.set_generated(job_id, n)
    cloud.run_job(job_id)
    return job_id


def _snapshot(services: Services) -> dict[str, Any]:
    """Everything a pass could change, as plain values (maintenance rows aside)."""
    with services.uow.begin() as session:

        def rows(model: Any, *order: Any) -> list[dict[str, Any]]:
            """A table's rows in a stable order."""
            table = model.__table__
            return [dict(r) for r in session.execute(select(table).order_by(*order)).mappings()]

        return {
            "tasks": rows(SyncTask, SyncTask.task_key),
            "attempts": rows(Attempt, Attempt.attempt_id),
            "observations": rows(Observation, Observation.observation_key),
            "runs": rows(Run, Run.run_id),
            "outbox": rows(OutboxEvent, OutboxEvent.event_id),
            "launches": rows(Launch, Launch.batch_id),
        }


def _state_of(services: Services, run_id: str) -> str:
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        return run.state


def _observations(services: Services) -> int:
    with services.uow.begin() as session:
        return store.count_rows(session, Observation)


def _due(services: Services) -> list[str]:
    """The runs due for evaluation, the list a pass judges."""
    with services.uow.begin() as session:
        return due.runs_due_for_evaluation(session)


def test_a_job_whose_notifications_were_all_lost_is_found_and_a_second_pass_does_nothing(
    services: Services, cloud: CloudState
) -> None:
    """No notification ever arrived: reconcile wants the sync, the data arrives and is
    published; a second reconcile right after changes nothing at all."""
    job_id = _finished_job(cloud, n=30)
    assert cloud.notifications_sent == []
    first = reconcile.reconcile(services)
    assert first.wanted == [Wanted(job_id, "never synced")]
    assert first.enqueued == 1
    assert first.complete
    drain(services)
    assert _observations(services) == 30
    with services.uow.begin() as session:
        (run_id,) = session.execute(select(Run.run_id)).scalars()
    assert _state_of(services, run_id) == "published"
    before = _snapshot(services)
    result = CliRunner().invoke(bootstrap_cli(), ["reconcile", "--json"])
    assert result.exit_code == 0, result.output
    second = json.loads(result.output)
    assert second["did_anything"] is False
    assert (second["wanted"], second["enqueued"], second["tasks_requeued"]) == ([], 0, 0)
    assert (second["runs_evaluated"], second["outbox_redriven"]) == ([], 0)
    assert (second["unchanged"], second["in_range"]) == (1, 1)
    assert _snapshot(services) == before
    assert isinstance(services.dispatcher, RQDispatcher)
    assert services.dispatcher.queue.count == 0
    with services.uow.begin() as session:
        passes = session.execute(
            select(MaintenanceRun.summary)
            .where(MaintenanceRun.kind == "reconcile")
            .order_by(MaintenanceRun.id)
        ).scalars()
        assert [(s["state"], len(s["wanted"])) for s in passes] == [("done", 1), ("done", 0)]


def bootstrap_cli() -> Any:
    """The ``scrapesync`` command group (services come from bootstrap.use)."""
    from scrapesync.cli import main

    return main


def test_a_job_that_changed_since_its_sync_is_synced_again(
    services: Services, cloud: CloudState
) -> None:
    """Cloud's "Continue" without a notification: new counters make a new sync generation."""
    job_id = _finished_job(cloud, n=30)
    reconcile.reconcile(services)
    drain(services)
    cloud.continue_job(job_id, extra_records=generate_records(12, start=30))
    cloud.finish_job(job_id)
    report = reconcile.reconcile(services)
    assert report.wanted == [Wanted(job_id, "changed since")]
    drain(services)
    assert _observations(services) == 42
    with services.uow.begin() as session:
        task = session.scalars(select(SyncTask).where(SyncTask.task_key == f"job-{job_id}")).one()
        assert (task.state, task.synced_generation) == ("committed", 2)
    assert not reconcile.reconcile(services).did_anything


def test_running_foreign_and_old_jobs_are_left_alone(services: Services, cloud: CloudState) -> None:
    """Jobs still scraping, jobs of sitemaps no dataset reads and jobs older than --since are
    counted, never synced."""
    running = cloud.create_job(products_sitemap(cloud))
    cloud.start_job(running)
    foreign_sitemap = cloud.add_sitemap("someone-elses")
    foreign = cloud.create_job(foreign_sitemap)
    cloud.run_job(foreign, n=3)
    old = _finished_job(cloud, n=5)
    cloud.job(old).time_created = int(time.time() - 8 * 86400)
    report = reconcile.reconcile(services, since=timedelta(days=7))
    assert (report.listed, report.in_range) == (3, 2)
    assert (report.running, report.ignored, report.wanted) == (1, 1, [])
    wider = reconcile.reconcile(services, since=timedelta(days=9))
    assert wider.wanted == [Wanted(old, "never synced")]


def test_a_task_waiting_for_its_job_to_finish_is_woken_when_cloud_says_it_finished(
    services: Services, cloud: CloudState
) -> None:
    """A sync that found the job still running waits minutes; reconcile sees it finished."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.set_generated(job_id, 10)
    cloud.start_job(job_id)
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    assert tasks.run_sync(services, wish.task_key).state == "retry_wait"
    cloud.finish_job(job_id)
    report = reconcile.reconcile(services)
    assert report.wanted == [Wanted(job_id, "finished since")]
    drain(services)
    assert _observations(services) == 10


def test_a_task_whose_rq_job_vanished_is_queued_again(
    web: Any, services: Services, cloud: CloudState, redis_conn: Redis
) -> None:
    """Redis lost the queued sync: the task is in flight in SQL, and the pass re-queues it."""
    job_id = _finished_job(cloud, n=8)
    assert notify(web, job_id).status_code == 200
    redis_conn.flushdb()
    report = reconcile.reconcile(services)
    assert (report.in_flight, report.wanted) == (1, [])
    assert (report.tasks_due, report.tasks_requeued) == (1, 1)
    drain(services)
    assert _observations(services) == 8


def test_an_uncertain_launch_is_linked_to_the_job_cloud_lists(
    services: Services, cloud: CloudState
) -> None:
    """A launch left uncertain is settled by a pass that sees its custom_id on a Cloud job."""
    with services.uow.begin() as session:
        session.add(Run(run_id="products-2026-12-02", dataset="products", collection_window="x"))
        session.flush()
        session.add(
            Launch(
                batch_id="products-2026-12-02",
                run_id="products-2026-12-02",
                kind="launch",
                state="uncertain",
            )
        )
        session.commit()
    job_id = cloud.create_job(products_sitemap(cloud), custom_id="products-2026-12-02")
    cloud.start_job(job_id)
    report = reconcile.reconcile(services)
    assert report.launches_linked == ["products-2026-12-02"]
    with services.uow.begin() as session:
        launch = session.get(Launch, "products-2026-12-02")
        assert launch is not None
        assert (launch.state, launch.job_id) == ("created", job_id)
    assert reconcile.reconcile(services).launches_linked == []


def _cloud_with(
    services: Services,
    cloud: CloudState,
    budget: MemoryApiBudget,
    transport: httpx.BaseTransport | None = None,
) -> Services:
    app = create_simulator(cloud)

    def client() -> CloudClient:
        """A Cloud client on the in-process simulator with this budget."""
        return CloudClient(
            token=API_TOKEN,
            base_url="http://cloud.test/api/v1/",
            transport=transport or httpx.WSGITransport(app=app),
            budget=budget,
            retry=bootstrap.worker_retry_policy(),
            sleep=lambda _: None,
        )

    return dataclasses.replace(services, cloud=client)


def test_a_rate_limited_listing_waits_as_cloud_asks_and_lists_again(
    services: Services, cloud: CloudState
) -> None:
    """A 429 with Retry-After 7 s: the pass sleeps that (plus a margin) and completes."""
    job_id = _finished_job(cloud, n=4)
    cloud.inject_fault("rate_limit", path_contains="scraping-jobs", retry_after=7)
    now = [time.time()]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        """Sleep by moving the budget's clock."""
        slept.append(seconds)
        now[0] += seconds

    budget = MemoryApiBudget(limit=1000, window=900.0, clock=lambda: now[0])
    report = reconcile.reconcile(_cloud_with(services, cloud, budget), sleep=sleep)
    assert slept == [9.0]  # Retry-After 7, the client's 1 s margin, and one more second
    assert report.complete
    assert report.wanted == [Wanted(job_id, "never synced")]


def test_a_spent_api_budget_ends_the_listing_early_and_says_so(
    services: Services, cloud: CloudState
) -> None:
    """Past the longest wait allowed, the pass stops, reports an incomplete listing, and
    still does its other work."""
    _finished_job(cloud, n=4)
    spent = MemoryApiBudget(limit=0, window=900.0)
    report = reconcile.reconcile(_cloud_with(services, cloud, spent), max_wait=60.0)
    assert not report.complete
    assert "API budget" in (report.listing_error or "")
    assert (report.listed, report.wanted, report.waited_seconds) == (0, [], 0.0)


def test_a_dry_run_reports_and_writes_nothing(services: Services, cloud: CloudState) -> None:
    """--dry-run: the same findings, no task, no queued job, no maintenance row."""
    job_id = _finished_job(cloud, n=4)
    result = CliRunner().invoke(bootstrap_cli(), ["reconcile", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["wanted"] == [{"job_id": job_id, "reason": "never synced"}]
    assert report["dry_run"] is True
    with services.uow.begin() as session:
        assert store.count_rows(session, SyncTask) == 0
        assert store.count_rows(session, MaintenanceRun) == 0
    assert isinstance(services.dispatcher, RQDispatcher)
    assert services.dispatcher.queue.count == 0


def test_a_run_whose_evaluation_was_lost_is_evaluated_once(
    services: Services, cloud: CloudState
) -> None:
    """The sync committed but its evaluation job vanished: the pass evaluates the run (all its
    tasks are committed) and publishes it; the next pass leaves it alone."""
    job_id = _finished_job(cloud, n=6)
    lost = dataclasses.replace(services, dispatcher=RecordingDispatcher())
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    result = tasks.run_sync(lost, wish.task_key)
    assert result.outcome == "committed"
    assert result.run_id is not None
    assert _state_of(services, result.run_id) == "collecting"
    report = reconcile.reconcile(services)
    assert report.runs_evaluated == [result.run_id]
    assert _state_of(services, result.run_id) == "published"
    assert reconcile.reconcile(services).runs_evaluated == []


def test_a_run_with_a_task_not_yet_committed_is_not_evaluated(
    services: Services, cloud: CloudState
) -> None:
    """One job of the run committed, another still waits: the run is not judged yet."""
    first = _finished_job(cloud, n=6)
    second = _finished_job(cloud, n=6)
    lost = dataclasses.replace(services, dispatcher=RecordingDispatcher())
    with services.uow.begin() as session:
        wishes = [store.want_sync(session, j, now=services.clock()) for j in (first, second)]
        session.commit()
    tasks.run_sync(lost, wishes[0].task_key)
    with services.uow.begin() as session:  # the second task commits into the same run later
        session.execute(
            SyncTask.__table__.update()
            .where(SyncTask.task_key == wishes[1].task_key)
            .values(run_id=session.execute(select(func.max(Run.run_id))).scalar_one())
        )
        session.commit()
    assert _due(services) == []


def test_an_event_whose_delivery_was_lost_is_delivered_by_the_pass(
    services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """The published event's delivery job vanished: the pass relays it to its destination."""
    folder = tmp_path / "drop"
    toml = DATASETS_TOML + f'\n[[datasets.products.destinations]]\npath = "{folder}"\n'
    with_files = dataclasses.replace(
        services, datasets=datasets_from(toml), dispatcher=RecordingDispatcher()
    )
    bootstrap.use(with_files)
    job_id = _finished_job(cloud, n=6)
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    result = tasks.run_sync(with_files, wish.task_key)
    assert result.run_id is not None
    first = reconcile.reconcile(with_files)
    assert first.runs_evaluated == [result.run_id]
    assert first.outbox_redriven >= 1
    with services.uow.begin() as session:
        states = set(session.execute(select(OutboxEvent.state)).scalars())
    assert states == {"delivered"}
    assert list((folder / "events").glob("*.json"))
    again = reconcile.reconcile(with_files)
    assert (again.outbox_redriven, again.did_anything) == (0, False)


def test_the_worker_schedules_a_reconcile_once_per_interval(
    services: Services, cloud: CloudState
) -> None:
    """maintain() queues `sync.jobs.reconcile` when none ran within reconcile_interval."""
    job_id = _finished_job(cloud, n=5)
    dispatcher = services.dispatcher
    assert isinstance(dispatcher, RQDispatcher)
    jobs.maintain()
    assert [j for j in dispatcher.queue.job_ids if j.startswith("reconcile-")]
    drain(services)
    assert _observations(services) == 5, f"job {job_id} was found by the scheduled pass"
    jobs.maintain()
    assert not [j for j in dispatcher.queue.job_ids if j.startswith("reconcile-")]
    with services.uow.begin() as session:
        assert store.count_rows(session, MaintenanceRun, MaintenanceRun.kind == "reconcile") == 1


def test_the_command_prints_one_line_in_a_pipe_and_a_progress_bar_on_a_terminal(
    services: Services, cloud: CloudState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Piped: exactly one summary line. On a terminal: a progress bar over the jobs checked."""
    for _ in range(3):
        _finished_job(cloud, n=2)
    piped = CliRunner().invoke(bootstrap_cli(), ["reconcile", "--dry-run"])
    assert piped.exit_code == 0, piped.output
    assert piped.output.count("\n") == 1
    assert piped.output.startswith("reconcile: 3 Cloud jobs listed, 3 in range; would want 3")
    monkeypatch.setattr("scrapesync.commands._interactive", lambda: True)
    seen = CliRunner().invoke(bootstrap_cli(), ["reconcile", "--dry-run"])
    assert "checking Cloud jobs" in seen.output
    assert "never synced" in seen.output


def test_a_task_cloud_refused_is_reported_not_revived(
    services: Services, cloud: CloudState
) -> None:
    """A sync quarantined by a 403 has no data: the pass names the job for an operator and
    leaves the task as it is, pass after pass."""
    job_id = _finished_job(cloud, n=3)
    cloud.inject_fault("status", path_contains=f"scraping-job/{job_id}", status=403)
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    assert tasks.run_sync(services, wish.task_key).state == "quarantined"
    before = _snapshot(services)
    for _ in range(2):
        report = reconcile.reconcile(services)
        assert (report.needs_attention, report.wanted, report.did_anything) == ([job_id], [], False)
        assert f"needs attention: jobs {job_id}" in report.summary_line()
    assert _snapshot(services) == before


def test_a_launched_job_that_has_not_reported_back_holds_its_run_open(
    services: Services, cloud: CloudState
) -> None:
    """Another job of the run committed, but the launched job is still scraping: the run is
    not judged until that job's sync commits too."""
    from sync.runs import launch

    launched = launch.launch(services, "products")
    assert launched.job_id is not None
    other = _finished_job(cloud, n=4, custom_id=launched.run_id)
    lost = dataclasses.replace(services, dispatcher=RecordingDispatcher())
    with services.uow.begin() as session:
        wish = store.want_sync(session, other, now=services.clock())
        session.commit()
    assert tasks.run_sync(lost, wish.task_key).run_id == launched.run_id
    assert _due(services) == []
    cloud.set_generated(launched.job_id, 5)
    cloud.run_job(launched.job_id)
    with services.uow.begin() as session:
        wish = store.want_sync(session, launched.job_id, now=services.clock())
        session.commit()
    tasks.run_sync(lost, wish.task_key)
    assert _due(services) == [launched.run_id]


def test_since_takes_days_hours_minutes_or_seconds() -> None:
    """--since 7d, 12h, 30m, 90s or a bare number of seconds; nonsense is refused."""
    assert reconcile.parse_since("7d") == timedelta(days=7)
    assert reconcile.parse_since("12h") == timedelta(hours=12)
    assert reconcile.parse_since("30m") == timedelta(minutes=30)
    assert reconcile.parse_since("90s") == reconcile.parse_since("90") == timedelta(seconds=90)
    for bad in ("", "d", "-1d", "soon"):
        with pytest.raises(ValueError, match="--since"):
            reconcile.parse_since(bad)


def test_without_redis_the_command_syncs_evaluates_and_delivers_in_the_foreground(
    services: Services, cloud: CloudState
) -> None:
    """No Redis means no worker: `scrapesync reconcile` itself runs the syncs it wants, then
    judges and publishes the run, in one pass."""
    bootstrap.use(dataclasses.replace(services, dispatcher=RecordingDispatcher()))
    job_id = _finished_job(cloud, n=7)
    result = CliRunner().invoke(bootstrap_cli(), ["reconcile", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["wanted"] == [{"job_id": job_id, "reason": "never synced"}]
    assert _observations(services) == 7
    (run_id,) = report["runs_evaluated"]
    assert _state_of(services, run_id) == "published"


class PageTwoLimitedOnce(httpx.BaseTransport):
    """Cloud answering 429 to the first request for page 2 of the job list."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.pages: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Record the page asked for; refuse page 2 once."""
        if request.url.path.endswith("/scraping-jobs"):
            page = request.url.params.get("page", "")
            self.pages.append(page)
            if page == "2" and self.pages.count("2") == 1:
                return httpx.Response(
                    429,
                    headers={"Retry-After": "30"},  # longer than a worker waits inline
                    json={"success": False, "error": "Too Many Attempts."},
                )
        return self.inner.handle_request(request)


def test_a_listing_cut_by_a_429_resumes_at_the_page_it_stopped(
    services: Services, cloud: CloudState
) -> None:
    """After waiting out a 429 on page 2, the pass asks for page 2 again, not page 1: pages
    already read cost no more API calls."""
    sitemap = products_sitemap(cloud)
    for _ in range(250):
        cloud.create_job(sitemap)
    now = [time.time()]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        """Sleep by moving the budget's clock."""
        slept.append(seconds)
        now[0] += seconds

    transport = PageTwoLimitedOnce(httpx.WSGITransport(app=create_simulator(cloud)))
    budget = MemoryApiBudget(limit=1000, window=900.0, clock=lambda: now[0])
    report = reconcile.reconcile(
        _cloud_with(services, cloud, budget, transport=transport), sleep=sleep
    )
    assert report.complete
    assert slept == [32.0]  # the pass itself waited, then went on
    assert transport.pages == ["1", "2", "2", "3"]
    assert report.listed == 250
