"""RQ job entry points: plain functions taking ids only, wired from the process environment."""

from __future__ import annotations

from datetime import timedelta

from sync import bootstrap, sweeper, tasks


def run_sync(task_key: str) -> str:
    """Run the sync task ``task_key``; returns its outcome."""
    return tasks.run_sync(bootstrap.from_env(), task_key).outcome


def maintain() -> dict[str, int]:
    """Sweep lost and due tasks, then schedule the next maintenance pass."""
    services = bootstrap.from_env()
    report = sweeper.sweep(services)
    schedule_maintenance(services)
    return {"due": report.due, "enqueued": report.enqueued}


def schedule_maintenance(services: bootstrap.Services) -> bool:
    """Make sure the next maintenance pass is scheduled (one per interval, whoever asks)."""
    interval = services.settings.sweep_interval
    now = services.clock()
    bucket = int(now.timestamp() // interval) + 1
    at = now.replace(microsecond=0) + timedelta(seconds=bucket * interval - now.timestamp())
    return services.dispatcher.enqueue_call(
        "sync.jobs.maintain", job_id=f"maintain-{bucket}", at=at
    )
