"""Fixtures for the simulator's contract tests: a state on a fake clock, clients, and the
receiver of its notifications."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from simulator import CloudState, SimServer, create_app, serve
from tests.fakes import FakeClock, Receiver

TOKEN = "sim-token"
# What Cloud requires in every POST scraping-job besides the sitemap id (the docs' values).
JOB_SETTINGS = {"driver": "fast", "page_load_delay": 2000, "request_interval": 2000}


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock for rate windows and timestamps."""
    return FakeClock()


@pytest.fixture
def notification_receiver() -> Receiver:
    """Where the simulated Cloud posts its finished-job notifications (in a deployment,
    scrapesync's webhook); answers 200 unless told otherwise."""
    return Receiver(status=200)


@pytest.fixture
def state(clock: FakeClock, notification_receiver: Receiver) -> Iterator[CloudState]:
    """A simulated account on the fake clock, posting its notifications to the notification
    receiver with tiny retry delays."""
    sim = CloudState(
        api_token=TOKEN,
        clock=clock,
        notify_url="http://receiver/hook/secret",
        notify_delays=(0.05, 0.1),
        notify_timeout=2.0,
        notify_transport=httpx.MockTransport(notification_receiver),
    )
    yield sim
    sim.close()


@pytest.fixture
def client(state: CloudState) -> Iterator[httpx.Client]:
    """An API client talking to the simulator in-process, token attached."""
    with httpx.Client(
        transport=httpx.WSGITransport(app=create_app(state)),
        base_url="http://sim/api/v1/",
        params={"api_token": TOKEN},
    ) as http:
        yield http


@pytest.fixture
def sitemap_id(state: CloudState) -> int:
    """A sitemap named "products" starting at https://shop.example/."""
    return state.add_sitemap("products", start_urls=["https://shop.example/"])


@pytest.fixture
def make_job(state: CloudState, sitemap_id: int) -> Callable[..., int]:
    """Create jobs for the "products" sitemap."""

    def make(**options: Any) -> int:
        """Create one job with these options; return its id."""
        return state.create_job(sitemap_id, **options)

    return make


@pytest.fixture
def server(state: CloudState) -> Iterator[SimServer]:
    """The simulator served on a real loopback socket."""
    with serve(state) as running:
        yield running


@pytest.fixture
def socket_client(server: SimServer) -> Iterator[httpx.Client]:
    """An API client talking to the simulator over loopback, token attached."""
    with httpx.Client(
        base_url=server.api_url, params={"api_token": TOKEN}, timeout=5.0, trust_env=False
    ) as http:
        yield http
