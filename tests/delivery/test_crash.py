"""A real worker process SIGKILLed after the acceptance commit and before any delivery: after
recovery the receiver sees each event exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import select

from simulator import CloudState
from simulator.server import SimServer
from sync import jobs
from sync.bootstrap import Services
from sync.models import OutboxEvent
from tests.acceptance.flow import (
    DATASETS_TOML,
    HOOK_URL,
    SECRET,
    SECRET_ENV,
    finished_job,
    product_records,
    published,
    run_id_of,
)
from tests.fakes import Receiver
from tests.harness import deployment_env, notify, run_worker

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]


@pytest.fixture
def env(tmp_path: Path, database_url: str, sim: SimServer, loopback: Receiver) -> dict[str, str]:
    """The environment of a worker of this deployment, announcing to the loopback receiver."""
    return deployment_env(
        tmp_path,
        database_url=database_url,
        sim=sim,
        datasets_toml=DATASETS_TOML.replace(HOOK_URL, loopback.url),
        **{SECRET_ENV: SECRET},
    )


def test_a_worker_killed_after_acceptance_delivers_each_event_once_after_restart(
    web: Flask,
    services: Services,
    cloud: CloudState,
    env: dict[str, str],
    loopback: Receiver,
) -> None:
    """SIGKILL right after the run is accepted and published: the events are durable and
    unsent; the maintenance sweep re-drives them and a new worker delivers each id once."""
    job_id = finished_job(cloud, product_records(200))
    notify(web, job_id)
    killed = run_worker(env, kill_at="after-acceptance")
    assert "terminated unexpectedly" in killed.stderr + killed.stdout, killed.stderr[-2000:]
    assert published(services) == run_id_of(job_id)
    with services.uow.begin() as session:
        events = {e.event_id: e.state for e in session.execute(select(OutboxEvent)).scalars()}
    assert sorted(events.values()) == ["unsent"] * 3  # accepted, published, changed
    assert loopback.requests == []
    assert jobs.maintain()["deliveries_due"] == 3
    recovered = run_worker(env)
    assert recovered.returncode == 0, recovered.stderr[-2000:]
    assert sorted(r.event_id for r in loopback.requests) == sorted(events)
    assert all(r.signed for r in loopback.requests)
    with services.uow.begin() as session:
        states = {e.state for e in session.execute(select(OutboxEvent)).scalars()}
    assert states == {"delivered"}
