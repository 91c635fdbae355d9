"""Launching a run: the intent first, one Cloud job per launch, even when a create times out."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from scrapesync.cli import main
from simulator import CloudState, SimServer
from simulator import create_app as create_simulator
from sync.bootstrap import Services, worker_retry_policy
from sync.cloud.client import CloudClient
from sync.models import Launch, Run
from sync.runs import launch
from tests.harness import API_TOKEN, datasets_from, products_sitemap

WINDOW = "2026-12-02"
RUN_ID = f"products-{WINDOW}"


def _launch_row(services: Services, batch_id: str = RUN_ID) -> SimpleNamespace:
    with services.uow.begin() as session:
        row = (
            session.execute(select(Launch.__table__).where(Launch.batch_id == batch_id))
            .mappings()
            .one()
        )
        return SimpleNamespace(**row)


def _jobs_for(cloud: CloudState, custom_id: str) -> list[int]:
    return [job.id for job in cloud.jobs.values() if job.custom_id == custom_id]


def _on_loopback(services: Services, url: str, *, timeout: float) -> Services:
    """The same services, talking to Cloud over a real socket with a short timeout."""

    def cloud() -> CloudClient:
        """A Cloud client over the socket."""
        return CloudClient(
            token=API_TOKEN,
            base_url=url,
            budget=services.budget,
            retry=worker_retry_policy(),
            timeout=timeout,
        )

    return dataclasses.replace(services, cloud=cloud)


def test_launch_creates_the_run_and_one_job_that_carries_the_run_id(
    services: Services, cloud: CloudState
) -> None:
    """`scrapesync launch products --window W`: a run, a created launch, one job with custom_id."""
    result = CliRunner().invoke(main, ["launch", "products", "--window", WINDOW])
    assert result.exit_code == 0, result.output
    (job_id,) = _jobs_for(cloud, RUN_ID)
    assert f"run {RUN_ID}: Cloud job {job_id} (created)\n" in result.output
    again = CliRunner().invoke(main, ["launch", "products", "--window", WINDOW])
    assert f"run {RUN_ID}: Cloud job {job_id} (created: already launched)\n" in again.output
    assert cloud.job(job_id).sitemap_id == products_sitemap(cloud)
    row = _launch_row(services)
    assert (row.run_id, row.kind, row.state, row.job_id) == (RUN_ID, "launch", "created", job_id)
    with services.uow.begin() as session:
        run = session.get(Run, RUN_ID)
        assert run is not None
        assert (run.dataset, run.collection_window, run.state) == ("products", WINDOW, "collecting")
        assert run.sitemap_id == products_sitemap(cloud)


def test_launching_the_same_window_again_makes_no_second_job(
    services: Services, cloud: CloudState
) -> None:
    """The same dataset and window give the same run id and the job already launched."""
    first = launch.launch(services, "products", window=WINDOW)
    calls = list(cloud.requests)
    again = launch.launch(services, "products", window=WINDOW)
    assert (again.run_id, again.job_id, again.state) == (first.run_id, first.job_id, "created")
    assert (first.created_job, again.created_job) == (True, False)
    assert _jobs_for(cloud, RUN_ID) == [first.job_id]
    assert cloud.requests == calls  # nothing asked of Cloud the second time


def test_start_urls_given_at_launch_go_to_that_job_only(
    services: Services, cloud: CloudState
) -> None:
    """--start-url overrides the sitemap's start URLs for this one job."""
    result = CliRunner().invoke(
        main,
        ["launch", "products", "--window", WINDOW, "--start-url", "https://beta.example/sale"],
    )
    assert result.exit_code == 0, result.output
    (job_id,) = _jobs_for(cloud, RUN_ID)
    assert cloud.job(job_id).start_urls == ["https://beta.example/sale"]
    assert cloud.sitemap(products_sitemap(cloud)).start_urls == ["https://alpha.example/"]


@pytest.mark.slow
def test_a_create_that_times_out_after_cloud_made_the_job_leaves_exactly_one_job(
    services: Services, cloud: CloudState, sim: SimServer
) -> None:
    """Cloud creates the job but answers too late: the launch finds that job, never a second."""
    cloud.inject_fault("create_then_slow", seconds=1.5)
    slow = _on_loopback(services, sim.api_url, timeout=0.3)
    outcome = launch.launch(slow, "products", window=WINDOW)
    (job_id,) = _jobs_for(cloud, RUN_ID)
    assert (outcome.state, outcome.job_id, outcome.found_existing) == ("created", job_id, True)
    assert [m for m, p in cloud.requests if p.endswith("/scraping-job")] == ["POST"]
    assert _launch_row(services).job_id == job_id
    again = launch.launch(slow, "products", window=WINDOW)
    assert again.job_id == job_id
    assert len(cloud.jobs) == 1


def test_after_an_uncertain_create_the_next_launch_looks_before_it_creates(
    services: Services, cloud: CloudState
) -> None:
    """A 503 on create may hide a job: the launch stays uncertain; the next one lists the
    sitemap's jobs for the custom_id first and creates only because there is none."""
    cloud.inject_fault("status", path_contains="scraping-job", status=503, method="POST")
    result = CliRunner().invoke(main, ["launch", "products", "--window", WINDOW])
    assert result.exit_code == 1
    assert "may or may not have created the job" in result.output
    assert _launch_row(services).state == "uncertain"
    assert cloud.jobs == {}
    cloud.requests.clear()
    outcome = launch.launch(services, "products", window=WINDOW)
    assert (outcome.state, outcome.created_job, outcome.found_existing) == ("created", True, False)
    methods = [(m, p.rsplit("/", 1)[-1]) for m, p in cloud.requests]
    assert methods == [("GET", "scraping-jobs"), ("POST", "scraping-job")]
    assert _jobs_for(cloud, RUN_ID) == [outcome.job_id]


def test_an_uncertain_launch_whose_job_exists_is_settled_without_creating(
    services: Services, cloud: CloudState
) -> None:
    """The earlier create did make the job: the next launch finds it and creates nothing."""
    with services.uow.begin() as session:
        session.add(Run(run_id=RUN_ID, dataset="products", collection_window=WINDOW, reasons=[]))
        session.flush()
        session.add(Launch(batch_id=RUN_ID, run_id=RUN_ID, kind="launch", state="uncertain"))
        session.commit()
    job_id = cloud.create_job(products_sitemap(cloud), custom_id=RUN_ID)
    outcome = launch.launch(services, "products", window=WINDOW)
    assert (outcome.state, outcome.job_id, outcome.found_existing) == ("created", job_id, True)
    assert outcome.created_job is False
    assert len(cloud.jobs) == 1


def test_a_refused_create_fails_and_a_later_launch_creates_without_looking(
    services: Services, cloud: CloudState
) -> None:
    """A 403 means Cloud made nothing: the launch is failed, and trying again simply creates."""
    cloud.inject_fault("status", path_contains="scraping-job", status=403, method="POST")
    with pytest.raises(launch.LaunchError, match="Cloud refused the job"):
        launch.launch(services, "products", window=WINDOW)
    assert _launch_row(services).state == "failed"
    cloud.requests.clear()
    outcome = launch.launch(services, "products", window=WINDOW)
    assert outcome.state == "created"
    assert [m for m, _ in cloud.requests] == ["POST"]


def test_the_intent_is_stored_before_cloud_is_asked(services: Services, cloud: CloudState) -> None:
    """At the moment Cloud receives the create, the launch row already says `creating`."""
    seen: list[tuple[str, str]] = []
    inner = httpx.WSGITransport(app=create_simulator(cloud))

    class Watching(httpx.BaseTransport):
        """Reads the launches table whenever a create goes out."""

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            """Note the launch row's state when a create goes out, then pass it on."""
            if request.method == "POST" and request.url.path.endswith("/scraping-job"):
                row = _launch_row(services)
                seen.append((row.state, row.kind))
            return inner.handle_request(request)

    def cloud_client() -> CloudClient:
        """A Cloud client whose transport watches creates."""
        return CloudClient(
            token=API_TOKEN, base_url="http://cloud.test/api/v1/", transport=Watching()
        )

    launch.launch(dataclasses.replace(services, cloud=cloud_client), "products", window=WINDOW)
    assert seen == [("creating", "launch")]


def test_a_launch_another_process_is_creating_is_left_alone(
    services: Services, cloud: CloudState
) -> None:
    """A fresh `creating` launch belongs to someone else: no call, no second job."""
    with services.uow.begin() as session:
        session.add(Run(run_id=RUN_ID, dataset="products", collection_window=WINDOW, reasons=[]))
        session.flush()
        session.add(
            Launch(
                batch_id=RUN_ID,
                run_id=RUN_ID,
                kind="launch",
                state="creating",
                created_at=services.clock(),
                updated_at=services.clock(),
            )
        )
        session.commit()
    outcome = launch.launch(services, "products", window=WINDOW)
    assert outcome.state == "creating"
    assert "another process" in outcome.message
    assert cloud.jobs == {}
    assert not [p for _, p in cloud.requests if "scraping-job" in p]


def test_the_sitemap_comes_from_sitemap_id_or_is_found_by_name(
    services: Services, cloud: CloudState
) -> None:
    """sitemap_id is used as it is; a sitemap name is looked up; an unknown name is an error."""
    other = cloud.add_sitemap("catalogue")
    by_id = dataclasses.replace(
        services,
        datasets=datasets_from(
            f'[datasets.catalogue]\nsitemap_id = {other}\nentity_key = ["sku"]\n'
        ),
    )
    outcome = launch.launch(by_id, "catalogue", window=WINDOW)
    assert cloud.job(outcome.job_id or 0).sitemap_id == other
    assert not [p for _, p in cloud.requests if p.endswith("/sitemaps")]
    by_name = launch.launch(services, "products", window=WINDOW)
    assert cloud.job(by_name.job_id or 0).sitemap_id == products_sitemap(cloud)
    assert [p for _, p in cloud.requests if p.endswith("/sitemaps")]
    missing = dataclasses.replace(
        services,
        datasets=datasets_from('[datasets.gone]\nsitemap = "nowhere"\nentity_key = ["sku"]\n'),
    )
    with pytest.raises(launch.LaunchError, match="no sitemap named 'nowhere'"):
        launch.launch(missing, "gone", window=WINDOW)


def test_a_window_that_is_not_spelled_like_the_datasets_windows_is_refused(
    services: Services, cloud: CloudState
) -> None:
    """A daily dataset takes YYYY-MM-DD; anything else stops before a run exists."""
    result = CliRunner().invoke(main, ["launch", "products", "--window", "2026/12/02"])
    assert result.exit_code == 1
    assert "must look like YYYY-MM-DD" in result.output
    assert cloud.jobs == {}
    with services.uow.begin() as session:
        assert session.execute(select(Run)).first() is None
