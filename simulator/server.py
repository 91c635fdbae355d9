"""The simulated Cloud on a real loopback socket: a threaded werkzeug server in a daemon thread.

A dropped connection (the ``reset`` and ``cut`` faults) closes the socket without answering, so
clients see what a network failure looks like rather than a 500 page.
"""

from __future__ import annotations

import threading
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from simulator.app import API_PREFIX, create_app
from simulator.state import CloudState


class _QuietHandler(WSGIRequestHandler):
    """Request handler that logs nothing and hangs up on simulated connection drops."""

    def connection_dropped(self, error: BaseException, environ: Any = None) -> None:
        """Close the connection instead of waiting for another request on it."""
        self.close_connection = True

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Keep test output clean: no access log."""

    def log_error(self, format: str, *args: Any) -> None:
        """Keep test output clean: no error log for dropped clients."""


class SimServer:
    """A running simulator server: its URLs, its port, and a way to stop it."""

    def __init__(self, state: CloudState, host: str, port: int) -> None:
        self.state = state
        self._server: BaseWSGIServer = make_server(
            host, port, create_app(state), threaded=True, request_handler=_QuietHandler
        )
        self.host = host
        self.port: int = self._server.server_port
        self.url = f"http://{host}:{self.port}"
        self.api_url = f"{self.url}{API_PREFIX}/"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},  # shutdown() waits up to one poll
            name=f"sim-server-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def wait(self) -> None:
        """Block until the server stops (for a foreground ``scrapesync simulator``)."""
        self._thread.join()

    def shutdown(self) -> None:
        """Stop serving and release the socket."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> SimServer:
        """Use the server as a context manager that shuts it down on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Shut the server down."""
        self.shutdown()


def serve(state: CloudState, host: str = "127.0.0.1", port: int = 0) -> SimServer:
    """Serve the simulated Cloud for this state on host:port (0: any free port), in background."""
    return SimServer(state, host, port)
