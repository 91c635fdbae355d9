"""Alert channels as an operator meets them: the datasets file refuses a bad ``[[alerts]]``
entry with a clear error, a channel limited to some datasets hears only of them, dead
deliveries and stale datasets are told by the maintenance pass once per interval, and no secret
(a Slack-style URL's token, the SMTP password) reaches a message, a row or a log line."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from flask import Flask
from redis import Redis
from sqlalchemy import select

from config.datasets import DatasetsFileError, parse_datasets
from simulator import CloudState, SimServer
from sync import bootstrap, logs
from sync.alerts import sender, watch
from sync.alerts.conditions import AlertReason, Notice, catch_up, fire, recover
from sync.bootstrap import Services
from sync.cloud.budget import MemoryApiBudget
from sync.models import Alert, AlertCondition
from sync.operations import maintenance
from tests.acceptance.flow import (
    DATASETS_TOML,
    SECRET,
    finished_job,
    product_records,
    settle,
    use_datasets,
)
from tests.alerts.conftest import ALERT_SECRETS, ALERTS_TOML, SLACK_ENV, Mailbox
from tests.fakes import Receiver
from tests.harness import at_time, notify
from tests.operations.test_doctor import GOOD_DATASETS, account, checks, doctor  # noqa: F401

pytestmark = [pytest.mark.redis, pytest.mark.postgres]


@pytest.fixture
def log_text() -> Iterator[io.StringIO]:
    """Every line scrapesync's and RQ's loggers write, as the JSON formatter renders it."""
    logs.configure()
    sink = io.StringIO()
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logs.JsonFormatter())
    watched = [logging.getLogger(name) for name in ("scrapesync", "rq.worker", "httpx")]
    for logger in watched:
        logger.addHandler(handler)
    yield sink
    for logger in watched:
        logger.removeHandler(handler)


def alert_rows(services: Services) -> list[Alert]:
    """Every alert row, oldest first (detached plain objects)."""
    with services.uow.begin() as session:
        rows = list(session.execute(select(Alert).order_by(Alert.id)).scalars())
        session.expunge_all()
        return rows


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('kind = "pager"', "kind must be one of slack, webhook, email, got 'pager'"),
        ('kind = "slack"', "needs url_env, the name of the environment variable"),
        ('kind = "slack"\nurl = "https://hooks.example/x"', "unknown keys ['url']"),
        ('kind = "webhook"\nurl = "https://ops.example/h"', "needs secret_env"),
        ('kind = "email"\nto = "ops@example.com"', "to must be a non-empty list of e-mail"),
        ('kind = "email"\nto = ["ops"]', "to must hold e-mail addresses"),
        (
            'kind = "email"\nto = ["ops@example.com"]\ndatasets = ["prices"]',
            "datasets names unknown datasets ['prices'] (known: products)",
        ),
    ],
)
def test_a_bad_alerts_entry_is_refused_naming_the_file_the_entry_and_the_key(
    entry: str, message: str
) -> None:
    """Each mistake in an ``[[alerts]]`` entry is an error that says where and what."""
    with pytest.raises(DatasetsFileError) as refused:
        parse_datasets(f"[[alerts]]\n{entry}\n" + DATASETS_TOML, source="datasets.toml")
    assert "datasets.toml: [[alerts]] #1" in str(refused.value)
    assert message in str(refused.value)


def test_alert_timings_are_durations_and_stale_after_defaults_by_window() -> None:
    """``alert_interval`` and ``stale_after`` read "6h"-style durations; a daily dataset goes
    stale after two days unless told otherwise, a per-job one never; nonsense is refused."""
    daily = DATASETS_TOML.replace('window = "job"', 'window = "daily"')
    parsed = parse_datasets('alert_interval = "1h30m"\n' + daily)
    assert parsed.alert_interval == 5400
    assert parsed.get("products").stale_after == 2 * 86400
    assert parse_datasets(DATASETS_TOML).get("products").stale_after is None
    off = daily.replace('policy = "reject"', 'policy = "reject"\nstale_after = "off"')
    assert parse_datasets(off).get("products").stale_after is None
    with pytest.raises(DatasetsFileError, match=r"alert_interval must be a duration"):
        parse_datasets('alert_interval = "soon"\n' + DATASETS_TOML)
    bad = DATASETS_TOML.replace('policy = "reject"', 'policy = "reject"\nstale_after = -5')
    with pytest.raises(DatasetsFileError, match=r"\[datasets.products\].stale_after"):
        parse_datasets(bad)


def test_no_secret_reaches_a_message_a_row_or_a_log_line(
    web: Flask,
    services: Services,
    cloud: CloudState,
    slack: Receiver,
    mailbox: Mailbox,
    log_text: io.StringIO,
) -> None:
    """The Slack-style receiver first fails echoing its own URL: the retry is stored and logged
    with the token masked; messages, mails and rows never hold the token or the SMTP password."""
    slack.plan = [lambda: httpx.Response(500, text=f"cannot route {slack.url}")]
    job_id = finished_job(cloud, product_records(40, garbage="beta.example"))
    notify(web, job_id)
    settle(services)
    failed = next(a for a in alert_rows(services) if a.channel == f"slack:{SLACK_ENV}")
    assert failed.state == "failed"
    assert failed.last_error is not None
    assert "***" in failed.last_error
    later = at_time(services, services.clock() + timedelta(hours=2))
    assert sender.send_due(later).delivered == 1
    assert [a.state for a in alert_rows(services)] == ["delivered", "delivered"]
    assert len(slack.requests) == 2
    assert len(mailbox.messages) == 1
    seen = [
        log_text.getvalue(),
        *(r.content.decode() for r in slack.requests),
        *(m.as_string() for m in mailbox.messages),
        *(f"{a.text} {a.details} {a.last_error} {a.command}" for a in alert_rows(services)),
    ]
    for text in seen:
        for secret in ALERT_SECRETS:
            assert secret not in text


def test_a_channel_limited_to_other_datasets_hears_nothing_of_this_one(
    web: Flask, services: Services, cloud: CloudState, slack: Receiver, mailbox: Mailbox
) -> None:
    """The e-mail channel is limited to a dataset that is not this run's: only Slack is told."""
    other = DATASETS_TOML.replace(
        "[datasets.products]",
        "[datasets.prices]\nsitemap = 'prices'\nentity_key = ['sku']\n[datasets.products]",
        1,
    )
    services = use_datasets(services, ALERTS_TOML.replace('["products"]', '["prices"]') + other)
    notify(web, finished_job(cloud, product_records(40, garbage="beta.example")))
    settle(services)
    assert len(slack.requests) == 1
    assert mailbox.messages == []


def test_a_dead_delivery_and_a_stale_dataset_are_told_by_the_maintenance_pass(
    web: Flask,
    services: Services,
    cloud: CloudState,
    receiver: Receiver,
    slack: Receiver,
    mailbox: Mailbox,
) -> None:
    """A destination that answers 410 Gone leaves its delivery dead: the pass tells the channels
    once per interval while it lasts; a dataset with no accepted run for longer than its
    ``stale_after`` is told too, and recovers when a run is accepted."""
    stale = DATASETS_TOML.replace('policy = "reject"', 'policy = "reject"\nstale_after = "1h"')
    services = use_datasets(services, ALERTS_TOML + stale)
    receiver.status = 410
    job_id = finished_job(cloud, product_records(40))
    notify(web, job_id)
    settle(services)
    now = services.clock()
    assert watch.check(services)["alerts_written"] == 2
    sender.send_due(services)
    (dead,) = [r.body["text"] for r in slack.requests]
    assert "delivery(ies) of dataset products are dead" in dead
    assert "destination gone (HTTP 410): it is disabled" in dead
    assert "More: scrapesync status" in dead
    assert len(mailbox.messages) == 1
    assert watch.check(at_time(services, now + timedelta(minutes=30)))["alerts_written"] == 0

    late = at_time(services, now + timedelta(hours=3))
    assert watch.check(late)["alerts_written"] == 2  # stale: one message per channel
    sender.send_due(late)
    assert "dataset products is stale: no accepted run for 3h" in slack.requests[-1].body["text"]
    later = at_time(services, now + timedelta(hours=7))
    assert watch.check(later)["alerts_written"] == 2  # the dead delivery again, an interval on
    sender.send_due(later)
    assert "are dead" in slack.requests[-1].body["text"]
    assert len(slack.requests) == 3
    receiver.status = 204
    notify(web, finished_job(cloud, product_records(40, start=40)))
    settle(services)
    with services.uow.begin() as session:
        conditions = {c.reason: c.firing for c in session.execute(select(AlertCondition)).scalars()}
    assert conditions == {"delivery_dead": True, "stale": False}
    assert any("recovered from a stale spell" in r.body["text"] for r in slack.requests)


@pytest.mark.slow
def test_doctor_checks_that_each_channels_variables_are_set(
    tmp_path: Path,
    database_url: str,
    account: SimServer,  # noqa: F811 - the doctor tests' Cloud account fixture
    redis_conn: Redis,
) -> None:
    """A channel whose variable is missing fails the doctor, naming the variable, not a value."""
    with_alerts = ALERTS_TOML + GOOD_DATASETS
    done = doctor(tmp_path, database_url, account, with_alerts, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = checks(done)
    assert report[f"alert channel slack:{SLACK_ENV}"]["ok"] is False
    assert f"set {SLACK_ENV}" in report[f"alert channel slack:{SLACK_ENV}"]["hint"]
    assert report["alert channel email:ops@example.com"]["detail"].startswith(
        "SCRAPESYNC_SMTP_URL is not set"
    )
    fine = doctor(
        tmp_path,
        database_url,
        account,
        with_alerts,
        "--json",
        **{
            SLACK_ENV: "https://hooks.example/services/T0/B0/secret-token-123456",
            "SCRAPESYNC_SMTP_URL": "smtp://u:secret-pass@127.0.0.1:2525",
        },
    )
    assert fine.returncode == 0, fine.stdout
    assert "secret-token-123456" not in fine.stdout
    assert "secret-pass" not in fine.stdout


def test_a_task_cloud_will_not_let_us_read_is_told_with_the_answer(
    web: Flask, services: Services, cloud: CloudState, slack: Receiver, mailbox: Mailbox
) -> None:
    """Cloud answers 401 (the token was rotated): the quarantined task is told to every channel
    with Cloud's answer and what to do; nothing is told twice within the interval."""
    job_id = finished_job(cloud, product_records(40))
    cloud.api_token = "a-rotated-token"
    notify(web, job_id)
    settle(services)
    watch.check(services)
    watch.check(services)
    sender.send_due(services)
    (text,) = [r.body["text"] for r in slack.requests]
    assert f"job {job_id} quarantined" in text
    assert "401" in text
    assert "scrapesync sync JOB_ID --force" in text
    assert "More: scrapesync status" in text
    assert len(mailbox.messages) == 1


def test_sent_alerts_are_let_go_with_the_outbox_retention_and_unsent_ones_never(
    web: Flask, services: Services, cloud: CloudState, slack: Receiver
) -> None:
    """Alert messages sent more than the outbox retention ago are deleted by the maintenance
    pass; one still failing stays whatever its age."""
    slack.status = 503
    notify(web, finished_job(cloud, product_records(40, garbage="beta.example")))
    settle(services)
    later = at_time(services, services.clock() + timedelta(days=31))
    assert alert_sender_prune(later) == 1  # the e-mail, sent
    assert [(a.channel, a.state) for a in alert_rows(services)] == [
        (f"slack:{SLACK_ENV}", "failed")
    ]


def alert_sender_prune(services: Services) -> int:
    """One maintenance pass's alert retention step."""
    return maintenance.run_pass(services).counts["alerts_deleted"]


def test_a_webhook_channel_gets_a_signed_alert_a_standard_webhooks_receiver_verifies(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """The generic channel POSTs the alert in the delivery envelope, signed like deliveries,
    with the alert id as ``webhook-id``."""
    hook = Receiver(secret=SECRET)
    with hook.serve():
        channel = f'[[alerts]]\nkind = "webhook"\nurl = "{hook.url}"\nsecret_env = "OPS_HOOK"\n'
        services = use_datasets(services, channel + DATASETS_TOML)
        environment = {**services.settings.environment, "OPS_HOOK": SECRET}
        services = replace(services, settings=replace(services.settings, environment=environment))
        bootstrap.use(services)
        job_id = finished_job(cloud, product_records(40, garbage="beta.example"))
        notify(web, job_id)
        settle(services)
    (request,) = hook.requests
    assert request.signed
    assert request.event_type == "alert.firing"
    assert request.event_id.startswith("alt_")
    data = request.body["data"]
    assert (data["dataset"], data["reason"], data["status"]) == (
        "products",
        "run_rejected",
        "firing",
    )
    assert data["command"] == f"scrapesync check products-job-{job_id}"
    assert data["details"]["quarantined_partitions"] == ["beta.example"]


def test_a_spent_cloud_budget_is_told_to_every_channel_and_so_is_its_recovery(
    services: Services, slack: Receiver, mailbox: Mailbox
) -> None:
    """No call left in the window: an account-wide alert, which a channel limited to some
    datasets gets too; calls left again: "recovered"."""
    spent = MemoryApiBudget(limit=1, window=900.0)
    spent.acquire()
    watch.check(replace(services, budget=spent))
    sender.send_due(services)
    (text,) = [r.body["text"] for r in slack.requests]
    assert "the Cloud API budget is spent (0 of 200 calls left in this 15m window)" in text
    assert len(mailbox.messages) == 1
    assert mailbox.messages[0]["Subject"] == "[scrapesync] Cloud account: Cloud budget spent"
    watch.check(services)
    sender.send_due(services)
    assert "the Cloud API budget recovered" in slack.requests[-1].body["text"]
    assert len(mailbox.messages) == 2


def test_a_condition_back_soon_after_its_recovery_is_told_once_the_interval_is_over(
    services: Services,
) -> None:
    """Told at 0h, recovered at 1h, back at 2h: nothing more until 6h, then one message if it
    still holds; a flapping condition never sends more than one alarm per interval."""
    start = services.clock()
    notice = Notice("scrapesync: something is wrong. More: scrapesync status", "scrapesync status")

    def at(hours: float, step: Callable[..., int], **kw: Any) -> int:
        with services.uow.begin() as session:
            written = step(session, services.datasets, now=start + timedelta(hours=hours), **kw)
            session.commit()
        return written

    told = {"dataset": "products", "reason": AlertReason.STALE, "notice": notice}
    assert at(0, fire, **told) == 2
    assert at(1, recover, **told) == 2
    assert at(2, fire, **told) == 0
    assert at(5, catch_up) == 0
    assert at(6.5, catch_up) == 2
    assert at(7, catch_up) == 0
    statuses = [(a.status, a.reason) for a in alert_rows(services)]
    assert (
        statuses
        == [("firing", "stale")] * 2 + [("recovered", "stale")] * 2 + [("firing", "stale")] * 2
    )
