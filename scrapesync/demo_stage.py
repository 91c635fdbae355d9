"""The demo's stage: every part scrapesync works with, started in this one process on loopback
sockets. A simulated Cloud, the web process, a worker (RQ on the Redis that ``REDIS_URL`` names
if it answers, else :class:`InProcessQueue`), and a receiver for the outbox's signed POSTs.
"""

from __future__ import annotations

import heapq
import importlib
import itertools
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from redis import Redis
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from config.datasets import parse_datasets
from config.settings import Settings
from simulator import CloudState, serve
from sync import bootstrap, db, logs
from sync.delivery import destinations
from sync.ingest import store
from sync.models import Delivery, SyncTask
from sync.queue import Dispatcher, JobKinds, RQDispatcher
from sync.states import DeliveryState, TaskState

DEMO_TOKEN = "demo-cloud-token"  # noqa: S105 - the simulator's token, valid nowhere else
SECRET_VARIABLE = "SCRAPESYNC_DEMO_HOOK_SECRET"  # noqa: S105 - a variable name, not a secret

log = logs.get("demo")


class InProcessQueue(JobKinds):
    """A Dispatcher that runs ``sync.jobs`` functions on one background thread, in due order,
    for the demo and other single-process uses. Waiting job ids coalesce as in RQ."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str, str, tuple[Any, ...]]] = []
        self._waiting: set[str] = set()
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._running = 0
        self._stop = False
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._work, name="demo-worker", daemon=True)
        self._thread.start()

    def enqueue_call(
        self,
        func: str,
        *args: Any,
        job_id: str,
        at: datetime | None = None,
        job_timeout: int | None = None,
    ) -> bool:
        """Queue ``func(*args)`` (a dotted path) unless ``job_id`` already waits."""
        with self._wake:
            if job_id in self._waiting:
                return False
            due = at.timestamp() if at is not None else time.time()
            heapq.heappush(self._heap, (due, next(self._order), job_id, func, args))
            self._waiting.add(job_id)
            self._wake.notify_all()
        return True

    def idle(self) -> bool:
        """Whether nothing is running and nothing is due before a minute from now."""
        with self._wake:
            soon = time.time() + 60.0
            return self._running == 0 and not any(item[0] <= soon for item in self._heap)

    def close(self) -> None:
        """Stop the worker thread once the job it runs is done."""
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        self._thread.join(timeout=30.0)

    def _work(self) -> None:
        while True:
            with self._wake:
                while not self._stop and (not self._heap or self._heap[0][0] > time.time()):
                    wait = self._heap[0][0] - time.time() if self._heap else None
                    self._wake.wait(timeout=wait)
                if self._stop:
                    return
                _, _, job_id, func, args = heapq.heappop(self._heap)
                self._waiting.discard(job_id)
                self._running += 1
            try:
                module, _, name = func.rpartition(".")
                getattr(importlib.import_module(module), name)(*args)
            except Exception:  # a job's failure is recorded in SQL; the queue goes on
                log.exception("demo.job_failed", extra={"job": job_id})
                self.failures.append(job_id)
            finally:
                with self._wake:
                    self._running -= 1
                    self._wake.notify_all()


class _QuietHandler(WSGIRequestHandler):
    """No access log: the notification URL carries the webhook token."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Log nothing."""


@dataclass
class Receiver:
    """A tiny loopback HTTP server standing in for a system that subscribes to announcements;
    it checks each POST's Standard Webhooks signature."""

    secret: str
    received: list[dict[str, Any]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        """Serve on a free loopback port; returns the URL to post to."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            """Records each announcement and answers 204."""

            def do_POST(self) -> None:
                """Take one signed announcement."""
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                event_id = self.headers.get("webhook-id", "")
                stamp = self.headers.get("webhook-timestamp", "0")
                expected = destinations.sign(
                    destinations.signing_key(receiver.secret), event_id, int(stamp), body
                )
                document = json.loads(body or b"{}")
                receiver.received.append(
                    {
                        "event_id": event_id,
                        "type": document.get("type"),
                        "data": document.get("data", {}),
                        "signature_ok": self.headers.get("webhook-signature") == expected,
                    }
                )
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                """Log nothing."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_port}/hooks/scrapesync"

    def stop(self) -> None:
        """Stop serving."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _datasets_toml(receiver_url: str) -> str:
    return f"""# The demo's datasets file (written by `scrapesync demo`).
[datasets.products]
sitemap = "products"
entity_key = ["sku"]
window = "daily"
partition = "retailer"
required = ["sku", "price"]

[datasets.products.quality]
parsers = {{ price = "number" }}

[datasets.products.columns]
sku = "text"
title = "text"
price = "numeric"
url = "text"
retailer = "text"

[[datasets.products.destinations]]
url = "{receiver_url}"
secret_env = "{SECRET_VARIABLE}"
"""


def _redis(settings: Settings) -> Redis | None:
    """The Redis that REDIS_URL names, if it answers within a second."""
    if not settings.redis_url:
        return None
    try:
        redis = Redis.from_url(settings.redis_url, socket_connect_timeout=1.0, socket_timeout=5.0)
        redis.ping()
    except Exception:  # not there: the in-process queue does the worker's job
        return None
    return redis


@dataclass
class Stage:
    """The demo's running parts, and how to tell that they have nothing left to do."""

    cloud: CloudState
    api_url: str
    receiver: Receiver
    receiver_url: str
    services: bootstrap.Services
    dispatcher: Dispatcher
    worker: Any  # an RQ worker run in bursts, or None when the in-process queue works alone
    queue_line: str
    web_url: str

    def work(self) -> None:
        """Let the RQ worker take what is queued (the in-process queue needs no push)."""
        if self.worker is not None:
            self.worker.work(burst=True, logging_level="WARNING")

    def count(self, model: Any, *where: Any) -> int:
        """How many rows of ``model`` match ``where`` now."""
        with self.services.uow.begin() as session:
            return store.count_rows(session, model, *where)

    def quiet(self) -> bool:
        """No sync in flight, no delivery waiting, the worker idle."""
        busy = self.count(SyncTask, SyncTask.state.in_((TaskState.PENDING, TaskState.LEASED)))
        due = self.count(
            Delivery, Delivery.state.in_((DeliveryState.UNSENT, DeliveryState.SENDING))
        )
        dispatcher = self.dispatcher
        idle = self.worker is not None or (
            isinstance(dispatcher, InProcessQueue) and dispatcher.idle()
        )
        return busy == 0 and due == 0 and idle


def set_stage(folder: Path, cleanup: list[Callable[[], None]]) -> Stage:
    """Start every part, keeping the database, datasets file and exports in ``folder``;
    ``cleanup`` gets the steps that stop them, in the order they were started."""
    secret = secrets.token_urlsafe(24)
    receiver = Receiver(secret)
    receiver_url = receiver.start()
    cleanup.append(receiver.stop)
    cloud, api_url = _start_cloud(cleanup)
    datasets_path = folder / "datasets.toml"
    datasets_path.write_text(_datasets_toml(receiver_url), encoding="utf-8")
    settings = _settings(folder, api_url, datasets_path, secret)
    redis = _redis(settings)
    db.upgrade(settings.database_url)
    settings, dispatcher, worker, queue_line = _queue(settings, redis, cleanup)
    services = bootstrap.build(
        settings,
        datasets=parse_datasets(datasets_path.read_text("utf-8"), source=str(datasets_path)),
        redis=redis,
        dispatcher=dispatcher,
    )
    cleanup.append(services.uow.engine.dispose)
    bootstrap.use(services)
    cleanup.append(lambda: bootstrap.use(None))
    web_url = _start_web(services, cleanup)
    cloud.notify_url = f"{web_url}/webhooks/webscraper/{settings.webhook_token}"
    return Stage(
        cloud=cloud,
        api_url=api_url,
        receiver=receiver,
        receiver_url=receiver_url,
        services=services,
        dispatcher=dispatcher,
        worker=worker,
        queue_line=queue_line,
        web_url=web_url,
    )


def _start_cloud(cleanup: list[Callable[[], None]]) -> tuple[CloudState, str]:
    """A simulated Cloud with the products sitemap, served on loopback; returns its API URL."""
    cloud = CloudState(
        api_token=DEMO_TOKEN,
        notify_delays=(0.5, 1.0),
        first_job_id=1000 + secrets.randbelow(9_000_000),
    )
    cloud.add_sitemap(
        "products",
        start_urls=["https://alpha.example/", "https://beta.example/", "https://gamma.example/"],
    )
    cleanup.append(cloud.close)
    simulator = serve(cloud)
    cleanup.append(simulator.shutdown)
    return cloud, simulator.api_url


def _settings(folder: Path, api_url: str, datasets_path: Path, secret: str) -> Settings:
    """The environment's settings, pointed at the demo's folder and simulator, with its own
    tokens, so no Cloud account or variable is needed."""
    return replace(
        Settings.from_env(),
        database_url=f"sqlite:///{(folder / 'scrapesync.db').resolve()}",
        api_url=api_url,
        api_token=DEMO_TOKEN,
        webhook_token=secrets.token_urlsafe(18),
        status_token=secrets.token_urlsafe(18),
        datasets_path=datasets_path,
        export_dir=folder / "exports",
        kill_at=None,
        kill_once_marker=None,
        environment={SECRET_VARIABLE: secret},
    )


def _queue(
    settings: Settings, redis: Redis | None, cleanup: list[Callable[[], None]]
) -> tuple[Settings, Dispatcher, Any, str]:
    """RQ on a queue of the demo's own when Redis answers, else the in-process queue; returns
    the settings to build with, the dispatcher, the RQ worker (or None) and a line saying which."""
    if redis is not None:
        from rq import SimpleWorker
        from rq.serializers import JSONSerializer

        rq_dispatcher = RQDispatcher(redis, queue_name=f"scrapesync-demo-{secrets.token_hex(4)}")
        cleanup.append(lambda: rq_dispatcher.queue.delete(delete_jobs=True))
        worker = SimpleWorker([rq_dispatcher.queue], connection=redis, serializer=JSONSerializer)
        queue_line = f"RQ on {settings.redis_url} (queue {rq_dispatcher.queue.name})"
        return settings, rq_dispatcher, worker, queue_line
    in_process = InProcessQueue()
    cleanup.append(in_process.close)
    queue_line = "in-process worker thread (no Redis answered at REDIS_URL)"
    return replace(settings, redis_url=None), in_process, None, queue_line


def _start_web(services: bootstrap.Services, cleanup: list[Callable[[], None]]) -> str:
    """The web process on a free loopback port; returns its URL."""
    from webhooks import create_app

    web: BaseWSGIServer = make_server(
        "127.0.0.1", 0, create_app(services), threaded=True, request_handler=_QuietHandler
    )
    threading.Thread(target=web.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    cleanup.append(web.server_close)
    cleanup.append(web.shutdown)
    return f"http://127.0.0.1:{web.server_port}"
