"""Outgoing HTTP clients (deliveries, alerts, pings, Cloud) that share one TLS context per
process: the certificate authorities are loaded once, not again for each client, which each
delivery, alert or sync of a small job would otherwise pay (about 10 ms, more than the rest of
making the client)."""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls() -> ssl.SSLContext:
    """The TLS settings every client of this process shares."""
    return httpx.create_ssl_context()


def transport(given: httpx.BaseTransport | None = None) -> httpx.BaseTransport:
    """``given`` (a test's or a drill's), or a transport with the shared TLS settings."""
    return given if given is not None else httpx.HTTPTransport(verify=tls())


def client(
    *, timeout: float, user_agent: str, given: httpx.BaseTransport | None = None
) -> httpx.Client:
    """A client that never follows redirects (a redirect is the destination's answer), sends
    ``user_agent`` and gives up after ``timeout`` seconds."""
    return httpx.Client(
        transport=transport(given),
        timeout=timeout,
        follow_redirects=False,
        headers={"user-agent": user_agent},
    )
