"""``GET /api/changes``: every change a publication made, page by page, behind the status token.

A ``dataset.changed`` event names its publication's ``changes_path``; a receiver that got a
summary (a baseline, or more changes than travel inline) or that was away fetches them here:
``?dataset=NAME`` (required), ``&run=RUN_ID`` (default: the last publication), ``&after=CURSOR``
(the ``next`` of the page before), ``&limit=N`` (default 1000, at most 10000).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request

from config.datasets import DatasetsFileError
from sync.datasets import diff
from webhooks import services_of
from webhooks.status import _private, _refusal

bp = Blueprint("changes", __name__)

DEFAULT_LIMIT = 1000


def _bad_request(detail: str, status: int = 400) -> Any:
    response = jsonify(error="Bad Request" if status == 400 else "Not Found", detail=detail)
    response.status_code = status
    return _private(response)


@bp.get("/api/changes")
def changes_json() -> Any:
    """One page of a publication's changes, with the cursor of the next page."""
    refusal = _refusal()
    if refusal is not None:
        return refusal
    services = services_of(current_app)
    name = request.args.get("dataset", "")
    if not name:
        known = ", ".join(sorted(services.datasets.by_name)) or "none"
        return _bad_request(f"name the dataset: /api/changes?dataset=NAME (known: {known})")
    limit_text = request.args.get("limit", str(DEFAULT_LIMIT))
    if not limit_text.isdigit() or int(limit_text) < 1:
        return _bad_request("limit must be a whole number of at least 1")
    try:
        dataset = services.datasets.get(name)
    except DatasetsFileError as exc:
        return _bad_request(str(exc), 404)
    try:
        with services.uow.begin() as session:
            page = diff.change_page(
                session,
                dataset,
                schema=services.settings.data_schema,
                run_id=request.args.get("run") or None,
                after=request.args.get("after") or None,
                limit=int(limit_text),
            )
    except diff.DiffError as exc:
        return _bad_request(str(exc), 404)
    return _private(jsonify(page.as_dict()))
