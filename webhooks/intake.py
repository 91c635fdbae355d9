"""Cloud's finished-job notifications: stored and acknowledged at once, synced later.

Cloud does not sign notifications, so the token in the path is the credential (compared in
constant time). In ONE transaction the raw notification goes to the inbox and the job's sync
task is set wanted; after the commit the RQ job is queued; then the answer is 200. If Redis is
down the answer is still 200 (the sweeper queues the durable task); if the database is down it
is 503, so Cloud tries again.
"""

from __future__ import annotations

import hmac
from typing import Any

from flask import Blueprint, current_app, jsonify, request
from sqlalchemy.exc import SQLAlchemyError

from sync import logs, store
from webhooks import services_of

bp = Blueprint("intake", __name__)
log = logs.get("intake")

FIELDS = ("scrapingjob_id", "status", "sitemap_id", "sitemap_name", "custom_id")


def _form() -> dict[str, Any] | None:
    mimetype = request.mimetype
    if mimetype in ("application/x-www-form-urlencoded", "multipart/form-data"):
        return {k: v for k, v in request.form.items()}
    if mimetype == "application/json" or mimetype.endswith("+json"):
        body = request.get_json(silent=True)
        return body if isinstance(body, dict) else None
    return None


@bp.post("/webhooks/webscraper/<token>")
def notification(token: str) -> Any:
    """Accept one finished-job notification from Cloud."""
    services = services_of(current_app)
    expected = services.settings.require_webhook_token()
    if not hmac.compare_digest(token.encode(), expected.encode()):
        return jsonify(error="Not Found"), 404
    form = _form()
    if form is None:
        return jsonify(error="Unsupported Media Type", detail="send a form or a JSON object"), 415
    kept = {k: str(form[k])[:500] for k in FIELDS if form.get(k) is not None}
    raw_job = kept.get("scrapingjob_id", "").strip()
    job_id = int(raw_job) if raw_job.isdigit() and len(raw_job) < 19 else None
    now = services.clock()
    try:
        with services.uow.begin() as session:
            if job_id is None:
                store.record_notification(
                    session,
                    form=kept,
                    remote_addr=request.remote_addr,
                    job_id=None,
                    status=kept.get("status"),
                    outcome="rejected: scrapingjob_id missing or not a number",
                    now=now,
                )
                session.commit()
                return jsonify(error="Bad Request", detail="scrapingjob_id must be a number"), 400
            wish = store.want_sync(session, job_id, now=now)
            store.record_notification(
                session,
                form=kept,
                remote_addr=request.remote_addr,
                job_id=job_id,
                status=kept.get("status"),
                outcome=f"task {wish.state} (generation {wish.requested_generation})",
                now=now,
            )
            session.commit()
        services.killpoints.reached("intake-after-commit")
    except SQLAlchemyError:
        log.error("notification.database_unavailable", extra={"job_id": job_id}, exc_info=True)
        return jsonify(error="Service Unavailable", detail="database unavailable"), 503
    queued = False
    if wish.state in store.CLAIMABLE:
        try:
            queued = services.dispatcher.enqueue_sync(
                wish.task_key,
                generation=wish.requested_generation,
                attempts=wish.attempt_count,
                at=wish.next_attempt_at if wish.next_attempt_at > now else None,
            )
        except Exception:  # durable in SQL; the sweeper queues it once Redis is back
            log.warning("notification.enqueue_failed", extra={"job_id": job_id}, exc_info=True)
    log.info(
        "notification.accepted",
        extra={
            "job_id": job_id,
            "task_key": wish.task_key,
            "status": kept.get("status"),
            "state": wish.state,
            "generation": wish.requested_generation,
            "queued": queued,
        },
    )
    return jsonify(ok=True, task_key=wish.task_key, state=wish.state), 200
