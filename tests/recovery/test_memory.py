"""A big job through the Procfile's worker within a small dyno's memory: the whole path (import,
evaluation, publication, announcement) is watched, every process of the worker, and killed as a
memory limit would kill it if any passes the limit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import func, select

from scrapesync.processes import Deployment, descendants, kill_tree, wait_until
from simulator import CloudState
from simulator.server import SimServer
from sync.bootstrap import Services
from sync.models import OutboxEvent, Run
from tests.datasets.flow import tables
from tests.harness import deployment_env, notify, products_sitemap

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

RECORDS = 300_000
LIMIT_MIB = 512


def _rss_mib(pid: int) -> float:
    """A process's resident memory now (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


class Watchdog(threading.Thread):
    """Samples every process of the worker; kills them all when one passes the limit."""

    def __init__(self, deployment: Deployment, limit_mib: float) -> None:
        super().__init__(daemon=True)
        self.deployment, self.limit = deployment, limit_mib
        self.peak = 0.0
        self.killed = False
        self.done = threading.Event()

    def run(self) -> None:
        """Sample five times a second until told to stop."""
        while not self.done.wait(0.2):
            for process in self.deployment.processes:
                if process.poll() is not None:
                    continue
                for pid in [process.pid, *descendants(process.pid)]:
                    self.peak = max(self.peak, _rss_mib(pid))
                if self.peak > self.limit:
                    self.killed = True
                    kill_tree(process)


def _published(services: Services) -> bool:
    """Whether the job's run has been published."""
    with services.uow.begin() as session:
        states = set(session.execute(select(Run.state).where(Run.dataset == "products")).scalars())
    return states == {"published"}


def test_a_300k_record_job_is_published_by_a_worker_that_never_passes_512_mib(
    web: Flask,
    services: Services,
    cloud: CloudState,
    sim: SimServer,
    deployment: Deployment,
    tmp_path: Path,
    database_url: str,
) -> None:
    """Three hundred thousand records are synced, judged, published into datasets.products and
    announced by the Procfile's worker, none of whose processes ever holds 512 MiB."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.set_generated(job_id, RECORDS)
    cloud.run_job(job_id)
    env = deployment_env(tmp_path, database_url=database_url, sim=sim)
    notify(web, job_id)
    watchdog = Watchdog(deployment, LIMIT_MIB)
    watchdog.start()
    worker = deployment.start("worker", env)

    try:
        wait_until(
            lambda: _published(services) or watchdog.killed or worker.poll() is not None,
            timeout=600,
            what="the run is published",
            report=deployment.logs,
        )
    finally:
        watchdog.done.set()
        watchdog.join()
    print(f"\n300k-record job: worker peak RSS {watchdog.peak:.0f} MiB")
    assert not watchdog.killed, f"a worker process passed {LIMIT_MIB} MiB: {watchdog.peak:.0f}"
    assert _published(services), deployment.logs()
    with services.uow.begin() as session:
        current = tables(services).current
        assert session.execute(select(func.count()).select_from(current)).scalar() == RECORDS
        types = set(session.execute(select(OutboxEvent.event_type)).scalars())
    assert {"run.accepted", "dataset.published", "dataset.changed"} <= types
