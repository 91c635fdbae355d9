"""The doubles every test package shares: a clock the test moves by hand, and an HTTP receiver
that records what the code under test sent it and answers from a plan."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

import httpx

START = 1_700_000_000.0  # the fake clock's first reading, in epoch seconds


@dataclass
class FakeClock:
    """A clock the test moves by hand; when the code under test sleeps on it, the wait is
    recorded and time moves forward instead."""

    now: float = START
    sleeps: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        """Return the current fake time."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        """Record the wait and move time forward instead of sleeping."""
        self.sleeps.append(seconds)
        self.advance(seconds)


def verify_signature(secret: str, headers: httpx.Headers, body: bytes) -> bool:
    """Standard Webhooks verification, written apart from the sender's code: the key is the
    base64 after ``whsec_`` (raw text otherwise), the signed content ``id.timestamp.body``, and
    the header a space-separated list of ``v1,<base64>`` signatures."""
    key = base64.b64decode(secret.split("_", 1)[1]) if secret.startswith("whsec_") else secret
    key_bytes = key if isinstance(key, bytes) else key.encode()
    content = b".".join(
        [headers["webhook-id"].encode(), headers["webhook-timestamp"].encode(), body]
    )
    expected = base64.b64encode(hmac.new(key_bytes, content, hashlib.sha256).digest()).decode()
    for candidate in headers["webhook-signature"].split(" "):
        version, _, signature = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(signature, expected):
            return True
    return False


@dataclass
class Delivered:
    """One request the receiver got: when (monotonic seconds), its headers and raw content, and
    whether its signature verified against the receiver's secret."""

    at: float
    headers: httpx.Headers
    content: bytes
    signed: bool

    @property
    def form(self) -> dict[str, str]:
        """The urlencoded form it carried (Cloud's notifications)."""
        return dict(parse_qsl(self.content.decode(), keep_blank_values=True))

    @property
    def body(self) -> dict[str, Any]:
        """The JSON document it carried (outbox events)."""
        document: dict[str, Any] = json.loads(self.content)
        return document

    @property
    def event_id(self) -> str:
        """The event's webhook-id."""
        return self.headers["webhook-id"]

    @property
    def event_type(self) -> str:
        """The event's type."""
        return str(self.body["type"])

    @property
    def timestamp(self) -> str:
        """The event's webhook-timestamp."""
        return self.headers["webhook-timestamp"]


Answer = int | Exception | Callable[[], httpx.Response]


class _QuietServer(ThreadingHTTPServer):
    """A loopback server whose handler threads never print a traceback. Python 3.11 formats
    one with ``ast.parse``, which is not safe beside another thread's parse (the test's own
    thread may be parsing at that moment): a stalled answer written after a test ended once
    failed the next test's setup with "AST constructor recursion depth mismatch"."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Say nothing: a sender that gave up waiting (its timeout) is what the test arranged,
        and what the request did is in the receiver's record."""


@dataclass
class Receiver:
    """An HTTP endpoint the code under test sends to. It records every request (checking the
    Standard Webhooks signature on its own when it has the ``secret``), waits ``delay`` seconds
    (and ``stall_seconds`` on the requests numbered, from 1, in ``stall``), then answers from
    ``plan`` (status codes, exceptions to raise, response factories) and after that ``status``.

    Reach it in process as ``httpx.MockTransport(receiver)``, or on a loopback socket inside
    ``with receiver.serve():``, which sets ``url``."""

    secret: str | None = None
    status: int = 204
    plan: list[Answer] = field(default_factory=list)
    delay: float = 0.0
    stall: set[int] = field(default_factory=set)
    stall_seconds: float = 1.0
    requests: list[Delivered] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        """Record the request, wait if told to, and answer the next step of the plan."""
        content = request.read()
        signed = self.secret is not None and verify_signature(self.secret, request.headers, content)
        with self.lock:
            self.requests.append(Delivered(time.monotonic(), request.headers, content, signed))
            number = len(self.requests)
            step = self.plan.pop(0) if self.plan else self.status
        if self.delay:
            time.sleep(self.delay)
        if number in self.stall:
            time.sleep(self.stall_seconds)
        if isinstance(step, Exception):
            raise step
        if callable(step):
            return step()
        if step == 204:
            return httpx.Response(204)
        return httpx.Response(step, text="ok" if step < 300 else "no thanks")

    @property
    def events(self) -> dict[str, str]:
        """What the receiver acted on: event id -> type, each id once."""
        return {r.event_id: r.event_type for r in self.requests}

    def of_type(self, event_type: str) -> list[Delivered]:
        """The requests of one event type."""
        return [r for r in self.requests if r.event_type == event_type]

    @property
    def arrivals(self) -> list[tuple[float, dict[str, str]]]:
        """When each form arrived (monotonic seconds) and what it said."""
        return [(r.at, r.form) for r in self.requests]

    @contextmanager
    def serve(self, path: str = "/hooks") -> Iterator[str]:
        """Listen on a loopback port for the block; yields (and sets) the URL of ``path``."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                """Hand the request to the receiver and write back its answer."""
                content = self.rfile.read(int(self.headers.get("content-length", "0")))
                request = httpx.Request(
                    "POST", self.path, headers=list(self.headers.items()), content=content
                )
                answer = receiver(request)
                body = answer.read()
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in ("content-length", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Keep test output clean."""

        server = _QuietServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
        thread.start()
        self.url = f"http://127.0.0.1:{server.server_port}{path}"
        try:
            yield self.url
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
