"""Alerts to people through the real worker path: a rejected run is told once to a Slack-style
receiver and by e-mail through a real SMTP server, a second rejection within the alert interval
is not, and the next accepted run says "recovered"; a job of a sitemap no dataset names is told
to nobody."""

from __future__ import annotations

import pytest
from flask import Flask
from sqlalchemy import select

from simulator import CloudState
from sync.alerts import sender, watch
from sync.bootstrap import Services
from sync.models import Alert
from tests.acceptance.flow import finished_job, product_records, run_id_of, settle, verdict
from tests.alerts.conftest import SMTP_PASSWORD, SMTP_USER, Mailbox
from tests.fakes import Receiver
from tests.harness import notify, task_of

pytestmark = [pytest.mark.redis, pytest.mark.postgres]


def texts(slack: Receiver) -> list[str]:
    """The text of each message the Slack-style receiver got."""
    return [str(r.body["text"]) for r in slack.requests]


def sync(web: Flask, services: Services, job_id: int) -> None:
    """Cloud notifies; the worker syncs, judges, delivers and alerts."""
    notify(web, job_id)
    settle(services)


def test_a_rejected_run_is_told_once_per_interval_and_its_recovery_too(
    web: Flask, services: Services, cloud: CloudState, slack: Receiver, mailbox: Mailbox
) -> None:
    """One Slack-style message and one e-mail for a rejected run, naming its reasons, figures
    and `scrapesync check RUN`; none for a second rejection within the interval; "recovered"
    on both channels when the next run is accepted."""
    bad = finished_job(cloud, product_records(40, garbage="beta.example"))
    sync(web, services, bad)
    assert verdict(services, run_id_of(bad)).state == "rejected"
    (text,) = texts(slack)
    assert f"run {run_id_of(bad)} of dataset products was rejected" in text
    assert "partition_quarantined" in text
    assert "beta.example (10 records)" in text
    assert f"scrapesync check {run_id_of(bad)}" in text
    (mail,) = mailbox.messages
    assert mail["To"] == "ops@example.com"
    assert mail["Subject"] == "[scrapesync] products: run rejected"
    assert f"scrapesync check {run_id_of(bad)}" in mailbox.bodies()[0]
    assert mailbox.logins == [(SMTP_USER, SMTP_PASSWORD)]

    worse = finished_job(cloud, product_records(40, start=40, garbage="gamma.example"))
    sync(web, services, worse)
    assert verdict(services, run_id_of(worse)).state == "rejected"
    assert len(slack.requests) == 1
    assert len(mailbox.messages) == 1

    good = finished_job(cloud, product_records(40, start=80))
    sync(web, services, good)
    assert verdict(services, run_id_of(good)).state == "published"
    assert len(texts(slack)) == 2
    recovered = texts(slack)[1]
    assert "recovered" in recovered
    assert f"run {run_id_of(good)} was accepted" in recovered
    assert f"scrapesync check {run_id_of(good)}" in recovered
    assert len(mailbox.messages) == 2
    assert mailbox.messages[1]["Subject"] == "[scrapesync] products: recovered (run rejected)"
    with services.uow.begin() as session:
        states = [a.state for a in session.execute(select(Alert)).scalars()]
    assert states == ["delivered"] * 4


def test_a_job_of_a_sitemap_no_dataset_names_is_ignored_and_told_to_no_channel(
    web: Flask, services: Services, cloud: CloudState, slack: Receiver, mailbox: Mailbox
) -> None:
    """Cloud notifies every job of the account: a finished job of another sitemap leaves an
    ``ignored`` task, and neither the worker path nor the maintenance pass's watch tells any
    channel about it."""
    other = cloud.add_sitemap("someone-elses-sitemap")
    job_id = cloud.create_job(other)
    cloud.run_job(job_id, n=3)
    notify(web, job_id, sitemap_name="someone-elses-sitemap")
    settle(services)
    assert task_of(services, f"job-{job_id}").state == "ignored"
    assert watch.check(services)["alerts_written"] == 0
    sender.send_due(services)
    assert slack.requests == []
    assert mailbox.messages == []
    with services.uow.begin() as session:
        assert session.execute(select(Alert)).first() is None
