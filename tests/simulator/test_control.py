"""The /_sim/ control API, driven over a real socket as the demo and benchmarks do."""

from __future__ import annotations

import httpx
import pytest

from simulator import CloudState, SimServer, serve
from tests.fakes import Receiver
from tests.simulator.conftest import TOKEN


@pytest.fixture
def control(server: SimServer) -> httpx.Client:
    """A client for the control API (no token needed)."""
    return httpx.Client(base_url=f"{server.url}/_sim/", timeout=5.0, trust_env=False)


def test_serve_exposes_urls_and_a_port(server: SimServer) -> None:
    """serve() binds a free loopback port and reports url and api_url."""
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert server.api_url == f"{server.url}/api/v1/"


def test_a_whole_job_can_be_driven_from_another_process(
    control: httpx.Client,
    socket_client: httpx.Client,
    notification_receiver: Receiver,
    state: CloudState,
) -> None:
    """Sitemap, job, records, finish and state all work through /_sim/."""
    with control:
        sitemap_id = control.post("sitemaps", json={"name": "p", "start_urls": ["https://p/"]})
        sitemap_id = sitemap_id.json()["id"]
        job_id = control.post("jobs", json={"sitemap_id": sitemap_id, "custom_id": "r1"})
        job_id = job_id.json()["id"]
        assert control.post(f"jobs/{job_id}/records", json={"generate": 120, "seed": 1}).json() == {
            "ok": True,
            "records": 120,
        }
        added = control.post(
            f"jobs/{job_id}/records", json={"records": [{"sku": "X"}], "append": True}
        )
        assert added.json()["records"] == 121
        finish = {"status": "finished", "jobs_failed": 2, "problematic_urls": None}
        assert control.post(f"jobs/{job_id}/finish", json=finish).status_code == 200
        assert control.post(f"jobs/{job_id}/notify", json={"times": 1}).status_code == 200
        assert control.post("notifications/wait", json={"timeout": 5}).json() == {"done": True}
        summary = control.get("state").json()
    job = socket_client.get(f"scraping-job/{job_id}").json()["data"]
    assert (job["status"], job["stored_record_count"], job["jobs_failed"]) == ("finished", 121, 2)
    assert summary["jobs"] == {str(job_id): "finished"}
    assert (summary["calls"], state.calls) == (0, 1)  # control calls are free
    assert [n["form"]["custom_id"] for n in summary["notifications_sent"]] == ["r1", "r1"]
    assert len(notification_receiver.arrivals) == 2


def test_continue_and_page_faults_work_through_the_control_api(
    control: httpx.Client, state: CloudState, sitemap_id: int
) -> None:
    """Continue requeues a job with extra records; page-fault makes consent shells."""
    job_id = state.create_job(sitemap_id)
    state.run_job(job_id, records=[{"title": "a"}], status="failed")
    with control:
        control.post(f"jobs/{job_id}/continue", json={"records": [{"title": "b"}]})
        assert state.jobs[job_id].status == "waiting-to-be-scheduled"
        control.post(f"jobs/{job_id}/page-fault", json={"kind": "consent"})
        control.post(f"sitemaps/{sitemap_id}/quality", json={"min_record_count": 5})
    assert len(state.jobs[job_id].records) == 2
    assert state.jobs[job_id].page_fault == "consent"
    assert state.sitemaps[sitemap_id].quality.min_record_count == 5


def test_faults_and_config_can_be_set_over_the_control_api(
    control: httpx.Client, socket_client: httpx.Client, state: CloudState
) -> None:
    """POST /_sim/faults arms a fault; POST /_sim/config changes the account's settings."""
    with control:
        armed = {"kind": "status", "path_contains": "account", "times": 1, "status": 500}
        assert control.post("faults", json=armed).status_code == 200
        assert control.get("state").json()["faults"][0]["status"] == 500
        assert socket_client.get("account").status_code == 500
        settings = {"rate_limit": 1, "retry_after_format": "http-date", "notify_url": None}
        assert control.post("config", json=settings).status_code == 200
        assert socket_client.get("account").status_code == 200
        refused = socket_client.get("account")
        assert refused.status_code == 429
        assert refused.headers["retry-after"].endswith("GMT")
        assert control.post("config", json={"api_token": TOKEN, "bogus": 1}).status_code == 400
        assert control.delete("faults").status_code == 200
    assert (state.rate_limit, state.notify_url) == (1, None)


def test_control_errors_are_json(control: httpx.Client) -> None:
    """Unknown ids answer 404 and bad input 400, as JSON."""
    with control:
        missing = control.post("jobs/999/finish", json={})
        assert missing.status_code == 404
        assert "999" in missing.json()["error"]
        bad = control.post("faults", json={"kind": "meteor"})
        assert bad.status_code == 400
        assert "meteor" in bad.json()["error"]


def test_two_simulators_run_side_by_side() -> None:
    """Each serve() gets its own port and its own account."""
    with (
        CloudState() as first,
        CloudState(api_token="other") as second,
        serve(first) as one,
        serve(second) as two,
    ):
        assert one.port != two.port
        answer = httpx.get(f"{two.api_url}account", params={"api_token": "other"}, trust_env=False)
        assert answer.status_code == 200
