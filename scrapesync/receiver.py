"""A stand-in for a system that subscribes to scrapesync's announcements: a loopback HTTP server
that checks each POST's Standard Webhooks signature and counts each event id it receives (a
repeat under the same id is the outbox's at-least-once contract, applied once by the key)."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sync.delivery import destinations


class Receiver:
    """Takes signed announcements on a free loopback port and remembers them by event id."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.received: Counter[str] = Counter()
        self.bad_signatures = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        """Serve in the background; returns the URL to post to."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            """Records each announcement and answers 204."""

            def do_POST(self) -> None:
                """Take one signed announcement."""
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.take(dict(self.headers.items()), body)
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                """Log nothing."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_port}/hooks/scrapesync"

    def take(self, headers: dict[str, str], body: bytes) -> None:
        """Count one announcement under its event id, and whether its signature holds."""
        lowered = {k.lower(): v for k, v in headers.items()}
        event_id = lowered.get("webhook-id", "")
        stamp = lowered.get("webhook-timestamp", "0")
        expected = destinations.sign(
            destinations.signing_key(self.secret), event_id, int(stamp), body
        )
        with self._lock:
            self.received[event_id] += 1
            if lowered.get("webhook-signature") != expected:
                self.bad_signatures += 1

    def snapshot(self) -> tuple[Counter[str], int]:
        """The event ids received so far (with how often each came) and the bad signatures."""
        with self._lock:
            return Counter(self.received), self.bad_signatures

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
