"""Exports stream line by line; a body cut short raises instead of yielding a truncated dataset."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Generator

import httpx
import pytest

from sync.cloud.client import CloudClient
from sync.cloud.errors import CloudError, CloudNotFoundError, DownloadIncompleteError
from sync.cloud.policy import RetryPolicy
from tests.cloud.conftest import (
    ChunkStream,
    FakeClock,
    Scripted,
    download,
    failure,
    jsonl,
)

MakeClient = Callable[..., tuple[CloudClient, Scripted]]

RECORDS = [
    {"web-scraper-order": "1614248295-1", "web-scraper-start-url": "https://x.test/a", "sku": "A1"},
    {"web-scraper-order": "1614248295-2", "web-scraper-start-url": "https://x.test/b", "sku": "B2"},
    {"web-scraper-order": "1614248295-3", "web-scraper-start-url": "https://x.test/c", "sku": "C3"},
]


def test_records_stream_from_gzip_json_lines(make_client: MakeClient) -> None:
    """The JSON export is asked for with gzip and parsed line by line, escaped slashes included."""
    body = jsonl(RECORDS)
    assert b"https:\\/\\/x.test\\/a" in body
    client, script = make_client(download(body))
    assert list(client.iter_records(5)) == RECORDS
    request = script.requests[0]
    assert request.url.path == "/api/v1/scraping-job/5/json"
    assert request.headers["Accept-Encoding"] == "gzip"


def test_blank_lines_and_a_missing_final_newline_are_tolerated(make_client: MakeClient) -> None:
    """Blank lines are skipped and a complete last line without its newline still counts."""
    body = b"\n" + jsonl(RECORDS[:2]) + b"\r\n\n" + jsonl(RECORDS[2:]).rstrip(b"\n")
    client, _ = make_client(download(body))
    assert list(client.iter_records(5)) == RECORDS


def test_identity_encoding_is_read_as_is(make_client: MakeClient) -> None:
    """A server that ignores Accept-Encoding still streams correctly."""
    client, _ = make_client(download(jsonl(RECORDS), gzipped=False))
    assert list(client.iter_records(5)) == RECORDS


def test_an_empty_export_has_no_records(make_client: MakeClient) -> None:
    """A job with no data yields nothing (Cloud answers 200 with an empty body)."""
    client, _ = make_client(download(b"", gzipped=False))
    assert list(client.iter_records(5)) == []


def test_a_gzip_stream_cut_short_raises(make_client: MakeClient) -> None:
    """An incomplete gzip stream that ends cleanly at the socket is still detected."""
    wire = gzip.compress(jsonl(RECORDS * 50))
    cut = wire[: len(wire) - 12]  # keeps whole lines decodable, loses the gzip trailer
    response = httpx.Response(200, headers={"Content-Encoding": "gzip"}, stream=ChunkStream([cut]))
    client, _ = make_client(response, retry=RetryPolicy(max_attempts=1))
    with pytest.raises(DownloadIncompleteError, match="gzip stream ends early"):
        list(client.iter_records(5))


def test_fewer_bytes_than_content_length_raises(make_client: MakeClient) -> None:
    """A body shorter than its Content-Length raises even when it ends on a line break."""
    body = jsonl(RECORDS)
    client, _ = make_client(
        download(body, gzipped=False, content_length=len(body) + 50),
        retry=RetryPolicy(max_attempts=1),
    )
    with pytest.raises(DownloadIncompleteError, match="Content-Length"):
        list(client.iter_records(5))


def test_a_partial_last_line_raises(make_client: MakeClient) -> None:
    """A last line that is not valid JSON is a cut body, never a silently dropped record."""
    body = jsonl(RECORDS)[:-9]
    client, _ = make_client(download(body, gzipped=False), retry=RetryPolicy(max_attempts=1))
    seen: list[dict[str, object]] = []
    with pytest.raises(DownloadIncompleteError, match="last line is cut short"):
        seen.extend(client.iter_records(5))
    assert seen == RECORDS[:2]


def test_a_read_error_after_records_raises_without_retrying(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """Once records were yielded a dropped connection raises; it does not restart silently."""
    body = jsonl(RECORDS)
    client, script = make_client(
        download(body[:-5] + b"", gzipped=False, fail=httpx.ReadError("connection reset")),
    )
    seen: list[dict[str, object]] = []
    with pytest.raises(DownloadIncompleteError, match="connection lost") as caught:
        seen.extend(client.iter_records(5))
    assert seen == RECORDS[:2]
    assert len(script.requests) == 1
    assert clock.sleeps == []
    assert caught.value.retry_after is not None
    assert caught.value.__context__ is None


def test_a_download_failing_before_any_record_is_retried(
    make_client: MakeClient, clock: FakeClock
) -> None:
    """A 503, a reset, or a cut before the first record are retried from the start."""
    body = jsonl(RECORDS)
    client, script = make_client(
        failure(503),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        download(body[:10], gzipped=False, fail=httpx.ReadError("reset")),
        download(body),
    )
    assert list(client.iter_records(5)) == RECORDS
    assert len(script.requests) == 4
    assert len(clock.sleeps) == 3


class BodyTap:
    """A PieceTap that keeps what it saw."""

    def __init__(self) -> None:
        self.body = b""
        self.restarts = 0

    def restart(self) -> None:
        self.body = b""
        self.restarts += 1

    def feed(self, data: bytes) -> None:
        self.body += data


def test_a_tap_sees_the_body_once_however_often_the_download_was_tried(
    make_client: MakeClient,
) -> None:
    """A tap sees the body gunzipped as it comes, and starts over with each try: what it saw of
    a try that failed before its first line is not in what it holds at the end."""
    body = jsonl(RECORDS) + b"\n\n" + b"x" * 40 + b"\n" + jsonl(RECORDS[:1])
    client, _ = make_client(
        download(body[:10], gzipped=False, fail=httpx.ReadError("reset")),
        download(body),
    )
    tap = BodyTap()
    lines = list(client.export_lines(5, tap=tap))
    assert b"".join(line + b"\n" for line in lines if isinstance(line, bytes)) == body
    assert tap.body == body
    assert tap.restarts == 2


def test_a_missing_job_download_is_not_found(make_client: MakeClient) -> None:
    """Downloading an unknown job raises CloudNotFoundError at once."""
    client, script = make_client(failure(404))
    with pytest.raises(CloudNotFoundError, match=r"GET scraping-job/5/json: HTTP 404"):
        list(client.iter_records(5))
    assert len(script.requests) == 1


def test_a_malformed_line_in_the_middle_is_an_error(make_client: MakeClient) -> None:
    """A broken line that is not the last one is a corrupt export, reported by line number."""
    body = jsonl(RECORDS[:1]) + b"{not json}\n" + jsonl(RECORDS[1:])
    client, _ = make_client(download(body))
    with pytest.raises(CloudError, match="line 2 is not a JSON object") as caught:
        list(client.iter_records(5))
    assert not isinstance(caught.value, DownloadIncompleteError)


def test_the_response_is_released_when_the_caller_stops_early(make_client: MakeClient) -> None:
    """Abandoning the iterator closes the HTTP body."""
    stream = ChunkStream([jsonl(RECORDS)])
    client, _ = make_client(httpx.Response(200, stream=stream))
    records = client.iter_records(5)
    assert isinstance(records, Generator)
    assert next(records) == RECORDS[0]
    records.close()
    assert stream.closed
