"""``scrapesync deliveries``: list what is undelivered, replay events under their own ids (a
receiver using the official standardwebhooks library accepts them), and ping a destination."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from click.testing import CliRunner
from standardwebhooks import Webhook

from scrapesync.cli import main
from scrapesync.deliveries import parse_time
from simulator import CloudState
from sync.bootstrap import Services
from sync.delivery import relay
from tests.acceptance.flow import (
    DATASETS_TOML,
    SECRET,
    SECRET_ENV,
    accept_quietly,
    settle,
    use_datasets,
)
from tests.delivery.test_delivery import deliveries
from tests.fakes import Receiver

pytestmark = pytest.mark.redis

NAMED = DATASETS_TOML.replace(
    f'secret_env = "{SECRET_ENV}"', f'secret_env = "{SECRET_ENV}"\nname = "crm"'
)


class Verifying:
    """A receiver that checks each request with the official standardwebhooks library (its
    signature and its timestamp) and keeps what it accepted; it answers ``answer``."""

    def __init__(self, answer: httpx.Response | None = None) -> None:
        self.webhook = Webhook(SECRET)
        self.accepted: list[tuple[str, dict[str, object]]] = []
        self.answer = answer

    def __call__(self, request: httpx.Request) -> httpx.Response:
        """Verify, keep, answer."""
        payload = self.webhook.verify(request.read(), dict(request.headers))
        self.accepted.append((request.headers["webhook-id"], payload))
        return self.answer or httpx.Response(204)


def cli(*args: str) -> tuple[int, str]:
    """Run ``scrapesync ARGS`` in this process; its exit code and output."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def verifying(services: Services) -> tuple[Services, Verifying]:
    """The services with a standardwebhooks-verifying receiver named ``crm``."""
    from dataclasses import replace

    from sync import bootstrap

    found = Verifying()
    wired = replace(use_datasets(services, NAMED), delivery_transport=httpx.MockTransport(found))
    bootstrap.use(wired)
    return wired, found


def test_replay_since_resends_exactly_the_later_events_and_they_verify(
    verifying: tuple[Services, Verifying], cloud: CloudState
) -> None:
    """Two runs delivered; ``replay --since`` a moment between them re-sends the second run's
    events, under their own ids, to that destination; standardwebhooks accepts each."""
    services, receiver = verifying
    _first_run, first = accept_quietly(services, cloud)
    settle_all(services)
    between = datetime.now(UTC)
    _second_run, second = accept_quietly(services, cloud)
    settle_all(services)
    assert [event_id for event_id, _ in receiver.accepted] == first + second
    receiver.accepted.clear()
    code, output = cli(
        "deliveries", "replay", "--since", between.isoformat(), "--destination", "crm"
    )
    assert code == 0, output
    assert "re-queued 3 deliveries of 3 events to crm" in output
    settle(services)
    assert [event_id for event_id, _ in receiver.accepted] == second
    assert [payload["id"] for _, payload in receiver.accepted] == second
    assert {d.state for d in deliveries(services)} == {"delivered"}


def settle_all(services: Services) -> None:
    """Deliver everything due now."""
    relay.relay(services)


def test_replay_by_event_id_sends_a_dead_delivery_again_with_its_id(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """A delivery refused for good is listed with its last answer; replaying its event sends
    it again under the same webhook-id; a wrong id is one error line naming it."""
    _run_id, events = accept_quietly(services, cloud)
    receiver.plan = [422]
    relay.relay(services)
    code, output = cli("deliveries", "list", "--state", "dead")
    assert code == 0, output
    assert events[0] in output
    assert "HTTP 422: no thanks: refused by the destination, not retried" in output
    code, output = cli("deliveries", "list", "--state", "dead", "--json")
    (row,) = json.loads(output)["deliveries"]
    assert (row["event_id"], row["state"], row["last_status"]) == (events[0], "dead", 422)
    code, output = cli("deliveries", "replay", events[0], "--json")
    assert code == 0, output
    assert json.loads(output) == {"deliveries": 1, "events": [events[0]], "disabled": []}
    settle(services)
    assert [r.event_id for r in receiver.requests] == [*events, events[0]]
    assert deliveries(services)[0].state == "delivered"
    assert deliveries(services)[0].attempts == 2
    code, output = cli("deliveries", "replay", "evt_nope")
    assert code == 1
    assert "evt_nope" in output


def test_deliveries_list_filters_by_state_and_destination(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Pending deliveries are listed by default; a failed one shows when it is tried next;
    an unknown destination is an error listing the known ones."""
    _run_id, events = accept_quietly(services, cloud)
    code, output = cli("deliveries", "list", "--state", "pending", "--json")
    assert [d["event_id"] for d in json.loads(output)["deliveries"]] == events
    receiver.plan = [503]
    relay.relay(services)
    code, output = cli("deliveries", "list", "--state", "failed")
    assert "next attempt" in output
    assert "HTTP 503" in output
    code, output = cli("deliveries", "list", "--json")
    waiting = {d["event_id"]: d["waits_behind"] for d in json.loads(output)["deliveries"]}
    assert waiting == {events[0]: None, events[1]: events[0], events[2]: events[0]}
    code, output = cli("deliveries", "list", "--state", "pending")
    assert f"waits behind {events[0]}" in output
    code, output = cli("deliveries", "list", "--destination", "nowhere")
    assert code == 1
    assert "https://receiver.test/hooks/scrapesync" in output


def test_deliveries_test_prints_the_receivers_answer(
    verifying: tuple[Services, Verifying],
) -> None:
    """One signed ping, verified by standardwebhooks, and the receiver's answer printed; a
    refusal exits non-zero."""
    _services, receiver = verifying
    receiver.answer = httpx.Response(200, text="pong from the crm")
    code, output = cli("deliveries", "test", "crm")
    assert code == 0, output
    assert "HTTP 200" in output
    assert output.count("pong from the crm") == 1
    ((event_id, payload),) = receiver.accepted
    assert payload["type"] == "ping"
    assert event_id in output
    receiver.answer = httpx.Response(401, text="bad signature")
    code, output = cli("deliveries", "test", "crm")
    assert code == 1
    assert "crm: HTTP 401\nbad signature" in output
    assert SECRET not in output
    code, output = cli("deliveries", "test", "crm", "--json")
    assert code == 1
    shown = json.loads(output)
    assert (shown["destination"], shown["status"], shown["answer"]) == ("crm", 401, "bad signature")


def test_a_since_time_is_iso_or_an_age() -> None:
    """``--since`` takes an ISO 8601 time (UTC unless it says) or an age like 6h."""
    now = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    assert parse_time("6h", now=now) == now - timedelta(hours=6)
    assert parse_time("2d", now=now) == now - timedelta(days=2)
    assert parse_time("2026-12-05T10:00:00", now=now) == datetime(2026, 12, 5, 10, tzinfo=UTC)
    assert parse_time("2026-12-05T10:00:00+01:00", now=now) == datetime(2026, 12, 5, 9, tzinfo=UTC)


def test_replay_since_to_one_destination_leaves_the_other_alone(
    services: Services, cloud: CloudState
) -> None:
    """Two destinations of the dataset: a replay to ``crm`` re-sends to crm only."""
    from dataclasses import replace

    from sync import bootstrap

    crm, archive = Verifying(), Verifying()
    text = NAMED + (
        "\n[[datasets.products.destinations]]\n"
        'url = "https://archive.test/hooks"\n'
        f'secret_env = "{SECRET_ENV}"\n'
        'name = "archive"\n'
    )
    routed = httpx.MockTransport(
        lambda request: (archive if request.url.host == "archive.test" else crm)(request)
    )
    services = replace(use_datasets(services, text), delivery_transport=routed)
    bootstrap.use(services)
    _run_id, events = accept_quietly(services, cloud)
    relay.relay(services)
    assert len(crm.accepted) == len(archive.accepted) == 3
    code, output = cli("deliveries", "replay", "--since", "1h", "--destination", "crm")
    assert code == 0, output
    settle(services)
    assert [event_id for event_id, _ in crm.accepted] == events + events
    assert [event_id for event_id, _ in archive.accepted] == events
