"""The status page and its JSON twin, behind the status token.

``GET /status`` is an HTML page for a person (each dataset's last publication with what it
added, removed and changed; runs with coloured states, reasons, partition verdicts; an inline
SVG chart of records per run; no JavaScript). ``GET /api/runs`` is the same overview as JSON
for machines. Both open with ``SCRAPESYNC_READ_TOKEN`` or ``SCRAPESYNC_STATUS_TOKEN`` (see
:mod:`webhooks.access` for how a request carries one). Without a configured token the pages are
off (403).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify, render_template, request

from sync.operations import status, status_text
from sync.states import RunState
from webhooks import access, services_of

bp = Blueprint("status", __name__, template_folder="templates")

STATE_COLOURS = {
    RunState.COLLECTING: "#6b7280",
    RunState.CANDIDATE: "#b45309",
    RunState.ACCEPTED: "#2563eb",
    RunState.PUBLISHED: "#15803d",
    RunState.REJECTED: "#b91c1c",
    RunState.QUARANTINED: "#7c2d12",
    RunState.CANCELLED: "#9ca3af",
}
CHART_WIDTH = 760
CHART_HEIGHT = 150
CHART_RUNS = 30


def _refusal() -> Response | None:
    """None when the request may see the status (the read or the status token)."""
    return access.refusal(access.Access.READ)


def _private(response: Response) -> Response:
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def chart(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Bars of records per run, oldest left, coloured by state, as SVG geometry."""
    shown = list(reversed(runs[:CHART_RUNS]))
    top = max([r["observations"] for r in shown] + [r["expected_records"] for r in shown] + [1])
    left, bottom, plot_height = 48, CHART_HEIGHT - 28, CHART_HEIGHT - 48
    slot = (CHART_WIDTH - left - 8) / max(len(shown), 1)
    width = max(4.0, min(48.0, slot * 0.7))
    label_every = max(1, len(shown) // 10)
    bars: list[dict[str, Any]] = []
    for i, run in enumerate(shown):
        height = plot_height * run["observations"] / top
        x = left + i * slot + (slot - width) / 2
        expected = run["expected_records"]
        bars.append(
            {
                "x": round(x, 1),
                "y": round(bottom - height, 1),
                "width": round(width, 1),
                "height": round(height, 1),
                "colour": STATE_COLOURS.get(run["state"], "#6b7280"),
                "label": run["window"] if i % label_every == 0 else "",
                "label_x": round(x + width / 2, 1),
                "expected_y": round(bottom - plot_height * expected / top, 1) if expected else None,
                "title": (
                    f"{run['run_id']}: {run['observations']} records"
                    f" of {expected} expected, {run['state']}"
                ),
            }
        )
    return {
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "left": left,
        "bottom": bottom,
        "top_y": bottom - plot_height,
        "top_value": top,
        "bars": bars,
    }


def charts(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One chart per dataset, each on its own scale: a dataset of 50 records beside one of
    50,000 keeps bars a person can read."""
    by_dataset: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_dataset.setdefault(run["dataset"], []).append(run)
    return [{"dataset": name, **chart(rows)} for name, rows in sorted(by_dataset.items())]


def _dataset_asked() -> str | None:
    """The dataset a request filters by (``?dataset=``), if any."""
    return request.args.get("dataset") or None


@bp.get("/status")
def status_page() -> Any:
    """The operator's status page (HTML)."""
    refusal = _refusal()
    if refusal is not None:
        return refusal
    values = status.overview(services_of(current_app), dataset=_dataset_asked())
    html = render_template(
        "status.html",
        o=values,
        charts=charts(values["runs"]),
        colours=STATE_COLOURS,
        duration=status_text.duration,
        coverage_text=status_text.coverage_text,
    )
    return _private(Response(html, mimetype="text/html"))


@bp.get("/api/runs")
def runs_json() -> Any:
    """The same overview as JSON: runs, tasks, outbox, last reconcile, API budget."""
    refusal = _refusal()
    if refusal is not None:
        return refusal
    return _private(jsonify(status.overview(services_of(current_app), dataset=_dataset_asked())))
