"""Deliveries that wait out long outages: a destination down for days gets every event in order
once it is back, while only its oldest delivery spends attempts; a 410 disables it."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from config.datasets import DatasetsFileError
from scrapesync.cli import main
from simulator import CloudState, serve
from sync import bootstrap
from sync.bootstrap import Services
from sync.delivery import destinations, relay
from sync.models import OutboxEvent
from tests.acceptance.flow import (
    DATASETS_TOML,
    HOOK_URL,
    SECRET,
    accept_quietly,
    use_datasets,
)
from tests.delivery.test_delivery import deliveries
from tests.fakes import Receiver, verify_signature
from tests.harness import API_TOKEN, at_time, datasets_from
from tests.operations.test_doctor import GOOD_DATASETS, checks, doctor
from webhooks import create_app

SIM_TOKEN = {"WEBSCRAPER_API_TOKEN": API_TOKEN}

pytestmark = pytest.mark.redis


class Deduplicating:
    """A receiver that is down (503) until ``back_at`` on the test's clock, verifies each
    signature, and processes each ``webhook-id`` once however often it comes; the request that
    brings its ``late``-th event is processed but answered too late (the sender cannot know)."""

    def __init__(self, back_at: datetime, *, late: int = 4) -> None:
        self.back_at = back_at
        self.now = back_at
        self.late = late
        self.processed: list[str] = []
        self.received: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        """Answer as the receiver would at the test's moment."""
        body = request.read()
        event_id = request.headers["webhook-id"]
        self.received.append(event_id)
        assert verify_signature(SECRET, request.headers, body)
        if self.now < self.back_at:
            return httpx.Response(503, text="down for maintenance")
        if event_id in self.processed:
            return httpx.Response(200, text="already processed")
        self.processed.append(event_id)
        if len(self.processed) == self.late:
            raise httpx.ReadTimeout("answered too late", request=request)
        return httpx.Response(204)


def outbox_order(services: Services) -> list[str]:
    """Every event id in the order the outbox wrote them."""
    with services.uow.begin() as session:
        return list(
            session.execute(select(OutboxEvent.event_id).order_by(OutboxEvent.id)).scalars()
        )


def run_relay_until_quiet(
    services: Services,
    receiver: Deduplicating,
    start: datetime,
    *,
    extra_at: datetime,
    cloud: CloudState,
) -> datetime:
    """The maintenance sweep's relay, moment after moment on the test's clock, jumping to each
    next due attempt; one more run is accepted at ``extra_at``. Returns when all was delivered."""
    moment, added = start, False
    for _ in range(2000):
        if not added and moment >= extra_at:
            accept_quietly(at_time(services, moment), cloud)
            added = True
        receiver.now = moment
        relay.relay(at_time(services, moment))
        waiting = [r for r in deliveries(services) if r.state != "delivered"]
        if added and not waiting:
            return moment
        due = [r.next_attempt_at for r in waiting if r.state == "failed"]
        following = min(due) if due else moment + timedelta(minutes=1)
        if not added:
            following = min(following, extra_at)
        moment = max(following, moment)
    raise AssertionError("the relay never caught up")


def test_a_destination_down_for_three_days_gets_every_event_in_order_once_back(
    services: Services, cloud: CloudState
) -> None:
    """Down 3 days from the first attempt, with a run accepted meanwhile: once back, the
    receiver processes every event once, in the order written; a duplicate send after a lost
    answer is recognised by its webhook-id; only the oldest delivery spent attempts."""
    start = services.clock()
    down = Deduplicating(back_at=start + timedelta(days=3))
    services = replace(services, delivery_transport=httpx.MockTransport(down))
    bootstrap.use(services)
    accept_quietly(services, cloud)
    accept_quietly(services, cloud)
    done = run_relay_until_quiet(
        services, down, start, extra_at=start + timedelta(days=1, hours=12), cloud=cloud
    )
    written = outbox_order(services)
    assert len(written) == 9
    assert down.processed == written
    assert len(down.received) > len(set(down.received))  # the lost answer was sent again
    rows = deliveries(services)
    assert {r.state for r in rows} == {"delivered"}
    head, *rest = rows
    assert head.attempts > 70  # it alone kept trying for three days
    assert sorted(r.attempts for r in rest) == [1] * (len(rest) - 1) + [2]  # the late answer
    assert head.delivered_at - down.back_at <= timedelta(hours=1)
    assert done - down.back_at <= timedelta(hours=1)


def test_a_410_disables_the_destination_and_holds_its_other_deliveries(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """410 Gone: that delivery is dead with its answer, the destination disabled, and nothing
    more is sent to it, however late; `status` shows it; enabling sends what waited, in order."""
    _run_id, events = accept_quietly(services, cloud)
    receiver.plan = [410]
    report = relay.relay(services)
    assert (report.claimed, report.dead) == (1, 1)
    for days in (1, 10):
        assert relay.relay(at_time(services, services.clock() + timedelta(days=days))).claimed == 0
    assert len(receiver.requests) == 1
    head, *rest = deliveries(services)
    assert (head.state, head.last_status) == ("dead", 410)
    assert "disabled until enabled again" in head.last_error
    assert [r.state for r in rest] == ["unsent", "unsent"]
    metrics = guarded_page(services, "/metrics")
    assert "scrapesync_destinations_disabled 1.0" in metrics
    assert f"{HOOK_URL}: DISABLED since" in guarded_page(services, "/status")
    assert "scrapesync_destinations_failing 0.0" in metrics
    status = CliRunner().invoke(main, ["status"])
    assert status.exit_code == 0, status.output
    assert f"destination {HOOK_URL}: DISABLED since" in status.output
    held = CliRunner().invoke(main, ["deliveries", "list", "--state", "pending"])
    assert held.output.count("held while the destination is disabled") == 2
    listed = CliRunner().invoke(main, ["deliveries", "list", "--state", "dead"])
    assert "DISABLED" in listed.output
    assert events[0] in listed.output
    enabled = CliRunner().invoke(main, ["deliveries", "enable", HOOK_URL])
    assert enabled.exit_code == 0, enabled.output
    assert "2 deliveries waiting" in enabled.output
    again = CliRunner().invoke(main, ["deliveries", "enable", HOOK_URL, "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == {"destination": HOOK_URL, "enabled": True, "waiting": 2}
    assert relay.relay(services).delivered == 2
    assert [r.event_id for r in receiver.requests[1:]] == events[1:]


def guarded_page(services: Services, path: str) -> str:
    """A read-only page as the read token sees it (Prometheus, a dashboard)."""
    settings = replace(services.settings, read_token="a-read-token")
    client = create_app(replace(services, settings=settings)).test_client()
    answer = client.get(path, headers={"Authorization": "Bearer a-read-token"})
    assert answer.status_code == 200
    return answer.get_data(as_text=True)


def test_a_destination_sets_its_own_retry_window_and_longest_wait(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """``retry_days = 0.5`` and ``max_wait_minutes = 5``: attempts at most 5 minutes apart,
    dead at 12 hours exactly."""
    text = DATASETS_TOML.replace(
        'secret_env = "PRODUCTS_HOOK_SECRET"',
        'secret_env = "PRODUCTS_HOOK_SECRET"\nname = "crm"\nretry_days = 0.5\nmax_wait_minutes = 5',
    )
    services = replace(services, datasets=datasets_from(text))
    _run_id, events = accept_quietly(services, cloud)
    receiver.status = 500
    start = services.clock()
    moment, gaps = start, []
    for _ in range(1000):
        relay.relay(at_time(services, moment), event_id=events[0])
        row = deliveries(services)[0]
        if row.state == "dead":
            break
        gaps.append((row.next_attempt_at - moment).total_seconds())
        moment = row.next_attempt_at
    assert row.last_attempt_at - start == timedelta(hours=12)
    assert max(gaps) <= 300
    assert gaps[:3] == sorted(gaps[:3])  # 15 s, 30 s, 60 s nominal, jittered within the half


def test_the_retry_schedule_doubles_from_15_seconds_with_equal_jitter() -> None:
    """The documented schedule: each wait lies in the upper half of min(cap, 15 s * 2**(n-1))."""
    for n, nominal in [(1, 15), (2, 30), (3, 60), (8, 1920), (9, 3600), (40, 3600)]:
        assert destinations.backoff(n, 0.0) == nominal / 2
        assert destinations.backoff(n, 0.999) == pytest.approx(nominal * 0.9995)


@pytest.mark.parametrize(
    "extra",
    ["retry_days = 0", "retry_days = -1", 'retry_days = "3d"', "max_wait_minutes = 0", 'name = ""'],
)
def test_a_bad_retry_setting_is_refused_naming_the_key(extra: str) -> None:
    """A retry setting that is no positive number is a datasets file error naming it."""
    text = DATASETS_TOML.replace(
        'secret_env = "PRODUCTS_HOOK_SECRET"', f'secret_env = "PRODUCTS_HOOK_SECRET"\n{extra}'
    )
    with pytest.raises(DatasetsFileError, match=extra.split(" ")[0]):
        datasets_from(text)


@pytest.mark.slow
def test_doctor_says_a_destination_is_disabled(
    tmp_path: Path, database_url: str, services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """After a 410, `scrapesync doctor` fails that destination, saying what to do."""
    url = "https://receiver.example/hooks"  # the destination of the doctor's datasets file
    services = use_datasets(services, DATASETS_TOML.replace(HOOK_URL, url))
    accept_quietly(services, cloud)
    receiver.plan = [410]
    relay.relay(services)
    try:
        with serve(cloud) as sim:
            done = doctor(tmp_path, database_url, sim, GOOD_DATASETS, "--json", **SIM_TOKEN)
    finally:  # the doctor's own tests read this database without emptying it first
        assert CliRunner().invoke(main, ["deliveries", "enable", url]).exit_code == 0
    check = checks(done)[f"destination {url}"]
    assert not check["ok"]
    assert "disabled since" in check["detail"]
    assert "HTTP 410" in check["detail"]
    assert f"scrapesync deliveries enable {url}" in check["hint"]
    assert done.returncode == 1
