"""The simulated Cloud API's envelopes, errors, paging and resources."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from simulator import CloudState
from tests.simulator.conftest import JOB_SETTINGS

JOB_KEYS = [
    "id",
    "custom_id",
    "sitemap_name",
    "status",
    "sitemap_id",
    "test_run",
    "jobs_scheduled",
    "jobs_executed",
    "jobs_failed",
    "jobs_empty",
    "jobs_no_value",
    "stored_record_count",
    "request_interval",
    "page_load_delay",
    "driver",
    "scheduled",
    "time_created",
    "scraping_duration",
]


def test_a_missing_or_wrong_token_gets_401_and_costs_no_call(
    client: httpx.Client, state: CloudState
) -> None:
    """Requests without the account token are refused with the error envelope, uncounted."""
    for params in ({"api_token": ""}, {"api_token": "wrong"}):
        response = client.get("account", params=params)
        assert response.status_code == 401
        assert response.json() == {"success": False, "error": "An error occurred"}
    bare = httpx.Client(transport=client._transport, base_url="http://sim/api/v1/")
    assert bare.get("account").status_code == 401
    assert state.calls == 0
    assert state.requests == [("GET", "/api/v1/account")] * 3


def test_the_request_log_never_holds_the_token(client: httpx.Client, state: CloudState) -> None:
    """The request log keeps method and path only."""
    client.get("sitemaps", params={"page": 2})
    assert state.requests == [("GET", "/api/v1/sitemaps")]
    assert "sim-token" not in repr(state.requests)


def test_unknown_ids_get_404_with_cloud_misspelling(client: httpx.Client) -> None:
    """Unknown sitemaps, jobs and routes answer 404 "An error occured" as Cloud does."""
    for path in ("sitemap/999", "scraping-job/999", "scraping-job/999/json", "no-such-route"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json() == {"success": False, "error": "An error occured"}
    assert client.delete("scraping-job/999").status_code == 404


def test_a_sitemap_round_trips_as_a_compact_json_string(client: httpx.Client) -> None:
    """A posted sitemap comes back verbatim, with its _id as name and slashes unescaped."""
    definition = {
        "_id": "landing",
        "startUrl": ["http://webscraper.io/"],
        "selectors": [{"id": "title", "type": "SelectorText", "parentSelectors": ["_root"]}],
    }
    created = client.post("sitemap", json=definition)
    assert created.status_code == 200
    sitemap_id = created.json()["data"]["id"]
    shown = client.get(f"sitemap/{sitemap_id}").json()
    assert shown == {
        "success": True,
        "data": {
            "id": sitemap_id,
            "name": "landing",
            "sitemap": json.dumps(definition, separators=(",", ":")),
        },
    }
    assert client.get("sitemaps").json()["data"] == [{"id": sitemap_id, "name": "landing"}]


def test_a_sitemap_can_be_updated_and_deleted(client: httpx.Client, sitemap_id: int) -> None:
    """PUT replaces the definition, DELETE removes it; both answer data "ok"."""
    update = {"_id": "products-v2", "startUrl": ["https://shop.example/new"], "selectors": []}
    assert client.put(f"sitemap/{sitemap_id}", json=update).json() == {
        "success": True,
        "data": "ok",
    }
    assert client.get(f"sitemap/{sitemap_id}").json()["data"]["name"] == "products-v2"
    assert client.delete(f"sitemap/{sitemap_id}").json()["data"] == "ok"
    assert client.get(f"sitemap/{sitemap_id}").status_code == 404
    assert client.delete(f"sitemap/{sitemap_id}").status_code == 404


def test_a_malformed_sitemap_gets_422_validation_errors(client: httpx.Client) -> None:
    """A misspelled startUrl gets the answer Cloud gave live: the unknown attribute is
    suspicious and the start URL is missing, in Laravel-style validationErrors."""
    response = client.post("sitemap", json={"_id": "broken", "startUrll": ["https://x/"]})
    assert response.status_code == 422
    assert response.text == (
        '{"success":false,"validationErrors":{'
        '"sitemap_object":["Sitemap has a suspicious attribute somewhere."],'
        '"sitemap_object.startUrl":["The sitemap object.start url field is required."]}}'
    )
    assert client.post("sitemap", content=b"not json").status_code == 422


def test_a_duplicate_sitemap_name_is_refused(client: httpx.Client, sitemap_id: int) -> None:
    """Sitemap names are unique within the account."""
    response = client.post("sitemap", json={"_id": "products", "startUrl": ["https://x/"]})
    assert response.status_code == 422
    assert "sitemap_object._id" in response.json()["validationErrors"]


def test_a_created_job_waits_to_be_scheduled_with_cloud_key_set(
    client: httpx.Client, sitemap_id: int, state: CloudState
) -> None:
    """POST scraping-job answers 200 with id and custom_id; the job has exactly Cloud's keys."""
    body = {"sitemap_id": sitemap_id, "driver": "fast", "page_load_delay": 2000}
    created = client.post("scraping-job", json={**body, "request_interval": 2000})
    assert created.status_code == 200
    job_id = created.json()["data"]["id"]
    assert created.json()["data"] == {"id": job_id, "custom_id": None}
    job = client.get(f"scraping-job/{job_id}").json()["data"]
    assert list(job) == JOB_KEYS
    assert job["status"] == "waiting-to-be-scheduled"
    assert job["custom_id"] is None
    assert job["sitemap_name"] == "products"
    assert job["time_created"] == int(state.clock())
    assert isinstance(job["time_created"], int)


def test_a_job_carries_its_custom_id_and_start_urls(
    client: httpx.Client, sitemap_id: int, state: CloudState
) -> None:
    """custom_id is echoed; start_urls replace the sitemap's for this job only."""
    created = client.post(
        "scraping-job",
        json={
            "sitemap_id": sitemap_id,
            "custom_id": "run-7",
            "start_urls": ["https://b.example/"],
            **JOB_SETTINGS,
        },
    ).json()["data"]
    assert created["custom_id"] == "run-7"
    assert client.get(f"scraping-job/{created['id']}").json()["data"]["custom_id"] == "run-7"
    assert state.jobs[created["id"]].start_urls == ["https://b.example/"]


def test_a_job_for_an_unknown_sitemap_gets_422(client: httpx.Client) -> None:
    """Creating a job needs an existing sitemap id and a known driver."""
    response = client.post(
        "scraping-job", json={**JOB_SETTINGS, "sitemap_id": 4242, "driver": "chrome"}
    )
    assert response.status_code == 422
    assert response.json()["validationErrors"] == {
        "sitemap_id": ["The selected sitemap id is invalid."],
        "driver": ["The selected driver is invalid."],
    }


def test_250_jobs_page_into_three_pages_newest_first(
    client: httpx.Client, make_job: Callable[..., int]
) -> None:
    """Job lists page 100 at a time with paging fields beside data, newest first."""
    ids = [make_job() for _ in range(250)]
    pages = [client.get("scraping-jobs", params={"page": page}).json() for page in (1, 2, 3, 4)]
    for number, page in enumerate(pages, start=1):
        assert page["success"] is True
        assert (page["current_page"], page["last_page"]) == (number, 3)
        assert (page["total"], page["per_page"]) == (250, 100)
    assert [len(page["data"]) for page in pages] == [100, 100, 50, 0]
    listed = [job["id"] for page in pages for job in page["data"]]
    assert listed == sorted(ids, reverse=True)


def test_an_empty_list_has_one_last_page(client: httpx.Client) -> None:
    """With nothing to list, total is 0 and last_page is 1."""
    body = client.get("scraping-jobs").json()
    assert body == {
        "success": True,
        "data": [],
        "current_page": 1,
        "last_page": 1,
        "total": 0,
        "per_page": 100,
    }


def test_jobs_can_be_filtered_by_sitemap(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """sitemap_id narrows the job list to one sitemap."""
    mine = make_job()
    other = state.create_job(state.add_sitemap("other", start_urls=["https://o.example/"]))
    listed = client.get("scraping-jobs", params={"sitemap_id": state.jobs[mine].sitemap_id})
    assert [job["id"] for job in listed.json()["data"]] == [mine]
    assert {job["id"] for job in client.get("scraping-jobs").json()["data"]} == {mine, other}


def test_deleting_a_job_removes_it(client: httpx.Client, make_job: Callable[..., int]) -> None:
    """DELETE scraping-job answers "ok" and the job is gone."""
    job_id = make_job()
    assert client.delete(f"scraping-job/{job_id}").json() == {"success": True, "data": "ok"}
    assert client.get(f"scraping-job/{job_id}").status_code == 404


def test_problematic_urls_page_with_their_types(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Problematic URLs list url and type (empty, failed, no_value), 100 per page."""
    job_id = make_job()
    urls = [
        (f"https://shop.example/p/{i}", ("empty", "failed", "no_value")[i % 3]) for i in range(150)
    ]
    state.run_job(job_id, records=[{"title": "x"}], problematic_urls=urls)
    first = client.get(f"scraping-job/{job_id}/problematic-urls").json()
    assert first["data"][0] == {"url": "https://shop.example/p/0", "type": "empty"}
    assert (first["total"], first["last_page"], len(first["data"])) == (150, 2, 100)
    third = client.get(f"scraping-job/{job_id}/problematic-urls", params={"page": 3}).json()
    assert third["data"] == []
    job = client.get(f"scraping-job/{job_id}").json()["data"]
    assert (job["jobs_empty"], job["jobs_failed"], job["jobs_no_value"]) == (50, 50, 50)


def test_problem_counters_without_urls_get_made_up_urls(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Counting failed pages without naming them still lists one URL per page."""
    job_id = make_job()
    state.run_job(job_id, n=10, jobs_failed=2, jobs_empty=1)
    data = client.get(f"scraping-job/{job_id}/problematic-urls").json()["data"]
    assert sorted(item["type"] for item in data) == ["empty", "failed", "failed"]
    assert all(item["url"].startswith("https://shop.example/") for item in data)


def test_account_shows_page_credits_spent_by_jobs(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """The account shows its owner and the page credits left."""
    before = client.get("account").json()["data"]
    assert set(before) == {"email", "firstname", "lastname", "page_credits"}
    state.run_job(make_job(), n=40)
    assert client.get("account").json()["data"]["page_credits"] == before["page_credits"] - 40


def test_the_scheduler_config_is_stored_and_kept_when_disabled(
    client: httpx.Client, sitemap_id: int
) -> None:
    """enable-scheduler stores the config; scheduler echoes it; disabling keeps it."""
    config = {
        "cron_minute": "*/10",
        "cron_hour": "*",
        "cron_day": "*",
        "cron_month": "*",
        "cron_weekday": "*",
        "request_interval": 2000,
        "page_load_delay": 2000,
        "cron_timezone": "Europe/Riga",
        "driver": "fast",
        "proxy": 1,
    }
    assert client.post(f"sitemap/{sitemap_id}/enable-scheduler", json=config).json()["data"] == "ok"
    assert client.get(f"sitemap/{sitemap_id}/scheduler").json()["data"] == {
        "scheduler_enabled": True,
        **config,
    }
    assert client.post(f"sitemap/{sitemap_id}/disable-scheduler").json()["data"] == "ok"
    shown = client.get(f"sitemap/{sitemap_id}/scheduler").json()["data"]
    assert shown == {"scheduler_enabled": False, **config}
    assert client.post(f"sitemap/{sitemap_id}/enable-scheduler", json={}).status_code == 422
    assert client.get("sitemap/999/scheduler").status_code == 404


@pytest.mark.parametrize("path", ["sitemaps", "scraping-jobs", "account"])
def test_api_json_escapes_slashes_like_php(
    client: httpx.Client, state: CloudState, path: str
) -> None:
    """API JSON is encoded as PHP's json_encode does, with \\/ for slashes."""
    state.create_job(state.add_sitemap("a/b", start_urls=["https://x.example/"]))
    raw = client.get(path).text
    assert "/" not in raw.replace("\\/", "")
