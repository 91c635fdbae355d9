"""RQ job entry points: plain functions taking ids only, wired from the process environment."""

from __future__ import annotations

from datetime import timedelta

from sync import bootstrap, heartbeat, outbox, runs, sweeper, tasks
from sync import reconcile as reconciliation


def run_sync(task_key: str) -> str:
    """Run the sync task ``task_key``; returns its outcome."""
    return tasks.run_sync(bootstrap.from_env(), task_key).outcome


def evaluate_run(run_id: str) -> str:
    """Evaluate the run ``run_id`` and publish it if it is accepted; returns the outcome."""
    return runs.evaluate_run(bootstrap.from_env(), run_id).outcome


def deliver(event_id: str) -> dict[str, int]:
    """Deliver one outbox event to the destinations it is due at."""
    report = outbox.relay(bootstrap.from_env(), event_id=event_id)
    return {"claimed": report.claimed, "delivered": report.delivered}


def relay() -> dict[str, int]:
    """Deliver every due outbox event (the re-drive after a lost job or a dead worker)."""
    report = outbox.relay(bootstrap.from_env())
    return {"claimed": report.claimed, "delivered": report.delivered}


def reconcile() -> dict[str, int]:
    """One reconcile pass: heal lost notifications, stuck tasks and undelivered events."""
    report = reconciliation.reconcile(bootstrap.from_env(), max_wait=reconciliation.WORKER_MAX_WAIT)
    return {"listed": report.listed, "wanted": len(report.wanted), "enqueued": report.enqueued}


def maintain() -> dict[str, int]:
    """Sweep lost and due tasks, runs due for evaluation and due deliveries, queue a reconcile
    pass once per reconcile interval, then schedule the next maintenance pass."""
    services = bootstrap.from_env()
    report = sweeper.sweep(services)
    evaluations = runs.redrive(services)
    deliveries = outbox.redrive(services)
    reconciliation.schedule(services)
    heartbeat.beat(services)
    schedule_maintenance(services)
    return {
        "due": report.due,
        "enqueued": report.enqueued,
        "evaluations": evaluations,
        "deliveries_due": deliveries,
    }


def schedule_maintenance(services: bootstrap.Services) -> bool:
    """Make sure the next maintenance pass is scheduled (one per interval, whoever asks)."""
    interval = services.settings.sweep_interval
    now = services.clock()
    bucket = int(now.timestamp() // interval) + 1
    at = now.replace(microsecond=0) + timedelta(seconds=bucket * interval - now.timestamp())
    return services.dispatcher.enqueue_call(
        "sync.jobs.maintain", job_id=f"maintain-{bucket}", at=at
    )
