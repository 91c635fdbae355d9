"""The worker process: RQ's HerokuWorker that also keeps the maintenance pass scheduled."""

from __future__ import annotations

from typing import Any

from rq.worker import HerokuWorker

from sync import bootstrap, jobs, logs


class SyncWorker(HerokuWorker):
    """HerokuWorker (clean shutdown on SIGTERM) that schedules the sweeper when it starts."""

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """Schedule maintenance, then work as RQ does."""
        logs.configure()
        jobs.schedule_maintenance(bootstrap.from_env())
        return bool(super().work(*args, **kwargs))
