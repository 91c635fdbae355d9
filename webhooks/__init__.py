"""The thin Flask edge: Cloud's notifications in, health and status out."""

from __future__ import annotations

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from config.settings import Settings
from sync import bootstrap, logs
from sync.bootstrap import Services

MAX_BODY_BYTES = 64 * 1024


def create_app(services: Services | None = None) -> Flask:
    """The web process: gunicorn calls this factory with no arguments."""
    if services is None:
        settings = Settings.from_env()
        settings.require_webhook_token()
        services = bootstrap.build(settings)
    else:
        services.settings.require_webhook_token()
    logs.configure()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["scrapesync"] = services

    from webhooks.health import bp as health_bp
    from webhooks.intake import bp as intake_bp
    from webhooks.status import bp as status_bp

    app.register_blueprint(intake_bp)
    app.register_blueprint(health_bp)
    app.register_blueprint(status_bp)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> tuple[Response, int]:
        """Every HTTP error as a short JSON body."""
        return jsonify(error=exc.name, detail=exc.description), exc.code or 500

    return app


def services_of(app: Flask) -> Services:
    """The wired services of this app."""
    services: Services = app.extensions["scrapesync"]
    return services
