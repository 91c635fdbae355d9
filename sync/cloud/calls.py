"""Calls and downloads to Web Scraper Cloud, each retried by failure class under the API budget.

Every failed call raises a `sync.cloud.errors.CloudError`; `sync.cloud.policy.RetryPolicy`
alone decides what is retried inline and what is handed back with `retry_after` set. Downloads
are retried only while nothing has been yielded (`sync.cloud.download` turns a body into lines).

Secrecy: every error message passes through `sync.secrecy.scrub` (which knows the token and
every other configured secret), and errors are raised without chaining httpx's exceptions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from sync import retry, secrecy
from sync.cloud.budget import ApiBudget
from sync.cloud.download import Line, PieceTap, body_blocks
from sync.cloud.errors import CloudError, CloudRateLimitedError, CloudTransportError, error_for
from sync.cloud.policy import RetryPolicy
from sync.cloud.transport import Secret

logger = logging.getLogger("sync.client")  # the name operators filter these lines on

_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def _header_float(headers: httpx.Headers, name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return float(value.strip())
    except ValueError:
        return None


class CloudCalls:
    """Calls and downloads over one httpx.Client: typed errors, retries, the shared budget."""

    def __init__(
        self,
        http: httpx.Client,
        secret: Secret,
        *,
        budget: ApiBudget | None,
        retry: RetryPolicy,
        download_timeout: httpx.Timeout,
        max_line_bytes: int,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        self._http = http
        self._secret = secret
        self._budget = budget
        self._retry = retry
        self._download_timeout = download_timeout
        self._max_line_bytes = max_line_bytes
        self._sleep = sleep
        self._clock = clock

    # --- JSON calls ---------------------------------------------------------------------------

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        idempotent: bool = True,
    ) -> dict[str, Any]:
        """Cloud's answer to one API call (its whole envelope), retried as the policy says."""
        started = self._clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._call_once(method, path, params=params, body=body)
            except CloudError as exc:
                failure = exc
            wait = self._retry.delay(failure, attempt, idempotent=idempotent)
            self._wait_or_raise(failure, wait, attempt, started, method, path)

    def _call_once(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None,
        body: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        self._acquire()
        request = self._http.build_request(method, path, params=params, json=body)
        response = self._send(request, method, path, stream=False)
        self._observe(response)
        payload = self._payload(response)
        if response.status_code == 200 and payload is not None and payload.get("success") is True:
            return payload
        raise self._error(response, payload, method, path)

    # --- downloads ----------------------------------------------------------------------------

    def download_blocks(
        self, path: str, *, final_line_ok: Callable[[str], bool], tap: PieceTap | None = None
    ) -> Iterator[list[Line]]:
        """A download's lines a piece at a time, tried again whole until its first line."""
        started = self._clock()
        attempt = 0
        yielded = False
        while True:
            attempt += 1
            if tap is not None:  # a try that failed before its first line is tried again whole
                tap.restart()
            try:
                for block in self._download_once(
                    path, final_line_ok, tap.feed if tap is not None else None
                ):
                    yielded = True
                    yield block
                return
            except CloudError as exc:
                failure = exc
            wait = self._retry.delay(failure, attempt)
            if yielded:  # the caller holds part of a dataset: only it can start over
                failure.retry_after = wait
                raise failure
            self._wait_or_raise(failure, wait, attempt, started, "GET", path)

    def _download_once(
        self,
        path: str,
        final_line_ok: Callable[[str], bool],
        tap: Callable[[bytes], None] | None = None,
    ) -> Iterator[list[Line]]:
        self._acquire()
        request = self._http.build_request(
            "GET", path, headers={"Accept-Encoding": "gzip"}, timeout=self._download_timeout
        )
        response = self._send(request, "GET", path, stream=True)
        try:
            self._observe(response)
            if response.status_code != 200:
                payload = self._payload(response)
                raise self._error(response, payload, "GET", path)
            yield from body_blocks(
                response,
                path,
                final_line_ok=final_line_ok,
                limit=self._max_line_bytes,
                scrub=self._scrub,
                tap=tap,
            )
        finally:
            response.close()

    # --- shared steps -------------------------------------------------------------------------

    def _wait_or_raise(
        self,
        failure: CloudError,
        wait: float | None,
        attempt: int,
        started: float,
        method: str,
        path: str,
    ) -> None:
        elapsed = self._clock() - started
        if wait is None or not self._retry.retry_inline(wait, attempt=attempt, elapsed=elapsed):
            if not (isinstance(failure, CloudRateLimitedError) and failure.retry_after is None):
                failure.retry_after = wait
            # else Cloud named no wait: retry_after stays None, and the caller backs off by how
            # many times in a row it was refused
            raise failure
        logger.warning(
            "%s %s: %s; retrying in %.2f s (attempt %d of %d)",
            method,
            path,
            type(failure).__name__,
            wait,
            attempt,
            self._retry.max_attempts,
        )
        self._sleep(wait)

    def _acquire(self) -> None:
        if self._budget is not None:
            self._budget.acquire()

    def _send(
        self, request: httpx.Request, method: str, path: str, *, stream: bool
    ) -> httpx.Response:
        try:
            return self._http.send(request, stream=stream)
        except _NOT_SENT as exc:
            failure = CloudTransportError(self._describe(method, path, exc), request_sent=False)
        except (httpx.HTTPError, OSError) as exc:
            failure = CloudTransportError(self._describe(method, path, exc), request_sent=True)
        raise failure

    def _observe(self, response: httpx.Response) -> None:
        if self._budget is None:
            return
        remaining = _header_float(response.headers, "X-RateLimit-Remaining")
        limit = _header_float(response.headers, "X-RateLimit-Limit")
        reset_at = _header_float(response.headers, "X-RateLimit-Reset")
        if remaining is None and limit is None and reset_at is None:
            return
        self._budget.observe(
            remaining=None if remaining is None else int(remaining),
            limit=None if limit is None else int(limit),
            reset_at=reset_at,
        )

    def _payload(self, response: httpx.Response) -> dict[str, Any] | None:
        try:
            payload = json.loads(response.read())
        except (httpx.HTTPError, OSError, ValueError):
            return None
        return payload if isinstance(payload, dict) else None

    def _error(
        self,
        response: httpx.Response,
        payload: Mapping[str, Any] | None,
        method: str,
        path: str,
    ) -> CloudError:
        return error_for(
            response.status_code,
            payload,
            request=f"{method} {path}",
            retry_after=self._server_wait(response.headers),
            scrub=self._scrub,
        )

    def _server_wait(self, headers: httpx.Headers) -> float | None:
        """Seconds Cloud asked us to wait: Retry-After (seconds or HTTP-date), else the reset."""
        wait = retry.retry_after(headers.get("Retry-After"), now=self._clock())
        if wait is not None:
            return wait
        reset_at = _header_float(headers, "X-RateLimit-Reset")  # sent only once the limit is hit
        if reset_at is not None:
            return max(0.0, reset_at - self._clock())
        return None

    def _describe(self, method: str, path: str, exc: BaseException) -> str:
        detail = self._scrub(str(exc))
        kind = type(exc).__name__
        return f"{method} {path}: {kind}: {detail}" if detail else f"{method} {path}: {kind}"

    def _scrub(self, text: str) -> str:
        return secrecy.scrub(text).replace(self._secret.reveal(), secrecy.MASK)
