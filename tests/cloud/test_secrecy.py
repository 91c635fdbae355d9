"""The API token never shows in a log line, an error message, a traceback or a repr."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

import httpx
import pytest

from sync.cloud.client import CloudClient
from sync.cloud.errors import CloudError
from sync.cloud.policy import RetryPolicy
from tests.cloud.conftest import TOKEN, FakeClock, Scripted, download, envelope, failure, jsonl

MakeClient = Callable[..., tuple[CloudClient, Scripted]]

LEAKY_URL = f"https://api.webscraper.io/api/v1/scraping-job/1?api_token={TOKEN}"


def _everything_about(error: BaseException) -> str:
    """Every way an error can be rendered, chained exceptions included."""
    parts = [str(error), repr(error), "".join(traceback.format_exception(error))]
    parts += [repr(vars(error))]
    return "\n".join(parts)


def test_logs_never_carry_the_token(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """httpx's request lines and the client's retry lines at DEBUG hold no token."""
    caplog.set_level(logging.DEBUG)
    client, _ = make_client(
        failure(500),
        envelope({"id": 1, "status": "finished"}),
        download(jsonl([{"a": 1}])),
        failure(404),
    )
    client.get_job(1)
    list(client.iter_records(1))
    with pytest.raises(CloudError):
        client.get_job(2)
    httpx_lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert len(httpx_lines) == 4
    assert any("retrying" in r.getMessage() for r in caplog.records if r.name == "sync.client")
    assert TOKEN not in caplog.text


def test_httpx_log_lines_with_a_token_are_redacted(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Any httpx log line that does carry api_token (e.g. from another client) is redacted."""
    make_client()
    caplog.set_level(logging.INFO)
    logging.getLogger("httpx").info('HTTP Request: GET %s "HTTP/1.1 200 OK"', LEAKY_URL)
    assert TOKEN not in caplog.text
    assert "api_token=***" in caplog.text


@pytest.mark.parametrize(
    "raised",
    [
        httpx.ConnectError(f"cannot connect to {LEAKY_URL}"),
        httpx.ReadTimeout(f"timed out reading {TOKEN}"),
        OSError(f"reset while talking to {LEAKY_URL}"),
    ],
)
def test_transport_errors_are_redacted_and_unchained(
    make_client: MakeClient, raised: Exception
) -> None:
    """A transport exception quoting the URL or token is rewritten, with no chained original."""
    client, _ = make_client(raised, retry=RetryPolicy(max_attempts=1))
    with pytest.raises(CloudError) as caught:
        client.get_job(1)
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None
    rendered = _everything_about(caught.value)
    assert TOKEN not in rendered
    assert "GET scraping-job/1" in rendered


def test_cloud_error_text_quoting_the_url_is_redacted(make_client: MakeClient) -> None:
    """Cloud's own error or validation text that echoes the token is redacted too."""
    body = {
        "success": False,
        "error": f"bad request {LEAKY_URL}",
        "validationErrors": {"api_token": [f"api_token={TOKEN} is not valid"]},
    }
    client, _ = make_client(failure(400, body))
    with pytest.raises(CloudError) as caught:
        client.get_job(1)
    assert TOKEN not in _everything_about(caught.value)
    assert "api_token=***" in str(caught.value)


def test_cut_download_errors_are_redacted(make_client: MakeClient) -> None:
    """A read error quoting the URL mid-download is raised without the token."""
    client, _ = make_client(
        download(jsonl([{"a": 1}]), gzipped=False, fail=httpx.ReadError(f"lost {LEAKY_URL}")),
    )
    with pytest.raises(CloudError) as caught:
        list(client.iter_records(1))
    assert TOKEN not in _everything_about(caught.value)


def test_client_repr_and_state_hide_the_token(make_client: MakeClient, clock: FakeClock) -> None:
    """repr(client), and the reprs of what it holds, never show the token."""
    client, _ = make_client()
    assert TOKEN not in repr(client)
    assert TOKEN not in repr(vars(client))
    assert TOKEN not in repr(vars(client)["_http"]._transport)
    assert repr(client) == "CloudClient(base_url='https://api.webscraper.io/api/v1/')"


def test_response_urls_seen_by_callers_hold_no_token(make_client: MakeClient) -> None:
    """The token is added below httpx.Client, so request URLs above the wire lack it."""
    seen: list[str] = []

    def hook(response: httpx.Response) -> None:
        seen.append(str(response.request.url))

    client, script = make_client(envelope({"email": "x"}))
    client._http.event_hooks["response"].append(hook)
    client.get_account()
    assert seen == ["https://api.webscraper.io/api/v1/account"]
    assert script.requests[0].url.params["api_token"] == TOKEN
