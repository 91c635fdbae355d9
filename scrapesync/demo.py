"""``scrapesync demo``: the whole flow once, on one machine, with nothing but Python.

One process plays every part: the simulated Cloud and the web process on loopback sockets, a
worker (RQ on the Redis that ``REDIS_URL`` names if it answers, else :class:`InProcessQueue`),
and a receiver for the outbox's signed POSTs. The demo launches a run, lets Cloud scrape and
notify twice, and waits until the records are synced, the run accepted and published, and the
announcement delivered; then it shows that a reconcile finds nothing left to do, prints the
status table and writes the published export. Everything lives in one folder (SQLite, export,
JSON logs). It supplies its own tokens, so no Cloud account or variable is needed.
"""

from __future__ import annotations

import heapq
import importlib
import itertools
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from redis import Redis
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from config.datasets import parse_datasets
from config.settings import Settings
from simulator import CloudState, serve
from sync import bootstrap, db, logs
from sync.datasets import export
from sync.delivery import destinations
from sync.ingest import store
from sync.models import Delivery, Observation, Run, SyncTask
from sync.operations import reconcile, status, status_text
from sync.queue import Dispatcher, JobKinds, RQDispatcher
from sync.runs import launch
from sync.states import DeliveryState, RunState, TaskState

DEMO_TOKEN = "demo-cloud-token"  # noqa: S105 - the simulator's token, valid nowhere else
SECRET_VARIABLE = "SCRAPESYNC_DEMO_HOOK_SECRET"  # noqa: S105 - a variable name, not a secret
DEFAULT_TIMEOUT = 90.0

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


@dataclass
class DemoResult:
    """How the demo went: where its files are and what it produced."""

    folder: Path
    ok: bool = False
    problem: str | None = None
    run_id: str | None = None
    records: int = 0
    export_path: Path | None = None
    manifest_path: Path | None = None
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    queries: list[tuple[str, int]] = field(default_factory=list)  # each SQL shown, rows found


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


def _log_to(path: Path) -> logging.Handler:
    """Send scrapesync's JSON log lines to a file instead of the demo's own output."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger("scrapesync")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False
    return handler


def run_demo(
    folder: Path | None = None,
    *,
    records: int = 300,
    echo: Callable[[str], None] = print,
    timeout: float = DEFAULT_TIMEOUT,
) -> DemoResult:
    """Run the demo; returns its result (``ok`` when everything arrived where it should)."""
    started = time.monotonic()
    if folder is None:
        folder = Path("var") / f"demo-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    folder.mkdir(parents=True, exist_ok=True)
    result = DemoResult(folder=folder)
    handler = _log_to(folder / "scrapesync.log")
    cleanup: list[Callable[[], None]] = []
    try:
        _run(folder, records, echo, timeout, result, cleanup)
    except DemoError as exc:
        result.problem = str(exc)
    finally:
        for step in reversed(cleanup):
            try:
                step()
            except Exception:  # tearing down: keep going, the process ends anyway
                log.warning("demo.cleanup_failed", exc_info=True)
        logging.getLogger("scrapesync").removeHandler(handler)
        handler.close()
    if result.ok:
        echo(f"demo finished in {time.monotonic() - started:.1f} s")
    return result


def sample_queries(sku: str, day: str) -> list[tuple[str, str]]:
    """Two questions an analyst asks of the demo's SQLite tables, with the SQL that answers
    each (on PostgreSQL the tables are ``datasets.products`` and ``datasets.products_history``)."""
    noon = f"{day} 12:00:00+00"
    key = sku.replace("'", "''")
    return [
        (
            "products under 20 today",
            "SELECT sku, title, price FROM datasets_products WHERE price < 20 ORDER BY price;",
        ),
        (
            f"what did {sku} cost on {day}",
            # printed for a person to paste: the key is one the demo's own table holds
            f"SELECT price FROM datasets_products_history WHERE entity_key = '{key}' "  # noqa: S608
            f"AND valid_from <= '{noon}' AND (valid_to IS NULL OR valid_to > '{noon}');",
        ),
    ]


def _show_queries(
    services: bootstrap.Services,
    folder: Path,
    run_id: str,
    echo: Callable[[str], None],
    result: DemoResult,
) -> None:
    """Print two queries a user can paste into ``sqlite3``, each with what it answers now."""
    from sqlalchemy import text

    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        sku = session.execute(
            text("SELECT min(entity_key) FROM datasets_products")
        ).scalar_one_or_none()
        if sku is None:
            raise DemoError("the published run is not in the datasets_products table")
        echo(f"query your data: sqlite3 {folder / 'scrapesync.db'}")
        for question, sql in sample_queries(str(sku), run.collection_window):
            rows = session.execute(text(sql)).all()
            if not rows:
                raise DemoError(f"the query for {question!r} found nothing")
            result.queries.append((sql, len(rows)))
            shown = "; ".join(" | ".join(str(v) for v in row) for row in rows[:3])
            more = f" (and {len(rows) - 3} more rows)" if len(rows) > 3 else ""
            echo(f"  -- {question}\n  {sql}\n     → {shown}{more}")


class DemoError(Exception):
    """The demo could not get one of its steps done in time; the message says which."""


def _run(
    folder: Path,
    records: int,
    echo: Callable[[str], None],
    timeout: float,
    result: DemoResult,
    cleanup: list[Callable[[], None]],
) -> None:
    deadline = time.monotonic() + timeout
    secret = secrets.token_urlsafe(24)
    receiver = Receiver(secret)
    receiver_url = receiver.start()
    cleanup.append(receiver.stop)

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

    datasets_path = folder / "datasets.toml"
    datasets_path.write_text(_datasets_toml(receiver_url), encoding="utf-8")
    database_url = f"sqlite:///{(folder / 'scrapesync.db').resolve()}"
    settings = replace(
        Settings.from_env(),
        database_url=database_url,
        api_url=simulator.api_url,
        api_token=DEMO_TOKEN,
        webhook_token=secrets.token_urlsafe(18),
        status_token=secrets.token_urlsafe(18),
        datasets_path=datasets_path,
        export_dir=folder / "exports",
        kill_at=None,
        kill_once_marker=None,
        environment={SECRET_VARIABLE: secret},
    )
    redis = _redis(settings)
    db.upgrade(database_url)
    dispatcher: Dispatcher
    worker: Any = None
    if redis is not None:
        from rq import SimpleWorker
        from rq.serializers import JSONSerializer

        rq_dispatcher = RQDispatcher(redis, queue_name=f"scrapesync-demo-{secrets.token_hex(4)}")
        cleanup.append(lambda: rq_dispatcher.queue.delete(delete_jobs=True))
        worker = SimpleWorker([rq_dispatcher.queue], connection=redis, serializer=JSONSerializer)
        dispatcher = rq_dispatcher
        queue_line = f"RQ on {settings.redis_url} (queue {rq_dispatcher.queue.name})"
    else:
        in_process = InProcessQueue()
        cleanup.append(in_process.close)
        dispatcher = in_process
        settings = replace(settings, redis_url=None)
        queue_line = "in-process worker thread (no Redis answered at REDIS_URL)"
    services = bootstrap.build(
        settings,
        datasets=parse_datasets(datasets_path.read_text("utf-8"), source=str(datasets_path)),
        redis=redis,
        dispatcher=dispatcher,
    )
    cleanup.append(services.uow.engine.dispose)
    bootstrap.use(services)
    cleanup.append(lambda: bootstrap.use(None))

    from webhooks import create_app

    web: BaseWSGIServer = make_server(
        "127.0.0.1", 0, create_app(services), threaded=True, request_handler=_QuietHandler
    )
    threading.Thread(target=web.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    cleanup.append(web.server_close)
    cleanup.append(web.shutdown)
    web_url = f"http://127.0.0.1:{web.server_port}"
    cloud.notify_url = f"{web_url}/webhooks/webscraper/{settings.webhook_token}"

    echo(f"scrapesync demo: every part on this machine, files in {folder}")
    echo(f"  database  {folder / 'scrapesync.db'} (SQLite, migrated)")
    echo(f"  queue     {queue_line}")
    echo(f"  Cloud     simulated Web Scraper Cloud at {simulator.api_url}")
    echo(f"  web       {web_url} (notifications in, /status out)")
    echo(f"  receiver  {receiver_url} (signed announcements)")

    def settle(what: str, done: Callable[[], bool]) -> None:
        """Let the worker run until ``done()``, or give up at the deadline."""
        while not done():
            if worker is not None:
                worker.work(burst=True, logging_level="WARNING")
            if time.monotonic() > deadline:
                raise DemoError(f"timed out waiting for {what}")
            time.sleep(0.05)

    outcome = launch.launch(services, "products")
    result.run_id = run_id = outcome.run_id
    assert outcome.job_id is not None
    echo(f"1. launched run {run_id}: Cloud job {outcome.job_id} (custom_id {outcome.batch_id})")

    cloud.set_generated(outcome.job_id, records)
    cloud.run_job(outcome.job_id)
    cloud.notify(outcome.job_id)  # Cloud may notify twice; the second one must change nothing
    settle("Cloud's two notifications", lambda: cloud.wait_for_notifications(0.05))
    accepted = sum(1 for n in cloud.notifications_sent if n["ok"])
    echo(f"2. Cloud scraped {records} records and notified {accepted} times")

    def count(model: Any, *where: Any) -> int:
        """How many rows of ``model`` match ``where`` now."""
        with services.uow.begin() as session:
            return store.count_rows(session, model, *where)

    def quiet() -> bool:
        """No sync in flight, no delivery waiting, the worker idle."""
        busy = count(SyncTask, SyncTask.state.in_((TaskState.PENDING, TaskState.LEASED)))
        due = count(Delivery, Delivery.state.in_((DeliveryState.UNSENT, DeliveryState.SENDING)))
        idle = worker is not None or (isinstance(dispatcher, InProcessQueue) and dispatcher.idle())
        return busy == 0 and due == 0 and idle

    def run_state() -> str:
        """The demo run's state."""
        with services.uow.begin() as session:
            run = session.get(Run, run_id)
            return run.state if run is not None else "missing"

    settle("the sync", lambda: count(Observation, Observation.run_id == run_id) >= records)
    echo(f"3. synced {count(Observation, Observation.run_id == run_id)} observations into SQL")
    settle("acceptance", lambda: run_state() in (RunState.PUBLISHED, RunState.REJECTED))
    state = run_state()
    if state != RunState.PUBLISHED:
        raise DemoError(f"run {run_id} was {state}, not published")
    echo(f"4. run {run_id} accepted and published")
    settle(
        "the announcement",
        lambda: any(d["type"] == "dataset.published" for d in receiver.received) and quiet(),
    )
    result.deliveries = list(receiver.received)
    signed = all(d["signature_ok"] for d in receiver.received)
    kinds = ", ".join(str(d["type"]) for d in receiver.received)
    echo(
        f"5. delivered {len(receiver.received)} announcements to the receiver ({kinds}); "
        f"signatures {'valid' if signed else 'INVALID'}"
    )
    if not signed:
        raise DemoError("the receiver got an announcement with a wrong signature")

    report = reconcile.reconcile(services)
    settle("the reconcile's work", quiet)
    again = reconcile.reconcile(services)
    echo(
        f"6. reconcile asked Cloud: {report.listed} job listed, {report.unchanged} unchanged, "
        f"{len(report.wanted)} syncs wanted, {len(report.runs_evaluated)} runs evaluated; "
        f"a second pass: {'nothing to do' if not again.did_anything else again.summary_line()}"
    )

    written = export.export_dataset(services, "products")
    result.export_path, result.manifest_path = written.path, written.manifest_path
    result.records = written.records
    echo("")
    echo(status_text.format_table(status.overview(services)))
    echo("")
    echo(f"export:   {written.path} ({written.records} records, sha256 {written.sha256[:12]}…)")
    echo(f"manifest: {written.manifest_path}")
    echo(f"logs:     {folder / 'scrapesync.log'} (JSON lines: notifications, attempts, deliveries)")
    echo("")
    _show_queries(services, folder, run_id, echo, result)
    if isinstance(dispatcher, InProcessQueue) and dispatcher.failures:
        raise DemoError(f"worker jobs failed: {', '.join(dispatcher.failures)}")
    result.ok = True
