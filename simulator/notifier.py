"""Cloud's finished-job notification: an unsigned form POST, retried twice, at least once.

On entry to ``finished``, ``failed`` or ``stopped`` Cloud POSTs
``application/x-www-form-urlencoded`` fields ``scrapingjob_id``, ``status``, ``sitemap_id``,
``sitemap_name`` and ``custom_id`` (``""`` when unset) to the account's notification URL. An
attempt succeeds on a 2xx answer within the timeout (10 s); anything else (status >= 300, a
timeout, a connection error) is retried after ``delays[0]`` (5 s) and then ``delays[1]`` (10 s),
three attempts in all. Each delivery runs on its own daemon thread, so one slow receiver never
holds up another job's notification. The URL, delays and timeout are read when the delivery
starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx


class Notifier:
    """Sends scraping-job notifications in the background and records every attempt."""

    def __init__(
        self,
        *,
        url: str | None = None,
        delays: Sequence[float] = (5.0, 10.0),
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.delays: tuple[float, ...] = tuple(delays)
        self.timeout = timeout
        self.clock = clock
        self.sent: list[dict[str, Any]] = []
        self._transport = transport
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._deliveries = 0
        self._closing = threading.Event()

    def deliver(self, form: Mapping[str, str]) -> bool:
        """Queue one delivery of a notification form; return False when no URL is configured."""
        url = self.url
        if not url or self._closing.is_set():
            return False
        with self._lock:
            self._pending += 1
            self._deliveries += 1
            delivery = self._deliveries
        worker = threading.Thread(
            target=self._run,
            args=(delivery, url, dict(form), self.delays, self.timeout),
            name=f"sim-notify-{form.get('scrapingjob_id', '?')}-{delivery}",
            daemon=True,
        )
        worker.start()
        return True

    def wait(self, timeout: float = 5.0) -> bool:
        """Block until every queued delivery has finished its attempts; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)

    @property
    def pending(self) -> int:
        """Return how many deliveries are still running."""
        with self._lock:
            return self._pending

    def close(self, timeout: float = 2.0) -> None:
        """Stop retrying, let in-flight attempts end, and close the HTTP client."""
        self._closing.set()
        self.wait(timeout)
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _http(self) -> httpx.Client:
        """Return the shared HTTP client, creating it on first use."""
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(transport=self._transport, trust_env=False)
            return self._client

    def _run(
        self,
        delivery: int,
        url: str,
        form: dict[str, str],
        delays: tuple[float, ...],
        timeout: float,
    ) -> None:
        """Make up to len(delays) + 1 attempts, sleeping the delays between failures."""
        try:
            for attempt in range(1, len(delays) + 2):
                if self._attempt(delivery, attempt, url, form, timeout):
                    return
                if attempt > len(delays) or self._closing.wait(delays[attempt - 1]):
                    return
        finally:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    def _attempt(
        self, delivery: int, attempt: int, url: str, form: dict[str, str], timeout: float
    ) -> bool:
        """POST the form once and record the outcome; True when the receiver acknowledged."""
        started = time.monotonic()
        status: int | None = None
        error: str | None = None
        try:
            response = self._http().post(url, data=form, timeout=timeout)
            status = response.status_code
        except Exception as exc:  # any failure to deliver is Cloud's "retry later"
            error = f"{type(exc).__name__}: {exc}"
        elapsed = time.monotonic() - started
        ok = status is not None and 200 <= status < 300
        if ok and elapsed > timeout:
            ok, error = False, f"answered after {elapsed:.3f} s, past the {timeout} s timeout"
        with self._lock:
            self.sent.append(
                {
                    "delivery": delivery,
                    "attempt": attempt,
                    "form": dict(form),
                    "http_status": status,
                    "error": error,
                    "ok": ok,
                    "at": self.clock(),
                    "elapsed": round(elapsed, 4),
                }
            )
        return ok
