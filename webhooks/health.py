"""Liveness and readiness: can this process reach its database and Redis."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify
from sqlalchemy import text

from webhooks import services_of

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Any:
    """Report database and Redis reachability (503 when the database is down)."""
    services = services_of(current_app)
    checks: dict[str, str] = {}
    try:
        with services.uow.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    if services.redis is None:
        checks["redis"] = "not configured"
    else:
        try:
            services.redis.ping()
            checks["redis"] = "ok"
        except Exception as exc:
            checks["redis"] = f"unreachable: {type(exc).__name__}"
    healthy = checks["database"] == "ok"
    return jsonify(status="ok" if healthy else "degraded", checks=checks), 200 if healthy else 503
