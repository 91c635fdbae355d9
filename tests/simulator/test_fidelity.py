"""What a staging user relies on the simulator to do as Cloud does: start URLs per record,
refused job and sitemap bodies, data quality over the sitemap's selectors, page counters and
a record count that grows while a job runs."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from typing import Any

import httpx

from simulator import CloudState, SimServer, generate_records
from sync.cloud.client import CloudClient
from tests.simulator.conftest import JOB_SETTINGS, TOKEN

PLAIN = {"Accept-Encoding": "identity"}
HOSTS = ("https://alpha.example/", "https://beta.example/", "https://gamma.example/")


def _lines(client: httpx.Client, job_id: int) -> list[dict[str, Any]]:
    """The job's JSON Lines download, parsed."""
    body = client.get(f"scraping-job/{job_id}/json", headers=PLAIN).text
    return [json.loads(line) for line in body.splitlines()]


def _job(client: httpx.Client, job_id: int) -> dict[str, Any]:
    """The job as GET scraping-job shows it."""
    data: dict[str, Any] = client.get(f"scraping-job/{job_id}").json()["data"]
    return data


def _quality(client: httpx.Client, job_id: int) -> dict[str, Any]:
    """The job's data-quality result."""
    data: dict[str, Any] = client.get(f"scraping-job/{job_id}/data-quality").json()["data"]
    return data


# --- web-scraper-start-url ------------------------------------------------------------------


def test_a_job_with_several_start_urls_spreads_its_records_over_them(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Nine records of a job with three start URLs: three from each, in JSON and in CSV."""
    job_id = make_job(start_urls=list(HOSTS))
    state.run_job(job_id, n=9)
    starts = [line["web-scraper-start-url"] for line in _lines(client, job_id)]
    assert starts == list(HOSTS) * 3
    text = client.get(f"scraping-job/{job_id}/csv").content.decode("utf-8-sig")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [row["web-scraper-start-url"] for row in rows] == list(HOSTS) * 3


def test_generated_records_come_from_the_start_url_of_their_retailer(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """With one start URL per retailer, a record's start URL host is its retailer's host."""
    job_id = make_job(start_urls=list(HOSTS))
    state.run_job(job_id, n=30)
    for line in _lines(client, job_id):
        assert line["web-scraper-start-url"] == f"https://{line['retailer']}/"


def test_a_start_url_supplied_with_a_record_is_kept(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """A record given its own web-scraper-start-url keeps it; the others take the job's."""
    job_id = make_job(start_urls=list(HOSTS[:2]))
    records = [
        {"sku": "a"},
        {"web-scraper-start-url": "https://elsewhere.example/list?page=3", "sku": "b"},
        {"sku": "c"},
    ]
    state.run_job(job_id, records=records)
    lines = _lines(client, job_id)
    assert [line["web-scraper-start-url"] for line in lines] == [
        HOSTS[0],
        "https://elsewhere.example/list?page=3",
        HOSTS[0],
    ]
    assert [list(line) for line in lines][1] == [
        "web-scraper-order",
        "web-scraper-start-url",
        "sku",
    ]


# --- POST scraping-job ----------------------------------------------------------------------


def test_a_job_without_driver_delays_or_interval_is_refused_like_cloud(
    client: httpx.Client, state: CloudState, sitemap_id: int
) -> None:
    """Cloud requires driver, page_load_delay and request_interval; nothing is filled in."""
    response = client.post("scraping-job", json={"sitemap_id": sitemap_id})
    assert response.status_code == 422
    assert response.json() == {
        "success": False,
        "validationErrors": {
            "driver": ["The driver field is required."],
            "page_load_delay": ["The page load delay field is required."],
            "request_interval": ["The request interval field is required."],
        },
    }
    assert state.jobs == {}
    partial = {"sitemap_id": sitemap_id, "driver": "fast", "page_load_delay": 2000}
    refused = client.post("scraping-job", json=partial).json()["validationErrors"]
    assert refused == {"request_interval": ["The request interval field is required."]}
    created = client.post("scraping-job", json={"sitemap_id": sitemap_id, **JOB_SETTINGS})
    assert created.status_code == 200


def test_scrapesyncs_client_sends_every_field_cloud_requires(
    state: CloudState, sitemap_id: int
) -> None:
    """The client scrapesync launches with creates the job with the settings it chose."""
    from simulator import create_app

    with CloudClient(
        token=TOKEN,
        base_url="http://sim/api/v1/",
        transport=httpx.WSGITransport(app=create_app(state)),
    ) as cloud:
        job_id = cloud.create_job(sitemap_id=sitemap_id, custom_id="products-2026-12-03")
    job = state.jobs[job_id]
    assert (job.driver, job.page_load_delay, job.request_interval) == ("fulljs", 2000, 2000)
    assert job.custom_id == "products-2026-12-03"


# --- data quality over the sitemap's selectors --------------------------------------------


def test_data_quality_judges_the_columns_of_the_sitemaps_selectors(
    client: httpx.Client, state: CloudState
) -> None:
    """A selector no record carries fails its column at 0%; a link selector's -href column is
    judged too; a record field that no selector makes is not."""
    selectors = [
        {"id": "sku", "type": "SelectorText", "parentSelectors": ["_root"], "selector": ".sku"},
        {"id": "rating", "type": "SelectorText", "parentSelectors": ["_root"], "selector": "i"},
        {"id": "link", "type": "SelectorLink", "parentSelectors": ["_root"], "selector": "a"},
    ]
    sitemap = state.add_sitemap("catalogue", selectors=selectors)
    job_id = state.create_job(sitemap)
    records = [
        {"sku": f"S{i}", "link": "x", "link-href": "https://x/", "extra": 1} for i in range(4)
    ]
    state.run_job(job_id, records=records)
    columns = _quality(client, job_id)["min_column_records"]
    assert list(columns) == ["sku", "rating", "link", "link-href"]
    assert columns["rating"] == {"got": 0, "expected": 95, "success": False}
    assert columns["sku"]["success"] is True
    assert columns["link-href"]["success"] is True
    assert _quality(client, job_id)["overall_data_quality_success"] is False


def test_a_sitemap_made_for_generated_records_passes_its_columns(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """add_sitemap without selectors gets one per generated product column, all filled."""
    job_id = make_job()
    state.run_job(job_id, n=10)
    columns = _quality(client, job_id)["min_column_records"]
    assert set(columns) == {"sku", "title", "price", "url", "retailer"}
    assert all(leaf["success"] for leaf in columns.values())


# --- page counters --------------------------------------------------------------------------


def test_page_counters_count_pages_not_records(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """100 records at 20 a page are 5 pages; with 2 failed pages 7 were scheduled, and Cloud's
    failed-page share is 2 of 7, not 2 of 100."""
    job_id = make_job()
    state.run_job(job_id, n=100, jobs_failed=2, records_per_page=20)
    job = _job(client, job_id)
    assert (job["jobs_scheduled"], job["jobs_executed"], job["jobs_failed"]) == (7, 7, 2)
    assert job["stored_record_count"] == 100
    failed = _quality(client, job_id)["max_failed_pages_percent"]
    assert failed == {"got": 28.57, "expected": 5, "success": False}


def test_the_records_per_page_figure_goes_through_the_control_api(
    server: SimServer, state: CloudState, sitemap_id: int
) -> None:
    """A staging driver finishes a job with records_per_page over /_sim/."""
    job_id = state.create_job(sitemap_id)
    state.set_generated(job_id, 45)
    with httpx.Client(base_url=f"{server.url}/_sim/", trust_env=False) as control:
        done = control.post(f"jobs/{job_id}/finish", json={"records_per_page": 10})
        assert done.status_code == 200
    assert state.jobs[job_id].jobs_scheduled == 5


# --- createSitemap --------------------------------------------------------------------------


def test_a_sitemap_with_an_unknown_attribute_is_refused_as_suspicious(
    client: httpx.Client, state: CloudState, sitemap_id: int
) -> None:
    """An attribute the extension never exports is refused on create and on update."""
    body = {"_id": "odd", "startUrl": ["https://x.example/"], "selectors": [], "script": "x"}
    refused = client.post("sitemap", json=body)
    assert refused.status_code == 422
    assert refused.json() == {
        "success": False,
        "validationErrors": {"sitemap_object": ["Sitemap has a suspicious attribute somewhere."]},
    }
    assert [s.name for s in state.sitemaps.values()] == ["products"]
    updated = client.put(f"sitemap/{sitemap_id}", json={**body, "_id": "products"})
    assert updated.status_code == 422
    assert "script" not in state.sitemaps[sitemap_id].definition
    del body["script"]
    assert client.post("sitemap", json=body).status_code == 200


# --- a running job ------------------------------------------------------------------------


def test_stored_record_count_grows_while_a_job_runs(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Records scraped so far show in the job's counters before it finishes."""
    job_id = make_job()
    state.start_job(job_id)
    assert _job(client, job_id)["stored_record_count"] == 0
    state.add_records(job_id, generate_records(10))
    running = _job(client, job_id)
    assert (running["status"], running["stored_record_count"]) == ("started", 10)
    assert running["jobs_executed"] == 10
    state.add_records(job_id, generate_records(15, start=10))
    assert _job(client, job_id)["stored_record_count"] == 25
    state.finish_job(job_id)
    finished = _job(client, job_id)
    assert (finished["status"], finished["stored_record_count"]) == ("finished", 25)
