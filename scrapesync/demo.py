"""``scrapesync demo``: the whole flow once, on one machine, with nothing but Python.

One process plays every part (the stage, :mod:`scrapesync.demo_stage`): the simulated Cloud and the
web process on loopback sockets, a worker (RQ on the Redis that ``REDIS_URL`` names if it answers,
else an in-process queue), and a receiver for the outbox's signed POSTs. The demo launches a run,
lets Cloud scrape and notify twice, and waits until the records are synced, the run accepted and
published, and the announcement delivered; then it shows that a reconcile and the workers'
maintenance pass find nothing left to do, prints the status table and writes the published export.
Everything lives in one folder (SQLite, export, JSON logs). It supplies its own tokens, so no Cloud
account or variable is needed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scrapesync.demo_stage import InProcessQueue, Stage, set_stage
from sync import bootstrap, logs
from sync.datasets import export
from sync.models import Observation, Run
from sync.operations import maintenance, reconcile, status, status_text
from sync.runs import launch
from sync.states import RunState

DEFAULT_TIMEOUT = 90.0

log = logs.get("demo")


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


_LOGGERS = ("scrapesync", "rq")  # the trees whose JSON lines the demo keeps in its log file


@contextmanager
def _logs_to(path: Path) -> Iterator[None]:
    """Send scrapesync's and RQ's JSON log lines to a file instead of the demo's own output:
    the handlers the command set up (standard error) stand aside until the demo ends."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logs.JsonFormatter())
    kept = {}
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        kept[name] = (logger.handlers[:], logger.level, logger.propagate)
        logger.handlers = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False
    try:
        yield
    finally:
        for name, (handlers, level, propagate) in kept.items():
            logger = logging.getLogger(name)
            logger.handlers = handlers
            logger.setLevel(level)
            logger.propagate = propagate
        handler.close()


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
    cleanup: list[Callable[[], None]] = []
    with _logs_to(folder / "scrapesync.log"):
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


@dataclass
class _Flow:
    """What each step of the demo's walk through the flow works with."""

    stage: Stage
    echo: Callable[[str], None]
    result: DemoResult
    deadline: float

    def settle(self, what: str, done: Callable[[], bool]) -> None:
        """Let the worker run until ``done()``, or give up at the deadline."""
        while not done():
            self.stage.work()
            if time.monotonic() > self.deadline:
                raise DemoError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def run_state(self, run_id: str) -> str:
        """The demo run's state."""
        with self.stage.services.uow.begin() as session:
            run = session.get(Run, run_id)
            return run.state if run is not None else "missing"


def _run(
    folder: Path,
    records: int,
    echo: Callable[[str], None],
    timeout: float,
    result: DemoResult,
    cleanup: list[Callable[[], None]],
) -> None:
    """Set the stage, then walk the flow from launch to export, checking each step."""
    deadline = time.monotonic() + timeout
    stage = set_stage(folder, cleanup)
    echo(f"scrapesync demo: every part on this machine, files in {folder}")
    echo(f"  database  {folder / 'scrapesync.db'} (SQLite, migrated)")
    echo(f"  queue     {stage.queue_line}")
    echo(f"  Cloud     simulated Web Scraper Cloud at {stage.api_url}")
    echo(f"  web       {stage.web_url} (notifications in, /status out)")
    echo(f"  receiver  {stage.receiver_url} (signed announcements)")
    flow = _Flow(stage, echo, result, deadline)
    run_id = _launch_and_scrape(flow, records)
    _sync_and_publish(flow, run_id, records)
    _announce(flow)
    _reconcile_twice(flow)
    _maintain(flow)
    _export_and_show(flow, folder, run_id)
    if isinstance(stage.dispatcher, InProcessQueue) and stage.dispatcher.failures:
        raise DemoError(f"worker jobs failed: {', '.join(stage.dispatcher.failures)}")
    result.ok = True


def _launch_and_scrape(flow: _Flow, records: int) -> str:
    """Steps 1 and 2: launch the run's Cloud job, let Cloud scrape it and notify twice."""
    stage = flow.stage
    outcome = launch.launch(stage.services, "products")
    flow.result.run_id = run_id = outcome.run_id
    assert outcome.job_id is not None
    flow.echo(
        f"1. launched run {run_id}: Cloud job {outcome.job_id} (custom_id {outcome.batch_id})"
    )
    stage.cloud.set_generated(outcome.job_id, records)
    stage.cloud.run_job(outcome.job_id)
    stage.cloud.notify(outcome.job_id)  # Cloud may notify twice; the second one must change nothing
    flow.settle("Cloud's two notifications", lambda: stage.cloud.wait_for_notifications(0.05))
    accepted = sum(1 for n in stage.cloud.notifications_sent if n["ok"])
    flow.echo(f"2. Cloud scraped {records} records and notified {accepted} times")
    return run_id


def _sync_and_publish(flow: _Flow, run_id: str, records: int) -> None:
    """Steps 3 and 4: the records synced into SQL, the run accepted and published."""
    stage = flow.stage
    in_run = Observation.run_id == run_id
    flow.settle("the sync", lambda: stage.count(Observation, in_run) >= records)
    flow.echo(f"3. synced {stage.count(Observation, in_run)} observations into SQL")
    flow.settle(
        "acceptance", lambda: flow.run_state(run_id) in (RunState.PUBLISHED, RunState.REJECTED)
    )
    state = flow.run_state(run_id)
    if state != RunState.PUBLISHED:
        raise DemoError(f"run {run_id} was {state}, not published")
    flow.echo(f"4. run {run_id} accepted and published")


def _announce(flow: _Flow) -> None:
    """Step 5: the announcements delivered to the receiver, each with a valid signature."""
    stage, receiver = flow.stage, flow.stage.receiver
    flow.settle(
        "the announcement",
        lambda: any(d["type"] == "dataset.published" for d in receiver.received) and stage.quiet(),
    )
    flow.result.deliveries = list(receiver.received)
    signed = all(d["signature_ok"] for d in receiver.received)
    kinds = ", ".join(str(d["type"]) for d in receiver.received)
    flow.echo(
        f"5. delivered {len(receiver.received)} announcements to the receiver ({kinds}); "
        f"signatures {'valid' if signed else 'INVALID'}"
    )
    if not signed:
        raise DemoError("the receiver got an announcement with a wrong signature")


def _reconcile_twice(flow: _Flow) -> None:
    """Step 6: a reconcile finds nothing lost, and a second pass has nothing to do."""
    services = flow.stage.services
    report = reconcile.reconcile(services)
    flow.settle("the reconcile's work", flow.stage.quiet)
    again = reconcile.reconcile(services)
    flow.echo(
        f"6. reconcile asked Cloud: {report.listed} job listed, {report.unchanged} unchanged, "
        f"{len(report.wanted)} syncs wanted, {len(report.runs_evaluated)} runs evaluated; "
        f"a second pass: {'nothing to do' if not again.did_anything else again.summary_line()}"
    )


def _maintain(flow: _Flow) -> None:
    """Step 7: the maintenance pass every worker runs on its timer finds nothing due either (and
    the status shows that it ran)."""
    swept = maintenance.run_pass(flow.stage.services)
    if swept.failed:
        raise DemoError(f"the maintenance pass failed at: {', '.join(swept.failed)}")
    flow.settle("the maintenance pass's work", flow.stage.quiet)
    queued = swept.counts.get("enqueued", 0) + swept.counts.get("evaluations", 0)
    flow.echo(
        f"7. a maintenance pass (every worker's timer): {swept.counts.get('due', 0)} syncs due, "
        f"{queued} jobs queued, {swept.counts.get('deliveries_due', 0)} deliveries due"
    )


def _export_and_show(flow: _Flow, folder: Path, run_id: str) -> None:
    """The status table, the published export, the logs, and two queries to paste."""
    services, echo, result = flow.stage.services, flow.echo, flow.result
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
