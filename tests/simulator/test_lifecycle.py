"""Scraping-job lifecycle, counters, Continue, data quality and page faults."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from simulator import CloudState
from tests.fakes import FakeClock

NOT_FINISHED = {
    "success": False,
    "validationErrors": {
        "scraping_job_id": ["Data quality check not available yet, scraping job not finished"]
    },
}


def _job(client: httpx.Client, job_id: int) -> dict[str, object]:
    """Read a job through the API."""
    data: dict[str, object] = client.get(f"scraping-job/{job_id}").json()["data"]
    return data


def test_a_job_moves_from_waiting_through_started_to_finished(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int], clock: FakeClock
) -> None:
    """The hooks walk a job through Cloud's statuses and fill its counters at the end: three
    pages that yielded a record each and one failed page make four pages scheduled."""
    job_id = make_job()
    assert _job(client, job_id)["status"] == "waiting-to-be-scheduled"
    state.start_job(job_id)
    assert _job(client, job_id)["status"] == "started"
    state.set_records(job_id, [{"title": "a"}, {"title": "b"}, {"title": "c"}])
    clock.advance(42)
    state.finish_job(job_id, jobs_failed=1)
    job = _job(client, job_id)
    assert job["status"] == "finished"
    assert job["stored_record_count"] == 3
    assert (job["jobs_scheduled"], job["jobs_executed"], job["jobs_failed"]) == (4, 4, 1)
    assert job["scraping_duration"] == 42


@pytest.mark.parametrize("status", ["failed", "stopped"])
def test_failed_and_stopped_are_terminal_too(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int], status: str
) -> None:
    """A job can end failed or stopped, and other statuses are refused."""
    job_id = make_job()
    state.run_job(job_id, n=5, status=status)
    assert _job(client, job_id)["status"] == status
    with pytest.raises(ValueError, match="terminal status"):
        state.finish_job(job_id, status="done")


def test_jobs_scheduled_can_be_set_explicitly(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Page counters given to finish_job are shown as given."""
    job_id = make_job()
    state.run_job(job_id, n=80, jobs_scheduled=100, jobs_empty=15, jobs_no_value=5)
    job = _job(client, job_id)
    assert (job["jobs_scheduled"], job["jobs_executed"]) == (100, 100)
    assert (job["jobs_empty"], job["jobs_no_value"], job["stored_record_count"]) == (15, 5, 80)


def test_legacy_statuses_can_be_forced_without_a_notification(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """set_status shows old values such as "shelved" or "scheduling" and notifies nobody."""
    job_id = make_job()
    state.set_status(job_id, "shelved")
    assert _job(client, job_id)["status"] == "shelved"
    assert state.wait_for_notifications()
    assert state.notifications_sent == []


def test_continue_requeues_the_same_job_and_adds_records(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Continue sends an ended job back to the queue; finishing again updates its counters."""
    job_id = make_job()
    state.run_job(job_id, records=[{"title": "a"}], status="failed", jobs_failed=4)
    state.continue_job(job_id, extra_records=[{"title": "b"}, {"title": "c"}])
    assert _job(client, job_id)["status"] == "waiting-to-be-scheduled"
    state.finish_job(job_id)
    job = _job(client, job_id)
    assert (job["status"], job["stored_record_count"], job["jobs_failed"]) == ("finished", 3, 0)
    with pytest.raises(ValueError, match="only ended jobs"):
        state.continue_job(make_job())


def test_data_quality_is_refused_until_the_job_finishes(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Before finished, data-quality answers 422 with Cloud's validation message."""
    job_id = make_job()
    response = client.get(f"scraping-job/{job_id}/data-quality")
    assert response.status_code == 422
    assert response.json() == NOT_FINISHED
    state.run_job(job_id, n=3, status="failed")
    assert client.get(f"scraping-job/{job_id}/data-quality").json() == NOT_FINISHED


def test_data_quality_of_a_clean_job_passes_with_cloud_defaults(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """A finished job with full columns passes the 1 / 5 / 5 / 5 / 95 defaults."""
    job_id = make_job()
    state.run_job(job_id, n=20)
    data = client.get(f"scraping-job/{job_id}/data-quality").json()["data"]
    assert list(data) == [
        "min_record_count",
        "max_failed_pages_percent",
        "max_empty_pages_percent",
        "max_no_value_pages_percent",
        "min_column_records",
        "overall_data_quality_success",
    ]
    assert data["min_record_count"] == {"got": 20, "expected": 1, "success": True}
    assert data["max_failed_pages_percent"] == {"got": 0, "expected": 5, "success": True}
    assert data["min_column_records"]["sku"] == {"got": 100, "expected": 95, "success": True}
    assert set(data["min_column_records"]) == {"sku", "title", "price", "url", "retailer"}
    assert data["overall_data_quality_success"] is True


def test_data_quality_fails_on_failed_pages_and_thin_columns(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Too many failed pages or a half-empty column fail the check, and so the overall result."""
    job_id = make_job()
    records = [{"title": "t", "price": "1.00" if i % 2 else ""} for i in range(10)]
    state.run_job(job_id, records=records, jobs_scheduled=20, jobs_failed=3)
    data = client.get(f"scraping-job/{job_id}/data-quality").json()["data"]
    assert data["max_failed_pages_percent"] == {"got": 15, "expected": 5, "success": False}
    assert data["min_column_records"]["price"] == {"got": 50, "expected": 95, "success": False}
    assert data["min_column_records"]["title"]["success"] is True
    assert data["overall_data_quality_success"] is False


def test_per_sitemap_thresholds_override_the_defaults(
    client: httpx.Client, state: CloudState, sitemap_id: int, make_job: Callable[..., int]
) -> None:
    """Thresholds set on the sitemap replace Cloud's defaults, per column too."""
    state.set_quality_thresholds(
        sitemap_id,
        min_record_count=50,
        max_failed_pages_percent=20,
        min_column_records={"price": 40, "rating": 10},
    )
    job_id = make_job()
    records = [{"title": "t", "price": "1.00" if i % 2 else ""} for i in range(10)]
    state.run_job(job_id, records=records, jobs_scheduled=20, jobs_failed=3)
    data = client.get(f"scraping-job/{job_id}/data-quality").json()["data"]
    assert data["min_record_count"] == {"got": 10, "expected": 50, "success": False}
    assert data["max_failed_pages_percent"]["success"] is True
    assert data["min_column_records"]["price"] == {"got": 50, "expected": 40, "success": True}
    assert data["min_column_records"]["rating"] == {"got": 0, "expected": 10, "success": False}
    with pytest.raises(ValueError, match="unknown data-quality criteria"):
        state.set_quality_thresholds(sitemap_id, max_bogus_percent=1)


def test_a_consent_page_fault_turns_records_into_empty_shells(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Every record of a consent-faulted job is a 200 that is not data."""
    job_id = make_job()
    state.run_job(job_id, n=4)
    state.set_page_fault(job_id, "consent")
    lines = client.get(f"scraping-job/{job_id}/json").text.splitlines()
    assert len(lines) == 4
    assert '"sku":"","title":"Before you continue to our site","price":""' in lines[0]
    quality = client.get(f"scraping-job/{job_id}/data-quality").json()["data"]
    assert quality["min_column_records"]["title"]["got"] == 100
    assert quality["min_column_records"]["sku"]["got"] == 0
    assert quality["overall_data_quality_success"] is False
