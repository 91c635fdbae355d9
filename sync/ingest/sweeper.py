"""The sweeper: finds sync tasks that should be running and are not (RQ job lost when Redis
restarted or was flushed, lease expired because its worker died, retry time come) and queues
them again. Queuing is idempotent, so sweeping twice changes nothing."""

from __future__ import annotations

from dataclasses import dataclass

from sync import logs
from sync.bootstrap import Services
from sync.ingest import store
from sync.models import MaintenanceRun
from sync.states import PassKind

log = logs.get("sweeper")


@dataclass(frozen=True)
class SweepReport:
    """What one sweep found and did."""

    due: int
    enqueued: int
    enqueue_failures: int


def sweep(services: Services) -> SweepReport:
    """Queue every due task whose RQ job is not already waiting."""
    now = services.clock()
    with services.uow.begin() as session:
        due = store.due_tasks(session, now=now)
    enqueued = failures = 0
    for task_key, generation, attempts in due:
        queued = services.dispatcher.sync(
            task_key, generation=generation, attempts=attempts, failure_event="sweep.enqueue_failed"
        )
        if queued is None:
            failures += 1
        elif queued:
            enqueued += 1
    report = SweepReport(due=len(due), enqueued=enqueued, enqueue_failures=failures)
    if not due:
        return report  # an idle sweep leaves no row: the workers sweep every interval
    with services.uow.begin() as session:
        session.add(
            MaintenanceRun(
                kind=PassKind.SWEEP,
                started_at=now,
                finished_at=services.clock(),
                summary={"due": report.due, "enqueued": enqueued, "failures": failures},
            )
        )
        session.commit()
    if enqueued or failures:
        log.info("sweep.done", extra={"due": report.due, "enqueued": enqueued})
    return report
