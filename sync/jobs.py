"""RQ job entry points: plain functions taking ids only, wired from the process environment."""

from __future__ import annotations

from sync import bootstrap
from sync.alerts import sender
from sync.delivery import relay as relaying
from sync.ingest import tasks
from sync.operations import maintenance
from sync.operations import reconcile as reconciliation
from sync.runs import evaluation


def run_sync(task_key: str) -> str:
    """Run the sync task ``task_key``; returns its outcome."""
    return tasks.run_sync(bootstrap.from_env(), task_key).outcome


def evaluate_run(run_id: str) -> str:
    """Evaluate the run ``run_id`` and publish it if it is accepted; returns the outcome."""
    return evaluation.evaluate_run(bootstrap.from_env(), run_id).outcome


def deliver(event_id: str) -> dict[str, int]:
    """Deliver one outbox event to the destinations it is due at, and what waited behind it."""
    report = relaying.relay(bootstrap.from_env(), event_id=event_id, follow=True)
    return {"claimed": report.claimed, "delivered": report.delivered}


def relay() -> dict[str, int]:
    """Deliver every due outbox event (the re-drive after a lost job or a dead worker)."""
    report = relaying.relay(bootstrap.from_env())
    return {"claimed": report.claimed, "delivered": report.delivered}


def reconcile() -> dict[str, int]:
    """One reconcile pass: heal lost notifications, stuck tasks and undelivered events."""
    report = reconciliation.reconcile(bootstrap.from_env(), max_wait=reconciliation.WORKER_MAX_WAIT)
    return {"listed": report.listed, "wanted": len(report.wanted), "enqueued": report.enqueued}


def maintain() -> dict[str, int]:
    """One maintenance pass, when queued by hand (workers run it on their own timer)."""
    return maintenance.run_pass(bootstrap.from_env()).counts


def send_alerts() -> dict[str, int]:
    """Send every due alert message to its channel."""
    report = sender.send_due(bootstrap.from_env())
    return {"claimed": report.claimed, "delivered": report.delivered}
