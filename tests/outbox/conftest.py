"""Fixtures for delivery: the acceptance fixtures, and a real loopback receiver for what only a
socket can show (a timeout after the request was received)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.acceptance.conftest import datasets, receiver  # noqa: F401 - shared fixtures
from tests.acceptance.flow import SECRET, verify_signature


@dataclass
class Loopback:
    """An HTTP receiver on 127.0.0.1 that records each request, and stalls on the requests
    listed in ``stall`` (by their 1-based number) for ``stall_seconds`` before answering."""

    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    stall: set[int] = field(default_factory=set)
    stall_seconds: float = 1.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, headers: dict[str, str], body: bytes) -> int:
        """Remember one request; its number."""
        with self.lock:
            self.received.append(
                {
                    "id": headers.get("webhook-id"),
                    "type": json.loads(body)["type"],
                    "signed": verify_signature(SECRET, httpx.Headers(headers), body),
                }
            )
            return len(self.received)


@pytest.fixture
def loopback() -> Iterator[Loopback]:
    """A real HTTP receiver on a loopback port."""
    state = Loopback()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            """Record the event, stall if told to, then answer 204."""
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            number = state.record({k.lower(): v for k, v in self.headers.items()}, body)
            if number in state.stall:
                time.sleep(state.stall_seconds)
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            """Keep test output clean."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}/hooks"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
