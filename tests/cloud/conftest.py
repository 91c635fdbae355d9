"""Fixtures for the Cloud client: a fake clock that sleeps by moving time, canned Cloud answers."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from sync.cloud.client import CloudClient
from sync.cloud.policy import RetryPolicy
from tests.conftest import CLIENT_REDIS_URL
from tests.fakes import FakeClock

TOKEN = "tok-SECRET-4f7a9b2c"
BASE_URL = "https://api.webscraper.io/api/v1/"
REDIS_URL = CLIENT_REDIS_URL  # the client tests' own Redis database

Handler = Callable[[httpx.Request], httpx.Response]


class ChunkStream(httpx.SyncByteStream):
    """A response body served in chunks that may end with a dropped connection."""

    def __init__(self, chunks: list[bytes], *, fail: Exception | None = None) -> None:
        self.chunks = chunks
        self.fail = fail
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        """Yield the chunks, then raise the configured failure if any."""
        yield from self.chunks
        if self.fail is not None:
            raise self.fail

    def close(self) -> None:
        """Remember that the client released the body."""
        self.closed = True


def envelope(data: Any, **extra: Any) -> httpx.Response:
    """A successful Cloud JSON answer with rate-limit headers."""
    return httpx.Response(
        200,
        json={"success": True, "data": data, **extra},
        headers={"X-RateLimit-Limit": "200", "X-RateLimit-Remaining": "150"},
    )


def failure(status: int, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
    """A Cloud error answer; the body defaults to Cloud's (misspelt) generic error."""
    if body is None:
        body = {"success": False, "error": "An error occured"}
    return httpx.Response(status, json=body, headers=headers or {})


def download(
    body: bytes,
    *,
    gzipped: bool = True,
    chunk: int = 7,
    fail: Exception | None = None,
    content_length: int | None = None,
    status: int = 200,
) -> httpx.Response:
    """An export download streamed in small chunks, gzip by default."""
    wire = gzip.compress(body) if gzipped else body
    headers = {"Content-Type": "application/json"}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    if content_length is not None:
        headers["Content-Length"] = str(content_length)
    chunks = [wire[i : i + chunk] for i in range(0, len(wire), chunk)]
    return httpx.Response(status, headers=headers, stream=ChunkStream(chunks, fail=fail))


def jsonl(records: list[dict[str, Any]]) -> bytes:
    """Records as Cloud's JSON Lines, PHP-style with escaped slashes."""
    lines = [json.dumps(r, separators=(",", ":")).replace("/", "\\/") for r in records]
    return "".join(line + "\n" for line in lines).encode()


@dataclass
class Scripted:
    """A MockTransport handler that answers from a script and records every request."""

    answers: list[Handler | httpx.Response | Exception]
    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        """Answer the next scripted response, raise the next scripted error."""
        self.requests.append(request)
        if not self.answers:
            raise AssertionError(f"unexpected request {request.method} {request.url.path}")
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        return answer(request)

    def done(self) -> bool:
        """Tell whether every scripted answer was used."""
        return not self.answers

    def leftovers(self) -> str:
        """The scripted answers no request used, in words for a failure message."""
        return ", ".join(_describe(answer) for answer in self.answers)


def _describe(answer: Handler | httpx.Response | Exception) -> str:
    if isinstance(answer, httpx.Response):
        return f"response {answer.status_code}"
    if isinstance(answer, Exception):
        return f"{type(answer).__name__}({answer})"
    return f"handler {getattr(answer, '__name__', repr(answer))}"


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock; its sleep records waits instead of sleeping."""
    return FakeClock()


@pytest.fixture
def make_client(clock: FakeClock) -> Iterator[Callable[..., tuple[CloudClient, Scripted]]]:
    """Build a client whose Cloud answers from a script, with a fake clock and sleep; a
    scripted answer that no request used fails the test at teardown."""
    clients: list[CloudClient] = []
    scripts: list[Scripted] = []

    def build(
        *answers: Handler | httpx.Response | Exception, **options: Any
    ) -> tuple[CloudClient, Scripted]:
        script = Scripted(list(answers))
        options.setdefault("retry", RetryPolicy(random=lambda: 0.5))
        client = CloudClient(
            token=TOKEN,
            base_url=BASE_URL,
            transport=httpx.MockTransport(script),
            sleep=clock.sleep,
            clock=clock,
            **options,
        )
        clients.append(client)
        scripts.append(script)
        return client, script

    yield build
    for client in clients:
        client.close()
    unused = [f"client {i}: {s.leftovers()}" for i, s in enumerate(scripts, 1) if not s.done()]
    if unused:
        pytest.fail("scripted Cloud answers never used: " + "; ".join(unused), pytrace=False)


@pytest.fixture
def redis_client() -> Iterator[Any]:
    """A Redis connection on the client tests' own database, emptied before and after."""
    import redis

    conn = redis.Redis.from_url(REDIS_URL)
    conn.flushdb()
    yield conn
    conn.flushdb()
    conn.close()
