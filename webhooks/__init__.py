"""The thin Flask edge: Cloud's notifications in, health and status out."""

from __future__ import annotations

import re
from types import TracebackType

from flask import Flask, Response, has_request_context, jsonify, request
from werkzeug.exceptions import HTTPException

from config.settings import Settings
from sync import bootstrap, logs
from sync.bootstrap import Services

MAX_BODY_BYTES = 64 * 1024
_TOKEN_IN_PATH = re.compile(r"(/webhooks/webscraper/)[^/?]+")

ExcInfo = tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None]


class WebApp(Flask):
    """Flask, except that an unhandled error's log line never shows the notification token
    that the URL path carries."""

    def log_exception(self, exc_info: ExcInfo) -> None:
        """Log an unhandled error with the token in the path replaced by ``***``."""
        where = "outside a request"
        if has_request_context():
            path = _TOKEN_IN_PATH.sub(r"\1***", request.path)
            where = f"{path} [{request.method}]"
        self.logger.error(f"Exception on {where}", exc_info=exc_info)


def create_app(services: Services | None = None) -> Flask:
    """The web process: gunicorn calls this factory with no arguments."""
    if services is None:
        settings = Settings.from_env()
        settings.require_webhook_token()
        services = bootstrap.build(settings, role="web")
    else:
        services.settings.require_webhook_token()
    logs.configure()
    app = WebApp(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["scrapesync"] = services

    from webhooks.health import bp as health_bp
    from webhooks.intake import bp as intake_bp
    from webhooks.metrics import bp as metrics_bp
    from webhooks.status import bp as status_bp

    app.register_blueprint(intake_bp)
    app.register_blueprint(health_bp)
    app.register_blueprint(status_bp)
    app.register_blueprint(metrics_bp)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> tuple[Response, int]:
        """Every HTTP error as a short JSON body."""
        return jsonify(error=exc.name, detail=exc.description), exc.code or 500

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> tuple[Response, int]:
        """A bug answers a short JSON 500 (Cloud will retry); the log has the traceback."""
        if isinstance(exc, HTTPException):
            return _http_error(exc)
        app.log_exception((type(exc), exc, exc.__traceback__))  # type: ignore[arg-type]
        return jsonify(error="Internal Server Error", detail="see the web process's log"), 500

    return app


def services_of(app: Flask) -> Services:
    """The wired services of this app."""
    services: Services = app.extensions["scrapesync"]
    return services
