"""Who may see what: the two tokens of the web process.

- ``SCRAPESYNC_READ_TOKEN`` opens what only reads: ``/status`` (without its actions),
  ``/api/runs``, ``/api/events``, ``/api/changes`` and ``/metrics``.
- ``SCRAPESYNC_STATUS_TOKEN`` opens all of that and every action.

Either is carried as ``?token=``, as ``Authorization: Bearer <token>``, or as the password of
HTTP basic auth (any user name), so a browser can simply ask for it. Without either token
configured the pages are off (403); a wrong or missing token is a 401. Tokens are compared in
constant time and never shown.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from enum import StrEnum

from flask import Response, current_app, jsonify, request

from webhooks import services_of


class Access(StrEnum):
    """What a token lets a request do."""

    READ = "read"
    ACT = "act"


def offered_token() -> str | None:
    """The token the request carries, wherever it carries it."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if scheme.lower() == "basic" and value.strip():
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return request.args.get("token") or None


def _matches(offered: str | None, expected: str | None) -> bool:
    return bool(
        offered is not None
        and expected
        and hmac.compare_digest(offered.encode(), expected.encode())
    )


def granted() -> Access | None:
    """What the request's token opens, if anything."""
    settings = services_of(current_app).settings
    offered = offered_token()
    if _matches(offered, settings.status_token):
        return Access.ACT
    if _matches(offered, settings.read_token):
        return Access.READ
    return None


def refusal(needed: Access = Access.READ) -> Response | None:
    """None when the request may do what ``needed`` says; otherwise the answer saying why not."""
    settings = services_of(current_app).settings
    wanted = [settings.status_token]
    if needed == Access.READ:
        wanted.append(settings.read_token)
    if not any(wanted):
        names = "SCRAPESYNC_STATUS_TOKEN" + (
            " or SCRAPESYNC_READ_TOKEN" if needed == Access.READ else ""
        )
        response = jsonify(error="Forbidden", detail=f"the status pages are off: set {names}")
        response.status_code = 403
        return response
    have = granted()
    if have == Access.ACT or (have == Access.READ and needed == Access.READ):
        return None
    detail = "send the status token" if needed == Access.ACT else "send the read or status token"
    response = jsonify(error="Unauthorized", detail=detail)
    response.status_code = 401
    response.headers["WWW-Authenticate"] = 'Basic realm="scrapesync status", charset="UTF-8"'
    return response
