"""Cloud's finished-job notifications: stored and acknowledged at once, synced later.

Cloud does not sign notifications, so the token in the path is the credential (compared in
constant time). The use case ``sync.ingest.intake.accept_notification`` stores the raw notification
and sets the job's sync task wanted in ONE transaction (on PostgreSQL one statement, one round
trip; a repeat that finds the sync already pending coalesces into it without touching the task
row) and queues the RQ job after the commit; only then is the answer 200. If Redis is down the
answer is still 200 (the sweeper queues the durable task); if the database is down it is 503, so
Cloud tries again.

Cloud repeats a 5xx, so bad input never gets one: a body that is not a notification Cloud could
have sent (a job id that is not ASCII digits, a NUL, a lone surrogate, a field longer than the
inbox holds, JSON nested past orjson's depth limit, a body the server could not read) is
answered 400 and kept in the inbox as rejected; a body over the limit is 413, chunked or not.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl

import orjson
from flask import Blueprint, current_app, jsonify, request
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from sync import logs
from sync.ingest import intake, store
from webhooks import refusals, services_of

bp = Blueprint("intake", __name__)
log = logs.get("intake")

FIELDS = ("scrapingjob_id", "status", "sitemap_id", "sitemap_name", "custom_id")
LIMITS = {"status": 40}  # the inbox's column widths; every other field is at most FIELD_LIMIT
FIELD_LIMIT = 200
MAX_FIELDS = 100
JOB_ID = re.compile(r"[0-9]{1,18}")  # ASCII digits only: "²" or "١٢٣" is no job id
FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


class BadNotificationError(Exception):
    """The body is not a notification Cloud could have sent; the message says why."""


@dataclass(frozen=True)
class Parsed:
    """A notification's fields as text, and why it cannot be accepted (None: it can)."""

    fields: dict[str, str]
    problem: str | None = None


def _body() -> bytes:
    """The whole body, or 413 when it is over the limit, whether or not it is chunked."""
    data = request.get_data(cache=True)
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    # werkzeug stops a streamed body at the limit without saying whether more followed
    streamed = request.content_length is None
    if streamed and len(data) >= limit and request.environ["wsgi.input"].read(1):
        raise RequestEntityTooLarge()
    return data


def _media_fields() -> dict[str, Any] | None:
    """The body's fields, or None when the media type is not one Cloud sends."""
    mimetype = request.mimetype
    if mimetype == "application/x-www-form-urlencoded":
        raw = _body()
        try:
            pairs = parse_qsl(
                raw.decode("utf-8"),
                keep_blank_values=True,
                errors="strict",
                max_num_fields=MAX_FIELDS,
            )
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadNotificationError(f"the form is not valid UTF-8 URL encoding: {exc}") from None
        return dict(pairs)
    if mimetype == "multipart/form-data":
        _body()
        try:
            return {k: v for k, v in request.form.items()}
        except (ValueError, UnicodeError) as exc:
            raise BadNotificationError(f"the multipart form is malformed: {exc}") from None
    if mimetype == "application/json" or mimetype.endswith("+json"):
        raw = _body().removeprefix(b"\xef\xbb\xbf")
        try:
            body = orjson.loads(raw)  # depth-limited; refuses lone surrogates and bad UTF-8
        except orjson.JSONDecodeError as exc:
            raise BadNotificationError(f"the body is not valid JSON: {exc}") from None
        return body if isinstance(body, dict) else None
    return None


def _text(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise BadNotificationError(f"{name} must be text or a whole number")
    text = str(value)
    limit = LIMITS.get(name, FIELD_LIMIT)
    if len(text) > limit:
        raise BadNotificationError(f"{name} is longer than {limit} characters")
    if "\x00" in text:
        raise BadNotificationError(f"{name} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadNotificationError(f"{name} contains a lone surrogate") from None
    return text


def parse(body: dict[str, Any]) -> Parsed:
    """Check a notification's fields: text of bounded length without NUL or lone surrogates,
    and a job id of ASCII digits."""
    fields: dict[str, str] = {}
    try:
        for name in FIELDS:
            if body.get(name) is not None:
                fields[name] = _text(name, body[name])
        job = fields.get("scrapingjob_id", "").strip()
        if not JOB_ID.fullmatch(job) or int(job) == 0:
            raise BadNotificationError("scrapingjob_id missing or not a number")
    except BadNotificationError as exc:
        return Parsed(_printable(body), str(exc))
    return Parsed(fields)


def _printable(body: dict[str, Any]) -> dict[str, str]:
    """A rejected body's fields in a form the inbox can always store."""
    kept: dict[str, str] = {}
    for name in FIELDS:
        if body.get(name) is not None:
            text = body[name] if isinstance(body[name], str) else repr(body[name])
            text = text[:FIELD_LIMIT].replace("\x00", "\\x00")
            kept[name] = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return kept


def _rejected(parsed: Parsed, now: datetime) -> Any:
    """Keep the refused notification in the inbox (best effort) and answer 400."""
    services = services_of(current_app)
    reason = parsed.problem or "malformed"
    try:
        with services.uow.begin() as session:
            store.record_notification(
                session,
                form=parsed.fields,
                remote_addr=request.remote_addr,
                job_id=None,
                status=parsed.fields.get("status", "")[: LIMITS["status"]] or None,
                outcome=f"rejected: {reason}"[:200],
                now=now,
            )
            session.commit()
    except SQLAlchemyError:  # the answer is 400 all the same: repeating the body cannot help
        log.warning("notification.reject_not_stored", exc_info=True)
    log.info("notification.rejected", extra={"reason": reason})
    return jsonify(error="Bad Request", detail=reason), 400


@bp.post("/webhooks/webscraper/<token>")
def notification(token: str) -> Any:
    """Accept one finished-job notification from Cloud."""
    services = services_of(current_app)
    expected = services.settings.require_webhook_token()
    if not hmac.compare_digest(token.encode("utf-8", "replace"), expected.encode()):
        refusals.wrong_token(services, remote_addr=request.remote_addr, method=request.method)
        return jsonify(error="Not Found"), 404
    now = services.clock()
    try:
        body = _media_fields()
    except BadNotificationError as exc:
        return _rejected(Parsed({}, str(exc)), now)
    except HTTPException:  # 413 for a body over the limit, chunked or not
        raise
    except Exception:  # the server could not read the body (e.g. broken chunked encoding)
        log.info("notification.unreadable", exc_info=True)
        return jsonify(error="Bad Request", detail="the body could not be read"), 400
    if body is None:
        return jsonify(error="Unsupported Media Type", detail="send a form or a JSON object"), 415
    parsed = parse(body)
    if parsed.problem is not None:
        return _rejected(parsed, now)
    kept = parsed.fields
    job_id = int(kept["scrapingjob_id"].strip())
    try:
        accepted = intake.accept_notification(
            services, form=kept, remote_addr=request.remote_addr, job_id=job_id, now=now
        )
    except SQLAlchemyError:
        log.error("notification.database_unavailable", extra={"job_id": job_id}, exc_info=True)
        return jsonify(error="Service Unavailable", detail="database unavailable"), 503
    wish = accepted.wish
    log.info(
        "notification.accepted",
        extra={
            "job_id": job_id,
            "task_key": wish.task_key,
            "status": kept.get("status"),
            "state": wish.state,
            "generation": wish.requested_generation,
            "queued": accepted.queued,
            "new_task": accepted.created,
            "coalesced": accepted.coalesced,
        },
    )
    return jsonify(ok=True, task_key=wish.task_key, state=wish.state), 200
