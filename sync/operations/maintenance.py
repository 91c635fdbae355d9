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
released, so it spaces the passes). When Redis does not answer, the last pass's heartbeat in SQL
spaces them instead (it then mostly finds that it cannot queue, and says so). Never two at
once: a pass runs under a PostgreSQL advisory lock held by its own connection, so a second
worker whose turn came while the first is still inside a pass (Redis flushed, the lock expired
on a long pass) leaves it to that one. A pass that cannot reach the database runs anyway, so
that its steps say what failed. An exception in a step is logged; the other steps and the next
pass still run.

RQ forks a work horse for every job. A fork taken while the maintenance thread is inside a pass
would copy locks that thread holds (SQLAlchemy's, psycopg's, the log handler's) into a child
that can never release them, so a fork waits for the pass under way to end (at-fork hooks).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from sync import db, logs
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
_PASS_LOCK_SPACE = 0x5C5F  # the advisory lock's first key: a maintenance pass under way

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
    """Whether this worker runs the pass now: True when it takes the short lock; when Redis
    cannot be asked, when no pass has beaten for 80% of an interval (a pass too many is
    harmless; a pass too few is not)."""
    if services.redis is None:
        return True
    ttl_ms = max(1, int(services.settings.sweep_interval * LOCK_SHARE * 1000))
    try:
        return bool(services.redis.set(LOCK_KEY, owner, nx=True, px=ttl_ms))
    except Exception:
        log.warning("maintenance.lock_unavailable", exc_info=True)
        return _spaced_by_heartbeat(services)


def _spaced_by_heartbeat(services: Services) -> bool:
    try:
        with services.uow.begin() as session:
            last = heartbeat.latest(session)
    except Exception:  # the database does not answer either: the pass says what failed
        return True
    return (
        last is None or last.age(services.clock()) >= services.settings.sweep_interval * LOCK_SHARE
    )


@contextmanager
def _only_pass(services: Services) -> Iterator[bool]:
    """Whether no other pass is under way, in any worker (see ``sync.db.alone``); True when the
    database cannot be asked, so that the pass's steps meet it and say so."""
    with ExitStack() as stack:
        try:
            lock = db.alone(services.uow, _PASS_LOCK_SPACE, heartbeat.MAINTENANCE)
            alone = stack.enter_context(lock)
        except Exception:
            alone = True
        yield alone


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
                with _only_pass(self.services) as alone:
                    if not alone:
                        log.info("maintenance.pass_under_way")
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
