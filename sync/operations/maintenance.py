"""Maintenance that cannot stop: every worker process runs the maintenance pass on its own timer.

The pass sweeps lost, expired and due sync tasks back onto the queue, queues the evaluations and
deliveries that are due, queues a reconcile pass once per reconcile interval, raises and settles
the alerts it watches (``sync.alerts.watch``), and deletes what retention lets go (a few bounded
batches per table; see ``sync.operations.retention``). It runs in a daemon thread of each
worker's main process, on a plain timer: it depends neither on RQ's scheduler nor on anything
stored only in Redis, so a dead scheduler's lock, a flushed or restarted Redis, or a database
restart cannot end it. Every step reads what is due from SQL and
every queuing is idempotent, so an extra pass is harmless.

One pass per interval across all workers: a worker ticks five times per interval and runs a
pass only when it takes a short lock in Redis (``SET NX PX``, 80% of the interval, never
released, so it spaces the passes). When Redis does not answer the worker runs the pass anyway
(it then mostly finds that it cannot queue, and says so). An exception in a step is logged; the
other steps and the next pass still run.

RQ forks a work horse for every job. A fork taken while the maintenance thread is inside a pass
would copy locks that thread holds (SQLAlchemy's, psycopg's, the log handler's) into a child
that can never release them, so a fork waits for the pass under way to end (at-fork hooks).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sync import logs
from sync.alerts import sender as alert_sender
from sync.alerts import watch
from sync.bootstrap import Services
from sync.delivery import relay
from sync.ingest import sweeper
from sync.operations import heartbeat, retention
from sync.operations import reconcile as reconciliation
from sync.runs import due

log = logs.get("maintenance")

LOCK_KEY = "scrapesync:maintenance-lock"
TICKS_PER_INTERVAL = 5
LOCK_SHARE = 0.8

_in_pass = threading.RLock()  # held for a whole pass; a fork waits for it


def _before_fork() -> None:
    _in_pass.acquire()


def _after_fork_in_parent() -> None:
    _in_pass.release()


def _after_fork_in_child() -> None:
    global _in_pass
    _in_pass = threading.RLock()  # the child has no maintenance thread


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


@dataclass
class PassReport:
    """What one maintenance pass did (counts), and the steps that failed."""

    counts: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


def _sweep(services: Services) -> dict[str, int]:
    report = sweeper.sweep(services)
    return {"due": report.due, "enqueued": report.enqueued}


STEPS: tuple[tuple[str, Callable[[Services], dict[str, int] | int | bool]], ...] = (
    ("sweep", _sweep),
    ("evaluations", due.redrive),
    ("deliveries_due", relay.redrive),
    ("reconcile_queued", reconciliation.schedule),
    ("alerts", watch.check),
    # retention last: what is due is queued before anything is deleted, and each table is its
    # own step, so that one which cannot take its locks leaves the others to go on
    ("observations_pruned", retention.prune_observations),
    ("notifications_pruned", retention.prune_notifications),
    ("attempts_pruned", retention.prune_attempts),
    ("outbox_pruned", retention.prune_outbox),
    ("alerts_deleted", alert_sender.prune),  # sent alerts past the outbox retention
)


def run_pass(services: Services) -> PassReport:
    """One maintenance pass; a step that raises is logged and the next step still runs. The
    pass ends with its heartbeat row, so that operators can see when it last came round."""
    services.killpoints.reached("maintenance-pass")  # a drill holds a pass here, forks waiting
    report = PassReport()
    for name, step in STEPS:
        try:
            outcome = step(services)
        except Exception:
            report.failed.append(name)
            log.warning("maintenance.step_failed", extra={"step": name}, exc_info=True)
            continue
        if isinstance(outcome, dict):
            report.counts.update(outcome)
        else:
            report.counts[name] = int(outcome)
    try:
        heartbeat.beat(services, summary={**report.counts, "failed": report.failed})
    except Exception:
        report.failed.append("heartbeat")
        log.warning("maintenance.step_failed", extra={"step": "heartbeat"}, exc_info=True)
    return report


def take_turn(services: Services, owner: str) -> bool:
    """Whether this worker runs the pass now: True when it takes the short lock, or when Redis
    cannot be asked (a pass too many is harmless; a pass too few is not)."""
    if services.redis is None:
        return True
    ttl_ms = max(1, int(services.settings.sweep_interval * LOCK_SHARE * 1000))
    try:
        return bool(services.redis.set(LOCK_KEY, owner, nx=True, px=ttl_ms))
    except Exception:
        log.warning("maintenance.lock_unavailable", exc_info=True)
        return True


class MaintenanceLoop:
    """A daemon thread that offers a maintenance pass every fifth of the sweep interval."""

    def __init__(self, services: Services, *, owner: str) -> None:
        self.services = services
        self.owner = owner
        self.passes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scrapesync-maintenance")
        self._thread.daemon = True

    def start(self) -> None:
        """Start ticking; the first pass is offered at once."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the pass under way, if any."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def tick(self) -> bool:
        """Offer one pass: run it if it is this worker's turn. Never raises."""
        with _in_pass:  # its log lines too: a fork must not copy a half-written stdout buffer
            try:
                if not take_turn(self.services, self.owner):
                    return False
                report = run_pass(self.services)
            except Exception:  # whatever happens, the next tick still comes
                log.exception("maintenance.pass_failed")
                return False
            self.passes += 1
            if report.failed or report.counts.get("enqueued"):
                log.info("maintenance.pass", extra={**report.counts, "failed": report.failed})
            return True

    def _run(self) -> None:
        period = self.services.settings.sweep_interval / TICKS_PER_INTERVAL
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(period)
