"""Cloud's answers become typed errors that carry status, Cloud's text and validation errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sync.cloud.client import CloudClient
from sync.cloud.errors import (
    CloudAuthError,
    CloudError,
    CloudNotFoundError,
    CloudRateLimitedError,
    CloudServerError,
    CloudTransportError,
    CloudValidationError,
)
from tests.cloud.conftest import Scripted, envelope, failure

MakeClient = Callable[..., tuple[CloudClient, Scripted]]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, CloudAuthError),
        (403, CloudAuthError),
        (404, CloudNotFoundError),
        (400, CloudError),
        (409, CloudError),
    ],
)
def test_http_status_becomes_its_typed_error(
    make_client: MakeClient, status: int, kind: type[CloudError]
) -> None:
    """Each status maps to its error class, with Cloud's error text and the call in the message."""
    client, script = make_client(failure(status))
    with pytest.raises(kind) as caught:
        client.get_job(42)
    assert type(caught.value) is kind
    assert caught.value.status == status
    assert caught.value.error == "An error occured"
    assert caught.value.retry_after is None
    assert str(caught.value) == f"GET scraping-job/42: HTTP {status}: An error occured"
    assert len(script.requests) == 1


def test_validation_errors_are_kept_field_by_field(make_client: MakeClient) -> None:
    """A 422 keeps Cloud's validationErrors mapping and names the fields in the message."""
    body = {
        "success": False,
        "validationErrors": {
            "sitemap_id": ["The sitemap id field is required."],
            "driver": ["The selected driver is invalid.", "Try fast or fulljs."],
        },
    }
    client, _ = make_client(failure(422, body))
    with pytest.raises(CloudValidationError) as caught:
        client.create_job(sitemap_id=0, driver="warp")
    error = caught.value
    assert error.status == 422
    assert error.error is None
    assert error.validation_errors == {
        "sitemap_id": ["The sitemap id field is required."],
        "driver": ["The selected driver is invalid.", "Try fast or fulljs."],
    }
    assert "sitemap_id: The sitemap id field is required." in str(error)
    assert str(error).startswith("POST scraping-job: HTTP 422")


def test_success_false_on_http_200_is_an_error(make_client: MakeClient) -> None:
    """HTTP 200 with success false is never data; it raises with Cloud's error text."""
    client, _ = make_client(
        httpx.Response(200, json={"success": False, "error": "An error occurred"})
    )
    with pytest.raises(CloudError) as caught:
        client.get_account()
    assert type(caught.value) is CloudError
    assert caught.value.status == 200
    assert caught.value.error == "An error occurred"
    assert "success is false" in str(caught.value)


def test_data_quality_before_the_job_finished_is_a_validation_error(
    make_client: MakeClient,
) -> None:
    """Cloud's 'not finished' answer (validationErrors on success false) is typed as validation."""
    message = "Data quality check not available yet, scraping job not finished"
    body = {"success": False, "validationErrors": {"scraping_job_id": [message]}}
    client, _ = make_client(httpx.Response(200, json=body))
    with pytest.raises(CloudValidationError) as caught:
        client.get_data_quality(7)
    assert caught.value.validation_errors == {"scraping_job_id": [message]}


def test_a_body_that_is_not_json_is_an_error(make_client: MakeClient) -> None:
    """An HTML page on HTTP 200 (a proxy, a consent wall) is an error, not data."""
    client, _ = make_client(httpx.Response(200, text="<html>Please accept cookies</html>"))
    with pytest.raises(CloudError, match="not a JSON envelope") as caught:
        client.get_job(1)
    assert type(caught.value) is CloudError


def test_data_of_the_wrong_shape_is_an_error(make_client: MakeClient) -> None:
    """A job answer whose data is not an object raises instead of building a broken job."""
    client, _ = make_client(envelope("ok"))
    with pytest.raises(CloudError, match="expected a JSON object"):
        client.get_job(1)


def test_server_errors_and_rate_limits_have_their_own_types(make_client: MakeClient) -> None:
    """5xx and 429 map to their classes once retries are spent."""
    from sync.cloud.policy import RetryPolicy

    client, _ = make_client(failure(502), retry=RetryPolicy(max_attempts=1))
    with pytest.raises(CloudServerError) as server:
        client.get_job(1)
    assert server.value.status == 502

    client, _ = make_client(
        failure(429, {"success": False, "error": "Too Many Attempts."}, {"Retry-After": "600"}),
    )
    with pytest.raises(CloudRateLimitedError) as limited:
        client.get_job(1)
    assert limited.value.status == 429
    assert limited.value.error == "Too Many Attempts."


def test_connection_errors_become_transport_errors(make_client: MakeClient) -> None:
    """A refused connection surfaces as CloudTransportError with the call named, never raw httpx."""
    from sync.cloud.policy import RetryPolicy

    client, _ = make_client(
        httpx.ConnectError("[Errno 111] Connection refused"), retry=RetryPolicy(max_attempts=1)
    )
    with pytest.raises(CloudTransportError) as caught:
        client.get_job(5)
    assert caught.value.status is None
    assert caught.value.request_sent is False
    assert str(caught.value).startswith("GET scraping-job/5: ConnectError:")
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None


def test_scraping_job_fields_and_states(make_client: MakeClient) -> None:
    """A job object keeps Cloud's counters and says whether it is running or terminal."""
    raw: dict[str, Any] = {
        "id": 500,
        "custom_id": None,
        "sitemap_name": "products",
        "status": "waiting-to-be-scheduled",
        "sitemap_id": 123,
        "test_run": 0,
        "jobs_scheduled": 10,
        "jobs_executed": 8,
        "jobs_failed": 1,
        "jobs_empty": 2,
        "jobs_no_value": 3,
        "stored_record_count": 77,
        "request_interval": 2000,
        "page_load_delay": 2000,
        "driver": "fast",
        "scheduled": 0,
        "time_created": "1493370624",
        "scraping_duration": 12,
    }
    client, script = make_client(envelope(raw), envelope({**raw, "status": "shelved"}))
    job = client.get_job(500)
    assert script.requests[0].url.path == "/api/v1/scraping-job/500"
    assert (job.id, job.sitemap_id, job.sitemap_name, job.custom_id) == (500, 123, "products", None)
    assert job.time_created == 1493370624
    assert (job.jobs_scheduled, job.jobs_executed, job.jobs_failed) == (10, 8, 1)
    assert (job.jobs_empty, job.jobs_no_value, job.stored_record_count) == (2, 3, 77)
    assert job.scraping_duration == 12
    assert job.is_running
    assert not job.is_terminal
    shelved = client.get_job(500)
    assert shelved.is_terminal
    assert not shelved.is_running


def test_errors_survive_pickling_with_their_fields() -> None:
    """Errors cross process boundaries (RQ, multiprocessing) with status and retry hint intact."""
    import pickle

    from sync.cloud.errors import ApiBudgetExhaustedError, DownloadIncompleteError

    errors: list[CloudError] = [
        CloudValidationError("POST x: HTTP 422", status=422, validation_errors={"a": ["b"]}),
        CloudRateLimitedError("GET x: HTTP 429", status=429, retry_after=30.0),
        CloudTransportError("GET x: ConnectError", request_sent=False),
        DownloadIncompleteError("GET x/json: gzip stream ends early", retry_after=1.5),
        ApiBudgetExhaustedError("budget spent", retry_after=12.0),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes, just made
        assert type(copy) is type(error)
        assert vars(copy) == vars(error)
        assert str(copy) == str(error)


def test_ids_must_be_ints(make_client: MakeClient) -> None:
    """A webhook's string job id is refused before any request, not sent as a path."""
    client, script = make_client()
    with pytest.raises(TypeError, match="ints"):
        client.get_job("42")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not one string"):
        client.create_job(sitemap_id=1, start_urls="https://x.test/")
    assert script.requests == []


def test_a_create_answer_without_an_id_is_an_error(make_client: MakeClient) -> None:
    """create_job never returns a made-up id when Cloud's answer lacks one."""
    client, _ = make_client(envelope({"custom_id": "run-1"}))
    with pytest.raises(CloudError, match="without a job id"):
        client.create_job(sitemap_id=1)
