"""``GET /api/events``: the pull feed, behind the read (or status) token.

``?after=EVENT_ID`` (the ``next`` of the page before; omit it to start where the kept history
starts), ``&limit=N`` (default 100, at most 1000), ``&destination=NAME`` (only the events of
that destination's datasets, signed with its secret alone). The rules are
:mod:`sync.delivery.feed`'s.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request

from sync.delivery import feed
from webhooks import services_of
from webhooks.status import _private, _refusal

bp = Blueprint("events", __name__)


@bp.get("/api/events")
def events_json() -> Any:
    """One page of the outbox's events, each with its body and signed headers."""
    refusal = _refusal()
    if refusal is not None:
        return refusal
    limit_text = request.args.get("limit", str(feed.DEFAULT_LIMIT))
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= feed.MAX_LIMIT:
        response = jsonify(
            error="Bad Request", detail=f"limit must be a whole number from 1 to {feed.MAX_LIMIT}"
        )
        response.status_code = 400
        return _private(response)
    try:
        page = feed.page(
            services_of(current_app),
            after=request.args.get("after") or None,
            limit=int(limit_text),
            destination=request.args.get("destination") or None,
        )
    except feed.FeedError as exc:
        response = jsonify(error="Not Found", detail=str(exc), history=exc.history)
        response.status_code = 404
        return _private(response)
    return _private(jsonify(page.as_dict()))
