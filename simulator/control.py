"""The /_sim/ control API: drive the simulated Cloud from another process (demo, benchmarks).

Plain JSON in and out, no token: it stands in for Cloud's web UI and scraper fleet, so it must
never be exposed beyond loopback. Unknown ids answer 404, bad input 400, both as
``{"error": "..."}``.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from simulator.records import DEFAULT_PARTITIONS, generate_records
from simulator.state import CloudState

control = Blueprint("sim_control", __name__, url_prefix="/_sim")

CONFIG_FIELDS = (
    "notify_url",
    "notify_delays",
    "notify_timeout",
    "rate_limit",
    "rate_window",
    "retry_after_format",
    "csv_bom",
    "api_token",
    "page_credits",
)


def _state() -> CloudState:
    """Return the account state wired into the running app."""
    state: CloudState = current_app.extensions["cloud_state"]
    return state


def _body() -> dict[str, Any]:
    """Return the JSON object posted to a control route (empty when there is none)."""
    body = request.get_json(silent=True)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ValueError("the control API takes a JSON object")
    return body


@control.errorhandler(KeyError)
def _unknown(exc: KeyError) -> tuple[Response, int]:
    """Answer 404 for unknown sitemap or job ids."""
    return jsonify(error=str(exc.args[0] if exc.args else exc)), 404


@control.errorhandler(ValueError)
@control.errorhandler(TypeError)
def _bad_input(exc: Exception) -> tuple[Response, int]:
    """Answer 400 for input the simulator cannot use."""
    return jsonify(error=str(exc)), 400


@control.post("/sitemaps")
def add_sitemap() -> Response:
    """Create a sitemap: {name, start_urls, selectors?} -> {id}."""
    body = _body()
    sitemap_id = _state().add_sitemap(
        str(body["name"]),
        start_urls=body.get("start_urls", ["https://shop.example/"]),
        selectors=body.get("selectors"),
    )
    return jsonify(id=sitemap_id)


@control.post("/sitemaps/<int:sitemap_id>/quality")
def set_quality(sitemap_id: int) -> Response:
    """Configure a sitemap's data-quality criteria: {min_record_count, ...}."""
    _state().set_quality_thresholds(sitemap_id, **_body())
    return jsonify(ok=True)


@control.post("/jobs")
def create_job() -> Response:
    """Create a job: {sitemap_id, custom_id?, start_urls?, scheduled?} -> {id}."""
    body = _body()
    job_id = _state().create_job(
        int(body["sitemap_id"]),
        custom_id=body.get("custom_id"),
        start_urls=body.get("start_urls"),
        scheduled=bool(body.get("scheduled", False)),
    )
    return jsonify(id=job_id)


@control.post("/jobs/<int:job_id>/records")
def set_records(job_id: int) -> Response:
    """Give a job records: {records: [...]} or {generate: n, seed?, partitions?, start?}.

    With ``"append": true`` the records are added after the existing ones.
    """
    state = _state()
    body = _body()
    append = bool(body.get("append", False))
    if "generate" in body:
        records: Any = generate_records(
            int(body["generate"]),
            seed=int(body.get("seed", 0)),
            partitions=body.get("partitions", DEFAULT_PARTITIONS),
            start=int(body.get("start", 0)),
        )
    else:
        records = body["records"]
        if not isinstance(records, list):
            raise ValueError("records must be a list of objects")
    if append:
        state.add_records(job_id, records)
    else:
        state.set_records(job_id, records)
    return jsonify(ok=True, records=len(state.job(job_id).records))


@control.post("/jobs/<int:job_id>/start")
def start_job(job_id: int) -> Response:
    """Move a job to started."""
    _state().start_job(job_id)
    return jsonify(ok=True)


@control.post("/jobs/<int:job_id>/finish")
def finish_job(job_id: int) -> Response:
    """End a job: {status, jobs_scheduled?, jobs_failed?, jobs_empty?, jobs_no_value?,
    problematic_urls?, records_per_page?}; fires the notification."""
    body = _body()
    allowed = {
        "jobs_scheduled",
        "jobs_failed",
        "jobs_empty",
        "jobs_no_value",
        "problematic_urls",
        "records_per_page",
    }
    _state().finish_job(
        job_id,
        status=str(body.get("status", "finished")),
        **{key: value for key, value in body.items() if key in allowed},
    )
    return jsonify(ok=True)


@control.post("/jobs/<int:job_id>/continue")
def continue_job(job_id: int) -> Response:
    """Requeue an ended job ("Continue"), optionally adding {records: [...]}."""
    _state().continue_job(job_id, extra_records=_body().get("records"))
    return jsonify(ok=True)


@control.post("/jobs/<int:job_id>/notify")
def notify(job_id: int) -> Response:
    """Send the job's notification now: {times?}."""
    _state().notify(job_id, times=int(_body().get("times", 1)))
    return jsonify(ok=True)


@control.post("/jobs/<int:job_id>/page-fault")
def page_fault(job_id: int) -> Response:
    """Turn a job's pages into non-data pages: {kind: "consent" | null}."""
    _state().set_page_fault(job_id, _body().get("kind"))
    return jsonify(ok=True)


@control.post("/faults")
def inject_fault() -> Response:
    """Arm a fault: {kind, path_contains?, times?, ...params}."""
    body = _body()
    kind = str(body.pop("kind"))
    path_contains = str(body.pop("path_contains", ""))
    times = body.pop("times", 1)
    _state().inject_fault(
        kind, path_contains=path_contains, times=None if times is None else int(times), **body
    )
    return jsonify(ok=True)


@control.delete("/faults")
def clear_faults() -> Response:
    """Disarm every fault."""
    _state().clear_faults()
    return jsonify(ok=True)


@control.post("/config")
def configure() -> Response:
    """Change account settings: notify_url, rate_limit, rate_window, retry_after_format, ..."""
    state = _state()
    body = _body()
    unknown = set(body) - set(CONFIG_FIELDS)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; expected some of {CONFIG_FIELDS}")
    if body.get("retry_after_format", "seconds") not in ("seconds", "http-date"):
        raise ValueError("retry_after_format must be 'seconds' or 'http-date'")
    with state.lock:
        for name, value in body.items():
            setattr(state, name, value)
    return jsonify(ok=True)


@control.post("/notifications/wait")
def wait_for_notifications() -> Response:
    """Wait until queued notifications are delivered: {timeout?} -> {done}."""
    done = _state().wait_for_notifications(float(_body().get("timeout", 5.0)))
    return jsonify(done=done)


@control.get("/state")
def summary() -> Response:
    """Show calls, job statuses, notification attempts and armed faults."""
    return jsonify(_state().summary())
