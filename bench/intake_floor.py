"""The intake floor: a Flask view that stores each notification with one INSERT and a commit.

It is what the notification endpoint cannot beat: the same gunicorn flags, the same token in the
path, one round trip of work per request and nothing else (no task, no queue, no log line).
gunicorn builds it with ``bench.intake_floor:create_app('<database url>')``.
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from flask import Flask, jsonify, request
from sqlalchemy import create_engine, text

TABLE = "intake_floor"
INSERT = text(f"INSERT INTO {TABLE} (job_id, form) VALUES (:job_id, CAST(:form AS jsonb))")  # noqa: S608 - constant SQL


def create_app(database_url: str, token: str = "bench-webhook-token") -> Flask:  # noqa: S107 - a benchmark's token
    """The floor app over ``database_url``; its table is created when missing."""
    engine = create_engine(database_url, pool_size=8)
    with engine.begin() as conn:
        conn.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, "
                "received_at timestamptz NOT NULL DEFAULT now(), job_id bigint, form jsonb)"
            )
        )
    app = Flask(__name__)

    @app.post("/webhooks/webscraper/<path_token>")
    def notification(path_token: str) -> Any:
        """Store one notification: one INSERT, one commit."""
        if not hmac.compare_digest(path_token.encode(), token.encode()):
            return jsonify(error="Not Found"), 404
        form = request.form.to_dict()
        raw = form.get("scrapingjob_id", "")
        with engine.begin() as conn:
            conn.execute(
                INSERT,
                {
                    "job_id": int(raw) if raw.isdigit() else None,
                    "form": orjson.dumps(form).decode(),
                },
            )
        return jsonify(ok=True)

    @app.get("/healthz")
    def healthz() -> Any:
        """Ready."""
        return jsonify(status="ok")

    return app
