"""The client against the Cloud simulator: in-process through WSGITransport and over loopback."""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from simulator import CloudState, create_app, serve
from sync.cloud.budget import MemoryApiBudget
from sync.cloud.client import CloudClient
from sync.cloud.errors import (
    ApiBudgetExhaustedError,
    CloudAuthError,
    CloudNotFoundError,
    CloudRateLimitedError,
    CloudTransportError,
    CloudValidationError,
    DownloadIncompleteError,
)
from sync.cloud.jobs import ProblematicUrl
from sync.cloud.policy import RetryPolicy
from tests.cloud.conftest import FakeClock

SIM_TOKEN = "sim-token"
SIM_BASE = "http://cloud.sim/api/v1/"
PRODUCTS = [
    {"sku": "A1", "title": "Lamp", "url": "https://shop.example/a1", "price": "10.00"},
    {"sku": "B2", "title": "Desk", "url": "https://shop.example/b2", "price": "99.90"},
    {"sku": "C3", "title": 'Chair "Pro"', "url": "https://shop.example/c3", "price": "45.50"},
]

ClientFactory = Callable[..., CloudClient]


@pytest.fixture
def state(clock: FakeClock) -> Iterator[CloudState]:
    """A simulated Cloud account on the fake clock."""
    with CloudState(api_token=SIM_TOKEN, clock=clock) as cloud:
        yield cloud


@pytest.fixture
def sim_client(state: CloudState, clock: FakeClock) -> Iterator[ClientFactory]:
    """Build clients that talk to the simulator in-process, on the fake clock."""
    clients: list[CloudClient] = []

    def build(**options: Any) -> CloudClient:
        options.setdefault("retry", RetryPolicy(random=lambda: 0.5))
        options.setdefault("token", SIM_TOKEN)
        client = CloudClient(
            base_url=SIM_BASE,
            transport=httpx.WSGITransport(app=create_app(state)),
            sleep=clock.sleep,
            clock=clock,
            **options,
        )
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


def _finished_job(state: CloudState, records: list[dict[str, Any]] = PRODUCTS) -> int:
    sitemap_id = state.add_sitemap("products", start_urls=["https://shop.example/"])
    job_id = state.create_job(sitemap_id)
    state.run_job(job_id, records=records)
    return job_id


def test_a_job_created_by_the_client_is_read_back(
    state: CloudState, sim_client: ClientFactory
) -> None:
    """create_job, get_job, the records in JSON Lines, and data quality agree."""
    client = sim_client()
    sitemap_id = state.add_sitemap("products", start_urls=["https://shop.example/"])
    job_id = client.create_job(sitemap_id=sitemap_id, custom_id="run-1", driver="fast")
    job = client.get_job(job_id)
    assert (job.id, job.sitemap_id, job.custom_id, job.status) == (
        job_id,
        sitemap_id,
        "run-1",
        "waiting-to-be-scheduled",
    )
    assert job.is_running
    with pytest.raises(CloudValidationError) as early:
        client.get_data_quality(job_id)
    assert "scraping_job_id" in early.value.validation_errors

    state.run_job(job_id, records=PRODUCTS)
    job = client.get_job(job_id)
    assert job.is_terminal
    assert job.stored_record_count == 3
    records = list(client.iter_records(job_id))
    assert [{k: r[k] for k in PRODUCTS[0]} for r in records] == PRODUCTS
    assert records[0]["web-scraper-start-url"] == "https://shop.example/"
    assert isinstance(client.get_data_quality(job_id)["overall_data_quality_success"], bool)
    assert client.get_sitemap(sitemap_id)["name"] == "products"
    assert [s["id"] for s in client.iter_sitemaps()] == [sitemap_id]
    assert client.get_account()["page_credits"] > 0


def test_paging_through_250_jobs_and_250_problematic_urls(
    state: CloudState, sim_client: ClientFactory
) -> None:
    """Listings read every page the simulator serves (100 a page)."""
    client = sim_client()
    sitemap_id = state.add_sitemap("products")
    job_ids = [state.create_job(sitemap_id) for _ in range(250)]
    problems = [{"url": f"https://shop.example/p{i}", "type": "empty"} for i in range(250)]
    state.run_job(job_ids[0], records=PRODUCTS, problematic_urls=problems)

    listed = list(client.iter_jobs(sitemap_id=sitemap_id))
    assert sorted(j.id for j in listed) == sorted(job_ids)
    urls = list(client.iter_problematic_urls(job_ids[0]))
    assert len(urls) == 250
    assert ProblematicUrl(url="https://shop.example/p249", type="empty") in urls


def test_wrong_token_and_unknown_job(state: CloudState, sim_client: ClientFactory) -> None:
    """A bad token is an auth error, an unknown job is not found; neither is retried."""
    with pytest.raises(CloudAuthError):
        sim_client(token="wrong-token").get_account()
    calls_before = len(state.requests)
    with pytest.raises(CloudNotFoundError):
        sim_client().get_job(999_999)
    assert len(state.requests) == calls_before + 1


@pytest.mark.parametrize("kind", ["status", "reset"])
def test_server_errors_and_resets_are_retried(
    state: CloudState, sim_client: ClientFactory, clock: FakeClock, kind: str
) -> None:
    """A 500 or a dropped connection twice in a row is retried until Cloud answers."""
    job_id = _finished_job(state)
    state.inject_fault(kind, path_contains=f"scraping-job/{job_id}", times=2, status=500)
    assert sim_client().get_job(job_id).id == job_id
    assert len(clock.sleeps) == 2


@pytest.mark.parametrize("fmt", ["seconds", "http-date"])
def test_simulated_429_waits_for_retry_after(
    state: CloudState, sim_client: ClientFactory, clock: FakeClock, fmt: str
) -> None:
    """The simulator's 429 (Retry-After in seconds or as an HTTP-date) is waited out once."""
    state.retry_after_format = fmt
    job_id = _finished_job(state)
    state.inject_fault("rate_limit", path_contains="scraping-job", retry_after=3)
    assert sim_client().get_job(job_id).id == job_id
    assert clock.sleeps == [4.0]


def test_a_429_spends_the_budget_until_clouds_reset(
    state: CloudState, sim_client: ClientFactory, clock: FakeClock
) -> None:
    """Cloud's 429 empties the shared budget until its reset; the retry then gets through."""
    job_id = _finished_job(state)
    budget = MemoryApiBudget(limit=200, clock=clock)
    client = sim_client(budget=budget)
    state.inject_fault("rate_limit", path_contains="scraping-job", retry_after=3)
    assert client.get_job(job_id).id == job_id
    assert clock.sleeps == [4.0]
    assert budget.remaining() == 199
    state.inject_fault("rate_limit", path_contains="scraping-job", retry_after=3)
    other_process = sim_client(budget=budget, retry=RetryPolicy(max_inline_wait=0.0))
    with pytest.raises(CloudRateLimitedError):
        other_process.get_job(job_id)
    sent = len(state.requests)
    assert client.get_job(job_id).id == job_id  # waits out the other process's 429 locally
    assert clock.sleeps == [4.0, 3.0]
    assert len(state.requests) == sent + 1


def test_clouds_remaining_calls_drive_the_shared_budget(
    state: CloudState, sim_client: ClientFactory, clock: FakeClock
) -> None:
    """When Cloud reports its limit spent, the next call is stopped locally, not sent."""
    state.rate_limit = 3
    budget = MemoryApiBudget(limit=200, clock=clock)
    client = sim_client(budget=budget)
    client.get_account()
    assert budget.remaining() == 2
    client.get_account()
    client.get_account()
    assert budget.remaining() == 0
    sent = len(state.requests)
    with pytest.raises(ApiBudgetExhaustedError) as caught:
        client.get_account()
    assert len(state.requests) == sent
    assert caught.value.retry_after is not None
    assert 0 < caught.value.retry_after <= 900.0


def test_a_cut_download_raises_in_process(state: CloudState, sim_client: ClientFactory) -> None:
    """A download dropped after some records raises DownloadIncompleteError, not a short list."""
    job_id = _finished_job(state)
    state.set_generated(job_id, 5000)
    state.inject_fault("cut", path_contains=f"scraping-job/{job_id}/json", after_bytes=20_000)
    seen: list[dict[str, Any]] = []
    with pytest.raises(DownloadIncompleteError):
        seen.extend(sim_client().iter_records(job_id))
    assert 0 < len(seen) < 5000


def test_a_download_cut_before_any_record_is_retried(
    state: CloudState, sim_client: ClientFactory, clock: FakeClock
) -> None:
    """A cut inside the first line is retried from the start and the full dataset arrives."""
    job_id = _finished_job(state)
    state.inject_fault("cut", path_contains=f"scraping-job/{job_id}/json", after_bytes=30)
    assert len(list(sim_client().iter_records(job_id))) == 3
    assert len(clock.sleeps) == 1


def _resident_bytes() -> int:
    """The process's resident set size now, from /proc (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_records_stream_in_constant_memory(state: CloudState, sim_client: ClientFactory) -> None:
    """200 000 records (45 MB of JSON Lines) pass through without the process growing with them."""
    # tracemalloc would make this run take 20 s; sampling the resident set costs nothing.
    # Holding the records grows the process by about 250 MB; streaming, by a few MB.
    sitemap_id = state.add_sitemap("products")
    job_id = state.create_job(sitemap_id)
    state.set_generated(job_id, 200_000)
    client = sim_client()
    gc.collect()
    baseline = peak = _resident_bytes()
    count = 0
    for count, record in enumerate(client.iter_records(job_id), start=1):
        assert record["sku"]
        if count % 2000 == 0:
            peak = max(peak, _resident_bytes())
    assert count == 200_000
    growth = peak - baseline
    assert growth < 40 * 1024 * 1024, f"grew by {growth / 1e6:.1f} MB while streaming"


# --- over a real loopback socket ----------------------------------------------------------


@pytest.fixture
def live(state: CloudState) -> Iterator[str]:
    """The simulator served on a loopback port; yields its API URL."""
    with serve(state) as server:
        yield server.api_url


def _live_client(api_url: str, clock: FakeClock, **options: Any) -> CloudClient:
    options.setdefault("retry", RetryPolicy(random=lambda: 0.01))
    return CloudClient(token=SIM_TOKEN, base_url=api_url, sleep=clock.sleep, clock=clock, **options)


def test_a_cut_download_raises_over_a_socket(
    state: CloudState, live: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Over TCP a body dropped mid-stream raises DownloadIncompleteError; no token in logs."""
    caplog.set_level(logging.DEBUG)
    job_id = _finished_job(state)
    state.set_generated(job_id, 5000)
    state.inject_fault("cut", path_contains=f"scraping-job/{job_id}/json", after_bytes=20_000)
    with _live_client(live, clock) as client:
        seen: list[dict[str, Any]] = []
        with pytest.raises(DownloadIncompleteError) as caught:
            seen.extend(client.iter_records(job_id))
        assert 0 < len(seen) < 5000
        assert len(list(client.iter_records(job_id))) == 5000
    assert caught.value.__context__ is None
    assert SIM_TOKEN not in str(caught.value)
    assert any(r.name == "httpx" for r in caplog.records)
    assert SIM_TOKEN not in caplog.text


def test_a_reset_and_a_timeout_are_retried_over_a_socket(
    state: CloudState, live: str, clock: FakeClock
) -> None:
    """A closed connection and a read timeout on the wire are retried until Cloud answers."""
    job_id = _finished_job(state)
    state.inject_fault("reset", path_contains=f"scraping-job/{job_id}")
    state.inject_fault("slow", path_contains=f"scraping-job/{job_id}", seconds=0.5)
    started = time.monotonic()
    with _live_client(live, clock, timeout=0.2) as client:
        assert client.get_job(job_id).id == job_id
    assert len(clock.sleeps) == 2
    assert time.monotonic() - started < 5


def test_a_refused_connection_is_a_transport_error(clock: FakeClock) -> None:
    """Nobody listening on the port gives CloudTransportError after the attempts are spent."""
    with CloudState(api_token=SIM_TOKEN) as cloud, serve(cloud) as server:
        api_url = server.api_url
    client = _live_client(api_url, clock, retry=RetryPolicy(max_attempts=2))
    with client, pytest.raises(CloudTransportError) as caught:
        client.get_account()
    assert caught.value.request_sent is False
    assert caught.value.retry_after is not None
    assert len(clock.sleeps) == 1
