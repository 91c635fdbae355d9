"""A real worker process SIGKILLed between a run's verdict and its alert: the alert was written
with the verdict, so after recovery each channel gets it exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import select

from simulator import CloudState
from simulator.server import SimServer
from sync.bootstrap import Services
from sync.models import Alert
from tests.acceptance.flow import (
    DATASETS_TOML,
    HOOK_URL,
    SECRET,
    SECRET_ENV,
    finished_job,
    product_records,
    run_id_of,
    verdict,
)
from tests.alerts.conftest import ALERTS_TOML, SLACK_ENV, Mailbox
from tests.fakes import Receiver
from tests.harness import deployment_env, notify, run_worker

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

SWEEP_SECONDS = 0.5  # a restarted worker takes its maintenance turn at once


@pytest.fixture
def env(
    tmp_path: Path,
    database_url: str,
    sim: SimServer,
    loopback: Receiver,
    slack: Receiver,
    mailbox: Mailbox,
) -> dict[str, str]:
    """The environment of a worker of this deployment, with both alert channels."""
    return deployment_env(
        tmp_path,
        database_url=database_url,
        sim=sim,
        datasets_toml=ALERTS_TOML + DATASETS_TOML.replace(HOOK_URL, loopback.url),
        **{
            SECRET_ENV: SECRET,
            SLACK_ENV: slack.url,
            "SCRAPESYNC_SMTP_URL": mailbox.url,
            "SCRAPESYNC_SWEEP_SECONDS": str(SWEEP_SECONDS),
        },
    )


def alert_states(services: Services) -> list[tuple[str, str]]:
    """Each alert row's channel and state."""
    with services.uow.begin() as session:
        return sorted((a.channel, a.state) for a in session.execute(select(Alert)).scalars())


def test_a_worker_killed_between_verdict_and_alert_sends_it_once_after_restart(
    web: Flask,
    services: Services,
    cloud: CloudState,
    env: dict[str, str],
    slack: Receiver,
    mailbox: Mailbox,
) -> None:
    """SIGKILL right after the rejection commits: the alert rows are durable and unsent; the
    restarted worker's maintenance pass queues the sender and each channel gets one message."""
    job_id = finished_job(cloud, product_records(40, garbage="beta.example"))
    notify(web, job_id)
    killed = run_worker(env, kill_at="after-acceptance")
    assert "terminated unexpectedly" in killed.stderr + killed.stdout, killed.stderr[-2000:]
    assert verdict(services, run_id_of(job_id)).state == "rejected"
    assert alert_states(services) == [
        ("email:ops@example.com", "unsent"),
        (f"slack:{SLACK_ENV}", "unsent"),
    ]
    assert slack.requests == []
    assert mailbox.messages == []
    time.sleep(SWEEP_SECONDS)  # the killed worker's maintenance turn is over
    recovered = run_worker(env)
    assert recovered.returncode == 0, recovered.stderr[-2000:]
    assert len(slack.requests) == 1
    assert f"run {run_id_of(job_id)} of dataset products was rejected" in str(
        slack.requests[0].body["text"]
    )
    assert len(mailbox.messages) == 1
    assert alert_states(services) == [
        ("email:ops@example.com", "delivered"),
        (f"slack:{SLACK_ENV}", "delivered"),
    ]
    again = run_worker(env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (len(slack.requests), len(mailbox.messages)) == (1, 1)
