"""Lists are read to the last page; create_job sends Cloud's body; getters return Cloud's data."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from sync.cloud.client import CloudClient
from sync.cloud.jobs import ProblematicUrl
from tests.cloud.conftest import Scripted, envelope

MakeClient = Callable[..., tuple[CloudClient, Scripted]]


def _job(job_id: int) -> dict[str, Any]:
    return {"id": job_id, "sitemap_id": 4, "sitemap_name": "products", "status": "finished"}


def paged(items: list[Any], per_page: int = 100) -> Callable[[httpx.Request], httpx.Response]:
    """A list endpoint that pages items like Cloud (100 a page, data [] past the end)."""
    last_page = max(1, -(-len(items) // per_page))

    def handler(request: httpx.Request) -> httpx.Response:
        page = int(request.url.params.get("page", "1"))
        data = items[(page - 1) * per_page : page * per_page]
        return envelope(
            data, current_page=page, last_page=last_page, total=len(items), per_page=per_page
        )

    return handler


def test_iter_jobs_reads_all_250_jobs_over_three_pages(make_client: MakeClient) -> None:
    """250 jobs come back from pages 1..3, and the sitemap filter rides on every page."""
    handler = paged([_job(i) for i in range(1, 251)])
    client, script = make_client(handler, handler, handler)
    jobs = list(client.iter_jobs(sitemap_id=4))
    assert [j.id for j in jobs] == list(range(1, 251))
    assert [r.url.params["page"] for r in script.requests] == ["1", "2", "3"]
    assert all(r.url.params["sitemap_id"] == "4" for r in script.requests)
    assert all(r.url.path == "/api/v1/scraping-jobs" for r in script.requests)


def test_paging_stops_on_an_empty_page_before_last_page(make_client: MakeClient) -> None:
    """An empty data list ends the listing even if last_page promised more."""
    client, script = make_client(
        envelope([_job(1)], current_page=1, last_page=5, total=500, per_page=100),
        envelope([], current_page=2, last_page=5, total=500, per_page=100),
    )
    assert [j.id for j in client.iter_jobs()] == [1]
    assert len(script.requests) == 2
    assert "sitemap_id" not in script.requests[0].url.params


def test_a_job_shifted_onto_the_next_page_is_listed_once(make_client: MakeClient) -> None:
    """When a new job pushes the list down, the repeated job is not yielded twice."""
    client, _ = make_client(
        envelope([_job(3), _job(2)], current_page=1, last_page=2, total=4, per_page=2),
        envelope([_job(2), _job(1)], current_page=2, last_page=2, total=4, per_page=2),
    )
    assert [j.id for j in client.iter_jobs()] == [3, 2, 1]


def test_problematic_urls_are_read_to_the_last_page(make_client: MakeClient) -> None:
    """250 problematic URLs come back typed, over three pages."""
    kinds = ["empty", "failed", "no_value"]
    items = [{"url": f"https://x.test/{i}", "type": kinds[i % 3]} for i in range(250)]
    handler = paged(items)
    client, script = make_client(handler, handler, handler)
    urls = list(client.iter_problematic_urls(12))
    assert len(urls) == 250
    assert urls[0] == ProblematicUrl(url="https://x.test/0", type="empty")
    assert urls[-1] == ProblematicUrl(url="https://x.test/249", type="empty")
    assert script.requests[0].url.path == "/api/v1/scraping-job/12/problematic-urls"


def test_create_job_sends_the_documented_body(make_client: MakeClient) -> None:
    """create_job posts JSON with sitemap, driver, delays, proxy, start URLs and custom id."""
    client, script = make_client(
        envelope({"id": 500, "custom_id": "run-7"}), envelope({"id": 501, "custom_id": None})
    )
    job_id = client.create_job(
        sitemap_id=123,
        driver="fast",
        page_load_delay=3000,
        request_interval=2500,
        proxy=1,
        start_urls=("https://x.test/a", "https://x.test/b"),
        custom_id="run-7",
    )
    assert job_id == 500
    request = script.requests[0]
    assert (request.method, request.url.path) == ("POST", "/api/v1/scraping-job")
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.content) == {
        "sitemap_id": 123,
        "driver": "fast",
        "page_load_delay": 3000,
        "request_interval": 2500,
        "proxy": 1,
        "start_urls": ["https://x.test/a", "https://x.test/b"],
        "custom_id": "run-7",
    }
    assert client.create_job(sitemap_id=9) == 501
    assert json.loads(script.requests[1].content) == {
        "sitemap_id": 9,
        "driver": "fulljs",
        "page_load_delay": 2000,
        "request_interval": 2000,
        "proxy": 0,
    }


def test_account_sitemaps_and_data_quality(make_client: MakeClient) -> None:
    """The plain getters return Cloud's data objects from the documented paths."""
    account = {"email": "user@example.com", "firstname": "J", "lastname": "D", "page_credits": 5}
    sitemap = {"id": 4, "name": "products", "sitemap": '{"_id":"products"}'}
    quality = {"min_record_count": {"got": 1, "expected": 1, "success": True}}
    client, script = make_client(
        envelope(account),
        envelope(sitemap),
        paged([{"id": 4, "name": "products"}, {"id": 5, "name": "offers"}]),
        envelope({**quality, "overall_data_quality_success": True}),
    )
    assert client.get_account() == account
    assert client.get_sitemap(4) == sitemap
    assert [s["name"] for s in client.iter_sitemaps()] == ["products", "offers"]
    assert client.get_data_quality(12)["overall_data_quality_success"] is True
    assert [r.url.path for r in script.requests] == [
        "/api/v1/account",
        "/api/v1/sitemap/4",
        "/api/v1/sitemaps",
        "/api/v1/scraping-job/12/data-quality",
    ]


def test_every_call_carries_the_token_as_a_query_parameter(make_client: MakeClient) -> None:
    """Cloud authenticates by the api_token query parameter, on JSON calls and downloads."""
    from tests.cloud.conftest import TOKEN, download, jsonl

    client, script = make_client(envelope(_job(1)), download(jsonl([{"a": 1}])))
    client.get_job(1)
    list(client.iter_records(1))
    assert [r.url.params["api_token"] for r in script.requests] == [TOKEN, TOKEN]
    assert all(r.headers["Accept"].startswith("application/json") for r in script.requests)
