"""Injected faults, in-process and over a real socket."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from simulator import CloudState
from tests.simulator.conftest import JOB_SETTINGS


def _read_until_dropped(client: httpx.Client, path: str) -> tuple[bytes, Exception | None]:
    """Read a plain download until it ends or the connection drops; return bytes and error."""
    received = b""
    try:
        with client.stream("GET", path, headers={"Accept-Encoding": "identity"}) as response:
            for chunk in response.iter_raw():
                received += chunk
    except ConnectionResetError as exc:
        return received, exc
    return received, None


def test_a_status_fault_answers_the_error_envelope_then_clears(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """A status fault strikes the next matching requests only, with Cloud's envelope."""
    job_id = make_job()
    state.inject_fault("status", path_contains="scraping-job/", times=2, status=503)
    assert client.get("account").status_code == 200
    for _ in range(2):
        response = client.get(f"scraping-job/{job_id}")
        assert response.status_code == 503
        assert response.json() == {"success": False, "error": "An error occurred"}
        assert "x-ratelimit-remaining" in response.headers
    assert client.get(f"scraping-job/{job_id}").status_code == 200


def test_a_status_fault_can_revoke_a_valid_token_or_serve_a_proxy_page(
    client: httpx.Client, state: CloudState
) -> None:
    """A 401/403 fault hits a valid token; a body param serves a non-JSON gateway page."""
    state.inject_fault("status", status=403)
    assert client.get("account").status_code == 403
    state.inject_fault("status", status=502, body="<html>Bad Gateway</html>")
    response = client.get("account")
    assert (response.status_code, response.headers["content-type"]) == (502, "text/html")
    assert response.text == "<html>Bad Gateway</html>"


def test_a_fault_can_target_one_method_and_last_until_cleared(
    client: httpx.Client, state: CloudState, sitemap_id: int
) -> None:
    """params method narrows a fault; times=None keeps it armed until clear_faults."""
    state.inject_fault("status", times=None, status=500, method="POST")
    assert client.get("sitemaps").status_code == 200
    for _ in range(3):
        assert (
            client.post("scraping-job", json={"sitemap_id": sitemap_id, **JOB_SETTINGS}).status_code
            == 500
        )
    state.clear_faults()
    assert (
        client.post("scraping-job", json={"sitemap_id": sitemap_id, **JOB_SETTINGS}).status_code
        == 200
    )


def test_a_rate_limit_fault_answers_429_without_spending_the_window(
    client: httpx.Client, state: CloudState
) -> None:
    """A rate_limit fault answers 429 with the configured wait and costs no call."""
    state.inject_fault("rate_limit", retry_after=3)
    refused = client.get("account")
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "3"
    assert refused.headers["x-ratelimit-reset"] == str(int(state.clock()) + 3)
    assert state.calls == 0
    assert client.get("account").headers["x-ratelimit-remaining"] == "199"


def test_a_slow_fault_delays_the_answer(client: httpx.Client, state: CloudState) -> None:
    """A slow fault sleeps before answering normally (in-process there is no timeout)."""
    state.inject_fault("slow", seconds=0.2)
    started = time.monotonic()
    assert client.get("account").status_code == 200
    assert time.monotonic() - started >= 0.2


def test_a_slow_fault_times_out_a_socket_client(
    socket_client: httpx.Client, state: CloudState
) -> None:
    """Over a socket a slow answer trips the client's read timeout."""
    state.inject_fault("slow", seconds=0.5)
    with pytest.raises(httpx.ReadTimeout):
        socket_client.get("account", timeout=0.1)


def test_a_reset_fault_raises_connection_reset_in_process(
    client: httpx.Client, state: CloudState
) -> None:
    """Through WSGITransport a reset surfaces as ConnectionResetError from the client call."""
    state.inject_fault("reset", path_contains="account")
    with pytest.raises(ConnectionResetError):
        client.get("account")
    assert client.get("account").status_code == 200


def test_a_reset_fault_drops_the_socket_without_a_response(
    socket_client: httpx.Client, state: CloudState
) -> None:
    """Over a socket a reset closes the connection; httpx reports a transport error."""
    state.inject_fault("reset")
    with pytest.raises(httpx.RemoteProtocolError):
        socket_client.get("account")
    assert socket_client.get("account").status_code == 200


def test_a_cut_download_stops_after_the_given_bytes_in_process(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """In-process the body breaks off with ConnectionResetError after after_bytes bytes."""
    job_id = make_job()
    state.run_job(job_id, n=200)
    state.inject_fault("cut", after_bytes=1000)
    assert client.get("account").status_code == 200  # cut only strikes downloads
    received, dropped = _read_until_dropped(client, f"scraping-job/{job_id}/json")
    assert isinstance(dropped, ConnectionResetError)
    assert len(received) == 1000


def test_a_cut_download_is_an_incomplete_body_over_a_socket(
    socket_client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Over a socket the chunked body ends early and httpx raises a protocol error."""
    job_id = make_job()
    state.run_job(job_id, n=200)
    state.inject_fault("cut", path_contains="/json", after_bytes=5000)
    with pytest.raises(httpx.RemoteProtocolError):
        socket_client.get(f"scraping-job/{job_id}/json")
    whole = socket_client.get(f"scraping-job/{job_id}/json")
    assert whole.text.count("\n") == 200


def test_a_cut_short_body_still_loses_its_end(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """A body shorter than after_bytes is still cut, so the client never sees a clean end."""
    job_id = make_job()
    state.run_job(job_id, records=[{"title": "only"}])
    state.inject_fault("cut", after_bytes=10_000)
    received, dropped = _read_until_dropped(client, f"scraping-job/{job_id}/json")
    assert isinstance(dropped, ConnectionResetError)
    assert received
    assert not received.endswith(b"\n")


def test_a_create_that_times_out_still_creates_the_job(
    socket_client: httpx.Client, state: CloudState, sitemap_id: int
) -> None:
    """create_then_slow: Cloud creates the job, but the client times out before the answer."""
    state.inject_fault("create_then_slow", seconds=0.5)
    with pytest.raises(httpx.ReadTimeout):
        socket_client.post(
            "scraping-job",
            json={"sitemap_id": sitemap_id, "custom_id": "run-1", **JOB_SETTINGS},
            timeout=0.1,
        )
    assert [job.custom_id for job in state.jobs.values()] == ["run-1"]


def test_unknown_fault_kinds_are_refused(state: CloudState) -> None:
    """Injecting a fault the simulator does not know is an error."""
    with pytest.raises(ValueError, match="unknown fault kind"):
        state.inject_fault("meteor")
    with pytest.raises(ValueError, match="status"):
        state.inject_fault("status")
