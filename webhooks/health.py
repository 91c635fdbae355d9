"""Liveness and readiness: can this process reach its database and Redis."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify
from sqlalchemy import text

from webhooks import services_of

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Any:
    """Report database and Redis reachability: 503 naming the one that cannot be reached."""
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
    unreachable = [name for name, state in checks.items() if state.startswith("unreachable")]
    if not unreachable:
        return jsonify(status="ok", checks=checks), 200
    names = {
        "database": "PostgreSQL"
        if services.uow.engine.dialect.name == "postgresql"
        else "the database",
        "redis": "Redis",
    }
    detail = " and ".join(names[n] for n in unreachable) + " cannot be reached"
    return jsonify(status="unavailable", checks=checks, unreachable=unreachable, detail=detail), 503
