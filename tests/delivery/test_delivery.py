"""Outbox delivery: signed, repeat-safe, classified by failure, and never leaking its secret."""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from flask import Flask
from sqlalchemy import select, update

from config.settings import Settings
from simulator import CloudState
from sync import jobs, logs
from sync.bootstrap import Services
from sync.delivery import destinations, relay
from sync.models import Attempt, Delivery, OutboxEvent
from sync.queue import RQDispatcher
from tests.acceptance.flow import (
    DATASETS_TOML,
    HOOK_URL,
    SECRET,
    SECRET_ENV,
    Receiver,
    accept_quietly,
    finished_job,
    product_records,
    run_id_of,
    settle,
    use_datasets,
)
from tests.fakes import verify_signature
from tests.harness import at_time, notify

pytestmark = pytest.mark.redis


class Crash(BaseException):
    """The worker dies here (a BaseException, so no handler in the relay swallows it)."""


class CrashAt:
    """Kill points that 'kill' the process at one named place by raising Crash."""

    def __init__(self, name: str) -> None:
        self.name = name

    def reached(self, name: str) -> None:
        """Die if this is the place."""
        if name == self.name:
            raise Crash(name)


def deliveries(services: Services) -> list[SimpleNamespace]:
    """Every delivery row as plain values, oldest first."""
    with services.uow.begin() as session:
        rows = session.execute(select(Delivery.__table__).order_by(Delivery.id)).mappings().all()
        return [SimpleNamespace(**row) for row in rows]


def event_states(services: Services) -> dict[str, str]:
    """Every outbox event's summarised state, by type."""
    with services.uow.begin() as session:
        return {e.event_type: e.state for e in session.execute(select(OutboxEvent)).scalars().all()}


def later(services: Services, seconds: float) -> Services:
    """The services seen ``seconds`` from now."""
    return at_time(services, services.clock() + timedelta(seconds=seconds))


# --- signing ------------------------------------------------------------------------------------


def test_the_signature_reproduces_the_standard_webhooks_test_vector() -> None:
    """The published Standard Webhooks vector: a receiver's own library accepts what we send."""
    key = destinations.signing_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    signature = destinations.sign(
        key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
    )
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.mark.parametrize("secret", [SECRET, "a raw shared secret"], ids=["whsec", "raw"])
def test_signed_headers_verify_with_an_independent_implementation(secret: str) -> None:
    """Both secret spellings verify on the receiving side; a changed body or key does not."""
    body = b'{"id":"evt_1","type":"run.accepted"}'
    headers = httpx.Headers(destinations.signed_headers(secret, "evt_1", 1_800_000_000, body))
    assert headers["webhook-id"] == "evt_1"
    assert headers["webhook-timestamp"] == "1800000000"
    assert verify_signature(secret, headers, body)
    assert not verify_signature(secret, headers, body + b" ")
    assert not verify_signature("whsec_" + base64.b64encode(b"other").decode(), headers, body)


def test_a_malformed_whsec_secret_is_refused_without_showing_it() -> None:
    """A whsec_ secret that is not base64 is a configuration error that does not echo it."""
    with pytest.raises(destinations.DeliveryConfigError) as raised:
        destinations.signing_key("whsec_not*base64!")
    assert "not*base64" not in str(raised.value)


def test_settings_read_a_destinations_secret_from_the_environment() -> None:
    """The secret variable the datasets file names is read through Settings, never shown."""
    settings = Settings.from_env({SECRET_ENV: SECRET})
    assert settings.secret(SECRET_ENV) == SECRET
    assert settings.secret("UNSET_VARIABLE") is None
    assert SECRET not in repr(settings)


# --- delivery ---------------------------------------------------------------------------------


def test_an_accepted_run_is_delivered_once_with_its_event_id(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Each event reaches the receiver once, signed, under the id written with the change;
    body and type match the outbox row."""
    job_id = finished_job(cloud, product_records(40))
    notify(web, job_id)
    settle(services)
    with services.uow.begin() as session:
        written = {e.event_id: e.event_type for e in session.execute(select(OutboxEvent)).scalars()}
    assert receiver.events == written
    assert all(r.signed for r in receiver.requests)
    accepted = receiver.of_type("run.accepted")[0].body
    assert accepted["data"]["run_id"] == run_id_of(job_id)
    assert accepted["id"] in written
    assert [(d.state, d.attempts, d.last_status) for d in deliveries(services)] == [
        ("delivered", 1, 204),
        ("delivered", 1, 204),
        ("delivered", 1, 204),
    ]
    assert set(event_states(services).values()) == {"delivered"}


def test_a_destination_that_times_out_after_receiving_gets_the_same_event_again(
    services: Services, cloud: CloudState, loopback: Receiver
) -> None:
    """The receiver got the request but answered too late: the send is uncertain, so it is
    repeated with the same event id and a fresh signature; the receiver dedups on the id."""
    services = use_datasets(services, DATASETS_TOML.replace(HOOK_URL, loopback.url))
    _run_id, events = accept_quietly(services, cloud)
    loopback.stall = {1}
    real = httpx.HTTPTransport()
    first = relay.relay(services, event_id=events[0], transport=real, timeout=0.3)
    assert (first.claimed, first.retrying) == (1, 1)
    (row, *_others) = deliveries(services)
    assert row.state == "failed"
    assert "ReadTimeout (uncertain)" in row.last_error
    again = relay.relay(later(services, 3600), event_id=events[0], transport=real, timeout=5)
    assert again.delivered == 1
    assert [r.event_id for r in loopback.requests] == [events[0], events[0]]
    assert all(r.signed for r in loopback.requests)
    assert deliveries(services)[0].state == "delivered"


@pytest.mark.parametrize(
    "outage",
    [
        [httpx.ConnectError("connection refused"), 503, 502],
        [httpx.ReadTimeout("timed out"), 500, 408],
    ],
    ids=["refused-then-5xx", "timeout-then-5xx-and-408"],
)
def test_a_destination_down_for_a_while_gets_the_event_later(
    services: Services, cloud: CloudState, receiver: Receiver, outage: list[object]
) -> None:
    """Connection errors, timeouts, 5xx and 408 back off and retry; nothing is sent before the
    retry is due; the event arrives once the destination is back."""
    _run_id, events = accept_quietly(services, cloud)
    receiver.plan = list(outage)  # type: ignore[arg-type]
    clock = services
    for attempt in range(1, 4):
        report = relay.relay(clock, event_id=events[0])
        assert (report.claimed, report.retrying) == (1, 1), attempt
        row = deliveries(services)[0]
        assert (row.state, row.attempts) == ("failed", attempt)
        assert row.next_attempt_at > clock.clock()
        assert relay.relay(clock, event_id=events[0]).claimed == 0  # not due yet
        clock = at_time(services, row.next_attempt_at + timedelta(seconds=1))
    assert relay.relay(clock, event_id=events[0]).delivered == 1
    assert deliveries(services)[0].state == "delivered"
    assert {r.event_id for r in receiver.requests} == {events[0]}
    assert len(receiver.requests) == 4


def test_a_429_waits_exactly_as_long_as_retry_after_says(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """A rate-limited delivery is retried when Retry-After says, even sooner than its own
    backoff would have waited, and not before."""
    _run_id, events = accept_quietly(services, cloud)
    receiver.plan = [lambda: httpx.Response(429, headers={"Retry-After": "2"})]
    now = services.clock()
    relay.relay(replace(services, clock=lambda: now, random=lambda: 0.99), event_id=events[0])
    row = deliveries(services)[0]
    assert (row.state, row.last_status) == ("failed", 429)
    assert destinations.backoff(1, 0.99) > 2
    assert row.next_attempt_at == now + timedelta(seconds=2)


def test_a_destination_answering_400_is_failed_for_good_and_visible(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """A 4xx refusal is terminal: dead with its status, shown on the event, never retried."""
    _run_id, events = accept_quietly(services, cloud)
    receiver.plan = [400]
    report = relay.relay(services, event_id=events[0])
    assert (report.claimed, report.dead) == (1, 1)
    for hours in (1, 24, 24 * 30):
        # only the other events: the publication and its change feed
        assert relay.relay(later(services, hours * 3600)).claimed <= 2
    assert len(receiver.of_type("run.accepted")) == 1
    row = deliveries(services)[0]
    assert (row.state, row.attempts, row.last_status) == ("dead", 1, 400)
    assert "refused by the destination, not retried" in row.last_error
    assert event_states(services)["run.accepted"] == "dead"
    with services.uow.begin() as session:
        assert relay.due_deliveries(session, now=services.clock() + timedelta(days=90)) == 0


def test_a_delivery_that_keeps_failing_ends_dead_after_its_retry_window(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Server errors are retried for the destination's retry window (3 days by default), the
    last attempt at the mark exactly; then the delivery is dead, keeping its last answer."""
    _run_id, events = accept_quietly(services, cloud)
    receiver.status = 503
    start = services.clock()
    clock = at_time(services, start)
    for _ in range(500):
        relay.relay(clock, event_id=events[0])
        row = deliveries(services)[0]
        if row.state == "dead":
            break
        clock = at_time(services, row.next_attempt_at)
    assert row.state == "dead"
    assert row.last_attempt_at - start == timedelta(days=3)
    assert row.last_status == 503
    assert f"gave up after {row.attempts} attempts" in row.last_error
    assert "HTTP 503: no thanks" in row.last_error
    assert 72 <= row.attempts <= 160  # 15 s doubling, then every 30 to 60 min


def test_a_delivery_lost_between_sending_and_marking_is_sent_again_with_the_same_id(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """The worker dies after the POST and before recording it: the 'sending' lease expires and
    recovery sends the same event id again; the receiver counts one event."""
    _run_id, events = accept_quietly(services, cloud)
    dying = replace(services, killpoints=CrashAt("after-delivery-send"))  # type: ignore[arg-type]
    with pytest.raises(Crash):
        relay.relay(dying, event_id=events[0])
    row = deliveries(services)[0]
    assert (row.state, row.attempts) == ("sending", 1)
    assert relay.relay(services, event_id=events[0]).claimed == 0  # lease still live
    recovered = relay.relay(later(services, 600), event_id=events[0])
    assert recovered.delivered == 1
    assert [r.event_id for r in receiver.requests] == [events[0], events[0]]
    assert receiver.events == {events[0]: "run.accepted"}
    assert (deliveries(services)[0].state, deliveries(services)[0].attempts) == ("delivered", 2)


def test_redelivery_never_recollects_or_reimports(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Retries talk to the destination only: no Cloud call, no sync attempt, no new event."""
    _run_id, events = accept_quietly(services, cloud)
    receiver.plan = [503, 503]
    calls = len(cloud.requests)
    with services.uow.begin() as session:
        attempts = len(session.execute(select(Attempt)).all())
    clock = services
    for _ in range(3):
        relay.relay(clock)
        clock = later(clock, 7200)
    assert set(event_states(services).values()) == {"delivered"}
    assert len(cloud.requests) == calls
    with services.uow.begin() as session:
        assert len(session.execute(select(Attempt)).all()) == attempts
        assert len(session.execute(select(OutboxEvent)).all()) == len(events)


def test_the_maintenance_sweep_redrives_deliveries_whose_job_was_lost(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Events accepted but never queued for delivery are found in SQL and delivered."""
    _run_id, events = accept_quietly(services, cloud)
    assert receiver.requests == []
    assert jobs.maintain()["deliveries_due"] == len(events) == 3
    settle(services)
    assert sorted(receiver.events) == sorted(events)
    assert jobs.maintain()["deliveries_due"] == 0


def test_a_missing_secret_is_a_visible_retryable_failure_naming_the_variable(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """No secret in the environment: nothing is sent unsigned; the error names the variable."""
    _run_id, events = accept_quietly(services, cloud)
    services = replace(services, settings=replace(services.settings, environment={}))
    relay.relay(services, event_id=events[0])
    row = deliveries(services)[0]
    assert row.state == "failed"
    assert SECRET_ENV in row.last_error
    assert receiver.requests == []


def test_secrets_never_reach_logs_errors_or_rows(
    services: Services,
    cloud: CloudState,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Even a receiver that echoes the secret back in its error page leaves no trace of it in
    the JSON log lines (extra fields included), the delivery rows or the events."""
    caplog.set_level(logging.DEBUG)
    scrapesync = logging.getLogger("scrapesync")
    scrapesync.addHandler(caplog.handler)  # it may not propagate once logs.configure() ran
    accept_quietly(services, cloud)
    key_part = SECRET.removeprefix("whsec_")
    receiver.plan = [lambda: httpx.Response(500, text=f"bad signature for {SECRET} {key_part}")]
    try:
        relay.relay(services)
    finally:
        scrapesync.removeHandler(caplog.handler)
    lines = "\n".join(logs.JsonFormatter().format(r) for r in caplog.records)
    assert '"event": "delivery.failed"' in lines
    assert "bad signature for ***" in lines
    row = deliveries(services)[0]
    assert row.state == "failed"
    assert "***" in row.last_error
    with services.uow.begin() as session:
        stored = json.dumps(
            [
                [str(v) for v in r]
                for model in (Delivery, OutboxEvent)
                for r in session.execute(select(model.__table__)).all()
            ]
        )
    for leak in (SECRET, key_part):
        assert leak not in stored
        assert leak not in lines


def test_a_file_destination_gets_the_export_its_manifest_and_the_events(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """A folder destination receives the published run's versioned export with its manifest,
    and each event as a file; a re-delivery rewrites the same bytes."""
    folder = tmp_path / "drop"
    services = use_datasets(
        services,
        DATASETS_TOML.replace(
            f'url = "{HOOK_URL}"\nsecret_env = "{SECRET_ENV}"', f'path = "{folder}"'
        ),
    )
    job_id = finished_job(cloud, product_records(40))
    notify(web, job_id)
    settle(services)
    run_id = run_id_of(job_id)
    data = folder / f"products.{run_id}.r1.jsonl"
    manifest = json.loads((folder / f"products.{run_id}.r1.manifest.json").read_text())
    assert len(data.read_text().splitlines()) == manifest["records"] == 40
    assert manifest["run_id"] == run_id
    events = sorted(p.name for p in (folder / "events").iterdir())
    assert len(events) == 3  # accepted, published, changed
    before = data.read_bytes()
    with services.uow.begin() as session:
        session.execute(update(Delivery).values(state="unsent"))
        session.commit()
    assert relay.relay(services).delivered == 3
    assert data.read_bytes() == before
    assert sorted(p.name for p in (folder / "events").iterdir()) == events


def test_delivery_jobs_go_through_the_queue_with_safe_ids(
    services: Services, cloud: CloudState
) -> None:
    """A retry schedules a deliver job for later under an id RQ accepts."""
    dispatcher = services.dispatcher
    assert isinstance(dispatcher, RQDispatcher)
    _run_id, events = accept_quietly(services, cloud)
    assert dispatcher.delivery(events[0])
    assert not dispatcher.delivery(events[0])  # already waiting
    (job_id,) = dispatcher.queue.job_ids
    assert job_id == f"deliver-{events[0]}-now"
    assert all(c.isalnum() or c in "_-" for c in job_id)


def test_a_relay_that_lost_its_claim_writes_nothing(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """A slow relay whose lease expired and was taken over cannot overwrite the newer outcome."""
    _run_id, events = accept_quietly(services, cloud)
    with services.uow.begin() as session:
        (first_id,) = session.execute(
            select(Delivery.id).where(Delivery.event_id == events[0])
        ).scalars()
    slow = relay._claim(services, first_id, lease_seconds=5)
    assert slow is not None
    fast = relay._claim(later(services, 10), first_id, lease_seconds=5)
    assert fast is not None
    assert fast.attempts == slow.attempts + 1
    assert relay._settle(services, fast, destinations.Outcome("delivered", status=204))
    assert not relay._settle(services, slow, destinations.Outcome("dead", status=400, error="late"))
    row = deliveries(services)[0]
    assert (row.state, row.attempts, row.last_status) == ("delivered", 2, 204)
