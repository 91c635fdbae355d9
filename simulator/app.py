"""The simulated Cloud's HTTP face: the 18 API routes under /api/v1/ and the /_sim/ control API.

Every API request is logged (method and path, never the token), must carry the account's
``api_token`` query parameter (else 401), may be struck by an injected fault, and is counted
against the rate limit. JSON bodies are encoded the way Cloud's PHP backend does (``\\/``).
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from flask import Blueprint, Flask, Response, current_app, g, request
from werkzeug.exceptions import HTTPException

from simulator.control import control
from simulator.export import gzip_stream
from simulator.fault import cut_stream
from simulator.jobs import Job
from simulator.records import php_json
from simulator.state import CloudState
from simulator.throttle import Verdict

API_PREFIX = "/api/v1"
PER_PAGE = 100
NOT_FOUND = "An error occured"  # sic: Cloud misspells it
GENERIC_ERROR = "An error occurred"
DRIVERS = ("fast", "fulljs")
# The top-level keys of a sitemap as the browser extension exports it; Cloud refuses others.
SITEMAP_ATTRIBUTES = frozenset({"_id", "startUrl", "selectors"})
CRON_FIELDS = ("cron_minute", "cron_hour", "cron_day", "cron_month", "cron_weekday")
DOWNLOAD_TYPES = {
    "json": "application/json",
    "csv": "text/csv; charset=utf-8",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}

T = TypeVar("T")
api = Blueprint("cloud_api", __name__, url_prefix=API_PREFIX)


def create_app(state: CloudState) -> Flask:
    """Build the simulated Cloud as a Flask app serving one account's state."""
    app = Flask("simulator")
    # A fault that drops the connection must reach the server (or WSGITransport) as an
    # exception instead of becoming a 500 page; sim bugs surface loudly the same way.
    app.config["PROPAGATE_EXCEPTIONS"] = True
    app.extensions["cloud_state"] = state
    app.register_blueprint(api)
    app.register_blueprint(control)
    app.before_request(_log_request)
    app.register_error_handler(HTTPException, _http_error)
    return app


def cloud_state() -> CloudState:
    """Return the account state wired into the running app."""
    state: CloudState = current_app.extensions["cloud_state"]
    return state


# -- envelopes


def json_response(payload: Any, status: int = 200) -> Response:
    """Encode a payload as Cloud's PHP backend would."""
    return Response(php_json(payload), status=status, mimetype="application/json")


def ok(data: Any) -> Response:
    """Wrap a result in the success envelope."""
    return json_response({"success": True, "data": data})


def error(status: int, message: str = GENERIC_ERROR) -> Response:
    """Answer with the error envelope."""
    return json_response({"success": False, "error": message}, status)


def invalid(errors: dict[str, list[str]]) -> Response:
    """Answer 422 with Laravel-style validation errors."""
    return json_response({"success": False, "validationErrors": errors}, 422)


def paginated(items: Sequence[T], render: Callable[[T], Any]) -> Response:
    """Answer one page (100 items) of a list, with the paging fields beside ``data``."""
    try:
        page = max(1, int(request.args.get("page", "1")))
    except ValueError:
        page = 1
    total = len(items)
    window = items[(page - 1) * PER_PAGE : page * PER_PAGE]
    return json_response(
        {
            "success": True,
            "data": [render(item) for item in window],
            "current_page": page,
            "last_page": max(1, math.ceil(total / PER_PAGE)),
            "total": total,
            "per_page": PER_PAGE,
        }
    )


def _log_request() -> None:
    """Log every API request, unknown routes included, by method and path (never the token)."""
    if request.path.startswith(API_PREFIX + "/"):
        state = cloud_state()
        with state.lock:
            state.requests.append((request.method, request.path))


def _http_error(exc: HTTPException) -> Response | HTTPException:
    """Answer routing errors under /api/v1/ with Cloud's envelope; leave others to Flask."""
    if not request.path.startswith(API_PREFIX + "/"):
        return exc
    code = exc.code or 500
    return error(code, NOT_FOUND if code == 404 else GENERIC_ERROR)


# -- auth, faults and the rate limit, in the order Cloud's middleware would apply them


@api.before_request
def guard() -> Response | None:
    """Check the token, strike armed faults, and count the call against the rate limit."""
    state = cloud_state()
    method, path = request.method, request.path
    now = state.clock()
    token = request.args.get("api_token", "")
    if not token or token != state.api_token:
        g.rate = state.throttle.peek(state.api_token, now, state.rate_limit, state.rate_window)
        return error(401)
    fault = state.take_fault(("reset", "rate_limit", "status", "slow"), method, path)
    if fault is not None and fault.kind == "reset":
        raise ConnectionResetError("simulated reset: connection closed without a response")
    if fault is not None and fault.kind == "rate_limit":
        verdict = state.throttle.peek(token, now, state.rate_limit, state.rate_window)
        reset_at = (
            now + float(fault.params["retry_after"])
            if "retry_after" in fault.params
            else verdict.reset_at
        )
        return too_many(state, Verdict(False, 0, reset_at), now)
    if fault is not None and fault.kind == "status":
        g.rate = state.throttle.peek(token, now, state.rate_limit, state.rate_window)
        status = int(fault.params["status"])
        if "body" in fault.params:
            content_type = str(fault.params.get("content_type", "text/html"))
            return Response(str(fault.params["body"]), status=status, content_type=content_type)
        default = NOT_FOUND if status == 404 else GENERIC_ERROR
        return error(status, str(fault.params.get("error", default)))
    if fault is not None and fault.kind == "slow":
        time.sleep(float(fault.params["seconds"]))
    with state.lock:
        verdict = state.throttle.hit(token, now, state.rate_limit, state.rate_window)
        if verdict.allowed:
            state.calls += 1
    if not verdict.allowed:
        return too_many(state, verdict, now)
    g.rate = verdict
    return None


def too_many(state: CloudState, verdict: Verdict, now: float) -> Response:
    """Answer 429 with Retry-After (seconds or HTTP-date) and X-RateLimit-Reset."""
    response = error(429, "Too Many Attempts.")
    wait = verdict.retry_after(now)
    if state.retry_after_format == "http-date":
        response.headers["Retry-After"] = email.utils.formatdate(now + wait, usegmt=True)
    else:
        response.headers["Retry-After"] = str(wait)
    response.headers["X-RateLimit-Reset"] = str(math.ceil(verdict.reset_at))
    g.rate = verdict
    return response


@api.after_request
def rate_headers(response: Response) -> Response:
    """Put X-RateLimit-Limit and X-RateLimit-Remaining on every API response."""
    verdict: Verdict | None = g.get("rate")
    if verdict is not None:
        response.headers["X-RateLimit-Limit"] = str(cloud_state().rate_limit)
        response.headers["X-RateLimit-Remaining"] = str(verdict.remaining)
    return response


# -- sitemaps


def _sitemap_errors(body: Any) -> dict[str, list[str]]:
    """Validate a posted sitemap object the way Cloud reports it."""
    if not isinstance(body, dict):
        return {"sitemap_object": ["The sitemap object field is required."]}
    errors: dict[str, list[str]] = {}
    if set(body) - SITEMAP_ATTRIBUTES:
        errors["sitemap_object"] = ["Sitemap has a suspicious attribute somewhere."]
    if not isinstance(body.get("_id"), str) or not body["_id"]:
        errors["sitemap_object._id"] = ["The sitemap object. id field is required."]
    start = body.get("startUrl")
    if isinstance(start, str):
        start = [start]
    if not isinstance(start, list) or not start or not all(isinstance(u, str) for u in start):
        errors["sitemap_object.startUrl"] = ["The sitemap object.start url field is required."]
    if "selectors" in body and not isinstance(body["selectors"], list):
        errors["sitemap_object.selectors"] = ["The sitemap object.selectors must be an array."]
    return errors


@api.post("/sitemap")
def create_sitemap() -> Response:
    """Create a sitemap from its JSON definition."""
    body: Any = request.get_json(silent=True)
    errors = _sitemap_errors(body)
    if errors:
        return invalid(errors)
    try:
        sitemap_id = cloud_state().create_sitemap(body)
    except ValueError:
        return invalid({"sitemap_object._id": ["The sitemap id has already been taken."]})
    return ok({"id": sitemap_id})


@api.get("/sitemap/<int:sitemap_id>")
def get_sitemap(sitemap_id: int) -> Response:
    """Show a sitemap with its definition as a JSON string."""
    state = cloud_state()
    with state.lock:
        sitemap = state.sitemaps.get(sitemap_id)
        if sitemap is None:
            return error(404, NOT_FOUND)
        return ok({"id": sitemap.id, "name": sitemap.name, "sitemap": sitemap.encoded()})


@api.put("/sitemap/<int:sitemap_id>")
def update_sitemap(sitemap_id: int) -> Response:
    """Replace a sitemap's definition."""
    state = cloud_state()
    if sitemap_id not in state.sitemaps:
        return error(404, NOT_FOUND)
    body: Any = request.get_json(silent=True)
    errors = _sitemap_errors(body)
    if errors:
        return invalid(errors)
    try:
        state.update_sitemap(sitemap_id, body)
    except KeyError:
        return error(404, NOT_FOUND)
    except ValueError:
        return invalid({"sitemap_object._id": ["The sitemap id has already been taken."]})
    return ok("ok")


@api.delete("/sitemap/<int:sitemap_id>")
def delete_sitemap(sitemap_id: int) -> Response:
    """Delete a sitemap."""
    try:
        cloud_state().delete_sitemap(sitemap_id)
    except KeyError:
        return error(404, NOT_FOUND)
    return ok("ok")


@api.get("/sitemaps")
def list_sitemaps() -> Response:
    """List sitemaps, 100 per page, oldest first."""
    state = cloud_state()
    with state.lock:
        items = [{"id": s.id, "name": s.name} for s in sorted(state.sitemaps.values(), key=_id)]
    return paginated(items, lambda item: item)


@api.post("/sitemap/<int:sitemap_id>/enable-scheduler")
def enable_scheduler(sitemap_id: int) -> Response:
    """Store a sitemap's scheduler config and switch it on."""
    state = cloud_state()
    if sitemap_id not in state.sitemaps:
        return error(404, NOT_FOUND)
    body: Any = request.get_json(silent=True)
    if not isinstance(body, dict):
        body = {}
    missing = {
        name: [f"The {name.replace('_', ' ')} field is required."]
        for name in CRON_FIELDS
        if name not in body
    }
    if missing:
        return invalid(missing)
    try:
        state.enable_scheduler(sitemap_id, body)
    except KeyError:
        return error(404, NOT_FOUND)
    return ok("ok")


@api.post("/sitemap/<int:sitemap_id>/disable-scheduler")
def disable_scheduler(sitemap_id: int) -> Response:
    """Switch a sitemap's scheduler off, keeping its config."""
    try:
        cloud_state().disable_scheduler(sitemap_id)
    except KeyError:
        return error(404, NOT_FOUND)
    return ok("ok")


@api.get("/sitemap/<int:sitemap_id>/scheduler")
def get_scheduler(sitemap_id: int) -> Response:
    """Show a sitemap's scheduler config with ``scheduler_enabled``."""
    state = cloud_state()
    with state.lock:
        sitemap = state.sitemaps.get(sitemap_id)
        if sitemap is None:
            return error(404, NOT_FOUND)
        return ok({"scheduler_enabled": sitemap.scheduler_enabled, **sitemap.scheduler})


# -- scraping jobs


def _job_errors(body: Any, state: CloudState) -> dict[str, list[str]]:
    """Validate a scraping-job create request the way Laravel would word it."""
    if not isinstance(body, dict):
        return {"sitemap_id": ["The sitemap id field is required."]}
    errors: dict[str, list[str]] = {}
    sitemap_id = body.get("sitemap_id")
    if sitemap_id is None:
        errors["sitemap_id"] = ["The sitemap id field is required."]
    elif not isinstance(sitemap_id, int) or isinstance(sitemap_id, bool):
        errors["sitemap_id"] = ["The sitemap id must be an integer."]
    elif sitemap_id not in state.sitemaps:
        errors["sitemap_id"] = ["The selected sitemap id is invalid."]
    if "driver" not in body:
        errors["driver"] = ["The driver field is required."]
    elif body["driver"] not in DRIVERS:
        errors["driver"] = ["The selected driver is invalid."]
    for name in ("page_load_delay", "request_interval"):
        value = body.get(name)
        if value is None:
            errors[name] = [f"The {name.replace('_', ' ')} field is required."]
        elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
            errors[name] = [f"The {name.replace('_', ' ')} must be an integer."]
    start_urls = body.get("start_urls")
    if start_urls is not None and (
        not isinstance(start_urls, list) or not all(isinstance(u, str) for u in start_urls)
    ):
        errors["start_urls"] = ["The start urls must be an array."]
    custom_id = body.get("custom_id")
    if custom_id is not None and not isinstance(custom_id, str):
        errors["custom_id"] = ["The custom id must be a string."]
    return errors


@api.post("/scraping-job")
def create_job() -> Response:
    """Create (start) a scraping job for a sitemap."""
    state = cloud_state()
    body: Any = request.get_json(silent=True)
    errors = _job_errors(body, state)
    if errors:
        return invalid(errors)
    job_id = state.create_job(
        body["sitemap_id"],
        custom_id=body.get("custom_id"),
        start_urls=body.get("start_urls"),
        driver=body["driver"],
        request_interval=body["request_interval"],
        page_load_delay=body["page_load_delay"],
        proxy=body.get("proxy", 0),
    )
    fault = state.take_fault(("create_then_slow",), request.method, request.path)
    if fault is not None:
        time.sleep(float(fault.params["seconds"]))
    return ok({"id": job_id, "custom_id": body.get("custom_id")})


@api.get("/scraping-job/<int:job_id>")
def get_job(job_id: int) -> Response:
    """Show a scraping job with its status and counters."""
    state = cloud_state()
    with state.lock:
        job = state.jobs.get(job_id)
        return error(404, NOT_FOUND) if job is None else ok(job.as_api())


@api.get("/scraping-jobs")
def list_jobs() -> Response:
    """List scraping jobs, newest first, optionally for one sitemap."""
    state = cloud_state()
    wanted = request.args.get("sitemap_id")
    with state.lock:
        jobs = sorted(state.jobs.values(), key=_id, reverse=True)
        if wanted is not None:
            jobs = [job for job in jobs if str(job.sitemap_id) == wanted.strip()]
        items = [job.as_api() for job in jobs]
    return paginated(items, lambda item: item)


@api.delete("/scraping-job/<int:job_id>")
def delete_job(job_id: int) -> Response:
    """Delete a scraping job and its data."""
    try:
        cloud_state().delete_job(job_id)
    except KeyError:
        return error(404, NOT_FOUND)
    return ok("ok")


@api.get("/scraping-job/<int:job_id>/<any(json, csv, xlsx):kind>")
def download(job_id: int, kind: str) -> Response:
    """Stream a job's data (any status); gzip it when the client accepts gzip."""
    state = cloud_state()
    try:
        export = state.export(job_id)
        sitemap_name = state.job(job_id).sitemap_name
    except KeyError:
        return error(404, NOT_FOUND)
    body: Iterable[bytes]
    if kind == "json":
        body = export.jsonl()
    elif kind == "csv":
        body = export.csv(bom=state.csv_bom)
    else:
        body = [export.xlsx()]
    response_headers = {
        "Content-Disposition": f'attachment; filename="{_filename(sitemap_name)}_{job_id}.{kind}"',
        "Vary": "Accept-Encoding",
    }
    if request.accept_encodings.quality("gzip") > 0:
        body = gzip_stream(body)
        response_headers["Content-Encoding"] = "gzip"
    fault = state.take_fault(("cut",), request.method, request.path)
    if fault is not None:
        body = cut_stream(body, int(fault.params.get("after_bytes", 1024)))
    return Response(
        body, content_type=DOWNLOAD_TYPES[kind], headers=response_headers, direct_passthrough=True
    )


@api.get("/scraping-job/<int:job_id>/problematic-urls")
def problematic_urls(job_id: int) -> Response:
    """List a job's failed, empty and no-value page URLs, 100 per page."""
    state = cloud_state()
    with state.lock:
        job = state.jobs.get(job_id)
        if job is None:
            return error(404, NOT_FOUND)
        items = list(job.problematic_urls)
    return paginated(items, lambda item: {"url": item["url"], "type": item["type"]})


@api.get("/scraping-job/<int:job_id>/data-quality")
def data_quality(job_id: int) -> Response:
    """Show a finished job's data-quality result."""
    try:
        result = cloud_state().data_quality(job_id)
    except KeyError:
        return error(404, NOT_FOUND)
    if result is None:
        return invalid(
            {"scraping_job_id": ["Data quality check not available yet, scraping job not finished"]}
        )
    return ok(result)


@api.get("/account")
def account() -> Response:
    """Show the account owner and the page credits left."""
    return ok(
        {
            "email": "simulator@scrapesync.invalid",
            "firstname": "Cloud",
            "lastname": "Simulator",
            "page_credits": cloud_state().page_credits,
        }
    )


def _id(item: Job | Any) -> int:
    """Sort key: the object's id."""
    return int(item.id)


def _filename(name: str) -> str:
    """Reduce a sitemap name to a safe ASCII file name stem."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "data"
