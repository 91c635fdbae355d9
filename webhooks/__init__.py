"""The thin Flask edge: Cloud's notifications in, health and status out."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

from flask import Flask, Response, has_request_context, jsonify, request
from werkzeug.exceptions import HTTPException

from config.settings import Settings
from sync import bootstrap, logs
from sync.bootstrap import Services
from sync.db import BurstPool

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

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


QUIET_SECONDS = 0.5


class QuietPool:
    """WSGI middleware: while requests keep coming this process keeps both of its database
    connections open; once none has been in flight for ``quiet_seconds`` (checked as often), the
    pool's idle connections beyond one are closed, so an idle process holds one.

    Closing the spare the moment the last request in flight ends would close it many times a
    second under load, whenever every request of the process is being read or written by
    gunicorn rather than served."""

    def __init__(
        self, app: WSGIApplication, pool: BurstPool, *, quiet_seconds: float = QUIET_SECONDS
    ) -> None:
        self.app = app
        self.pool = pool
        self.quiet_seconds = quiet_seconds
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_seen = time.monotonic()
        self._watch: threading.Thread | None = None

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Serve one request, noting when the process was last busy."""
        with self._lock:
            self._in_flight += 1
            if self._watch is None:  # started in the serving process, after gunicorn's fork
                self._watch = threading.Thread(
                    target=self._shrink_when_quiet, name="quiet-pool", daemon=True
                )
                self._watch.start()
        try:
            return self.app(environ, start_response)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._last_seen = time.monotonic()

    def quiet(self) -> bool:
        """Whether no request has been in flight for ``quiet_seconds``."""
        with self._lock:
            idle = time.monotonic() - self._last_seen
            return self._in_flight == 0 and idle >= self.quiet_seconds

    def _shrink_when_quiet(self) -> None:
        while True:
            time.sleep(self.quiet_seconds)
            if self.quiet():
                self.pool.shrink(keep=1)


def create_app(services: Services | None = None) -> Flask:
    """The web process: gunicorn calls this factory with no arguments."""
    if services is None:
        settings = Settings.from_env()
        settings.require_webhook_token()
        settings.require_redis_url()
        services = bootstrap.build(settings, role="web")
    else:
        services.settings.require_webhook_token()
    logs.configure()
    app = WebApp(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["scrapesync"] = services
    pool = services.uow.engine.pool
    if isinstance(pool, BurstPool):
        app.wsgi_app = QuietPool(app.wsgi_app, pool)  # type: ignore[method-assign]

    from webhooks.changes import bp as changes_bp
    from webhooks.events import bp as events_bp
    from webhooks.health import bp as health_bp
    from webhooks.intake import bp as intake_bp
    from webhooks.metrics import bp as metrics_bp
    from webhooks.status import bp as status_bp

    app.register_blueprint(intake_bp)
    app.register_blueprint(health_bp)
    app.register_blueprint(status_bp)
    app.register_blueprint(metrics_bp)
    app.register_blueprint(changes_bp)
    app.register_blueprint(events_bp)

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
