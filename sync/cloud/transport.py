"""How the API token reaches Cloud and nowhere else.

The token is added as the `api_token` query parameter by the innermost transport only, so no
URL that httpx logs or puts in an exception carries it; a filter on the "httpx" logger scrubs
any line that would.
"""

from __future__ import annotations

import logging

import httpx

from sync import secrecy


def install_log_redaction() -> None:
    """Scrub every secret from the lines the httpx logger writes (idempotent)."""
    httpx_logger = logging.getLogger("httpx")
    if not any(isinstance(f, secrecy.ScrubbingFilter) for f in httpx_logger.filters):
        httpx_logger.addFilter(secrecy.ScrubbingFilter())


class Secret:
    """The API token, shown as *** wherever it is printed."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The token itself, for the one place that puts it on the wire."""
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__


class TokenTransport(httpx.BaseTransport):
    """Adds api_token on the way to the wire, so no URL above this layer carries the token."""

    def __init__(self, inner: httpx.BaseTransport, token: Secret) -> None:
        self._inner = inner
        self._token = token

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send a copy of the request with api_token set; the caller's request stays clean."""
        wire = httpx.Request(
            request.method,
            request.url.copy_set_param("api_token", self._token.reveal()),
            headers=request.headers,
            stream=request.stream,
            extensions=request.extensions,
        )
        return self._inner.handle_request(wire)

    def close(self) -> None:
        """Close the wrapped transport."""
        self._inner.close()

    def __repr__(self) -> str:
        return f"<TokenTransport api_token=*** inner={type(self._inner).__name__}>"
