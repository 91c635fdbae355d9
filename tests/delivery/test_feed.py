"""The pull feed ``GET /api/events`` and the two tokens: a consumer that pulls from the start
gets what was pushed, byte for byte, verifies it with the official standardwebhooks library,
and needs the read (or status) token."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from simulator import CloudState
from sync import bootstrap
from sync.bootstrap import Services
from sync.delivery import relay
from tests.acceptance.flow import (
    DATASETS_TOML,
    SECRET,
    SECRET_ENV,
    accept_quietly,
    use_datasets,
)
from tests.fakes import Receiver
from webhooks import create_app

pytestmark = pytest.mark.redis

READ_TOKEN = "read-token-0a1b2c3d4e"
STATUS_TOKEN = "status-token-9z8y7x6w"
OTHER_SECRET = "whsec_" + base64.b64encode(b"the archive's own signing key....").decode()
TWO_DESTINATIONS = (
    DATASETS_TOML
    + """
[[datasets.products.destinations]]
url = "https://archive.test/hooks"
secret_env = "ARCHIVE_SECRET"
name = "archive"
"""
)


def guarded(services: Services, **tokens: str | None) -> FlaskClient:
    """A web app of these services with these tokens configured."""
    settings = dataclasses.replace(services.settings, **tokens)  # type: ignore[arg-type]
    app: Flask = create_app(dataclasses.replace(services, settings=settings))
    app.testing = True
    return app.test_client()


def pull_everything(client: FlaskClient, *, limit: int, **query: str) -> list[dict[str, Any]]:
    """Every event of the feed, page after page from the start, as a consumer pulls them."""
    pulled: list[dict[str, Any]] = []
    after = ""
    for _ in range(100):
        answer = client.get(
            "/api/events",
            query_string={"after": after, "limit": limit, **query},
            headers={"Authorization": f"Bearer {READ_TOKEN}"},
        )
        assert answer.status_code == 200, answer.get_json()
        page = answer.get_json()
        pulled += page["events"]
        if not page["more"]:
            return pulled
        after = page["next"]
    raise AssertionError("the feed never ended")


def test_a_consumer_pulling_from_the_start_gets_what_was_pushed_and_verifies_it(
    services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Two runs' events pushed and pulled two by two: same ids, order, bodies and payloads;
    standardwebhooks accepts every pulled event with the destination's secret, and rejects a
    tampered one."""
    accept_quietly(services, cloud)
    accept_quietly(services, cloud)
    relay.relay(services)
    pushed = [(r.event_id, r.content) for r in receiver.requests]
    assert len(pushed) == 6
    client = guarded(services, read_token=READ_TOKEN)
    pulled = pull_everything(client, limit=2)
    assert [(e["id"], e["body"].encode()) for e in pulled] == pushed
    webhook = Webhook(SECRET)
    for event in pulled:
        payload = webhook.verify(event["body"], event["headers"])
        assert payload == json.loads(event["body"])
        assert payload["data"] == event["data"]
        assert event["headers"]["webhook-id"] == event["id"]
    tampered = pulled[0]["body"].replace('"type":"', '"type":"x')
    with pytest.raises(WebhookVerificationError):
        webhook.verify(tampered, pulled[0]["headers"])
    page = client.get("/api/events", query_string={"token": READ_TOKEN}).get_json()
    assert page["history"]["first_event_id"] == pushed[0][0]
    assert page["history"]["events_kept"] == 6
    assert page["history"]["retention_days"] == 30


def test_a_pulled_event_carries_each_destinations_signature(
    services: Services, cloud: CloudState
) -> None:
    """With two destinations, a pulled event verifies under either one's secret; asked for
    one destination, only under its own."""
    services = use_datasets(services, TWO_DESTINATIONS)
    environment = {SECRET_ENV: SECRET, "ARCHIVE_SECRET": OTHER_SECRET}
    services = dataclasses.replace(
        services, settings=dataclasses.replace(services.settings, environment=environment)
    )
    bootstrap.use(services)
    accept_quietly(services, cloud)
    client = guarded(services, read_token=READ_TOKEN)
    (first, *_rest) = pull_everything(client, limit=10)
    Webhook(SECRET).verify(first["body"], first["headers"])
    Webhook(OTHER_SECRET).verify(first["body"], first["headers"])
    (only, *_rest) = pull_everything(client, limit=10, destination="archive")
    Webhook(OTHER_SECRET).verify(only["body"], only["headers"])
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(only["body"], only["headers"])
    unknown = client.get(
        "/api/events", query_string={"destination": "nowhere", "token": READ_TOKEN}
    )
    assert unknown.status_code == 404


def test_the_feed_says_where_history_starts_when_after_is_not_kept(
    services: Services, cloud: CloudState
) -> None:
    """An ``after`` the outbox no longer keeps is a 404 that names where kept history starts;
    a bad limit is a 400; after the last event the page is empty and ``next`` stays put."""
    _run_id, events = accept_quietly(services, cloud)
    client = guarded(services, read_token=READ_TOKEN)
    gone = client.get("/api/events", query_string={"after": "evt_pruned", "token": READ_TOKEN})
    assert gone.status_code == 404
    assert gone.get_json()["history"]["first_event_id"] == events[0]
    assert "evt_pruned" in gone.get_json()["detail"]
    bad = client.get("/api/events", query_string={"limit": "0", "token": READ_TOKEN})
    assert bad.status_code == 400
    end = client.get("/api/events", query_string={"after": events[-1], "token": READ_TOKEN})
    assert end.get_json()["events"] == []
    assert end.get_json()["next"] == events[-1]


READ_ONLY_PATHS = (
    "/api/events",
    "/api/runs",
    "/metrics",
    "/status",
    "/api/changes?dataset=products",
)


@pytest.mark.parametrize("path", READ_ONLY_PATHS)
def test_the_read_token_and_the_status_token_open_the_read_only_pages(
    services: Services, path: str
) -> None:
    """Each read-only page opens with either token, carried as bearer, basic or ?token=; a
    wrong or missing token gets 401 and never sees the page."""
    client = guarded(services, read_token=READ_TOKEN, status_token=STATUS_TOKEN)
    basic = base64.b64encode(f"ops:{READ_TOKEN}".encode()).decode()
    joiner = "&" if "?" in path else "?"
    for headers, suffix in [
        ({"Authorization": f"Bearer {READ_TOKEN}"}, ""),
        ({"Authorization": f"Basic {basic}"}, ""),
        ({}, f"{joiner}token={READ_TOKEN}"),
        ({"Authorization": f"Bearer {STATUS_TOKEN}"}, ""),
    ]:
        answer = client.get(path + suffix, headers=headers)
        assert answer.status_code in (200, 404), (path, headers, answer.get_json())
    for headers in ({"Authorization": "Bearer wrong-token"}, {}):
        refused = client.get(path, headers=headers)
        assert refused.status_code == 401
        assert READ_TOKEN not in refused.get_data(as_text=True)


def test_without_either_token_the_pages_are_off_and_the_read_token_alone_opens_them(
    services: Services,
) -> None:
    """No token configured: 403 naming both variables; only the read token: the feed opens
    with it and refuses the status token that is not configured."""
    off = guarded(services, read_token=None, status_token=None).get("/api/events")
    assert off.status_code == 403
    assert "SCRAPESYNC_READ_TOKEN" in off.get_json()["detail"]
    client = guarded(services, read_token=READ_TOKEN, status_token=None)
    assert client.get(f"/api/events?token={READ_TOKEN}").status_code == 200
    assert client.get(f"/api/events?token={STATUS_TOKEN}").status_code == 401


def test_the_read_token_is_a_secret_masked_everywhere(services: Services) -> None:
    """SCRAPESYNC_READ_TOKEN is read from the environment, kept out of repr and masked."""
    from config.settings import Settings
    from sync import secrecy

    settings = Settings.from_env({"SCRAPESYNC_READ_TOKEN": READ_TOKEN})
    assert settings.read_token == READ_TOKEN
    assert READ_TOKEN not in repr(settings)
    assert READ_TOKEN in secrecy.secrets_of(settings)


@pytest.mark.postgres
def test_an_event_committed_late_is_served_after_the_pages_already_read(
    services: Services, cloud: CloudState
) -> None:
    """An event written first but committed after later ones were pulled is not skipped: it
    comes on the next page, after them."""
    from sync.outbox import write_event
    from sync.states import EventType

    client = guarded(services, read_token=READ_TOKEN)
    with services.uow.begin() as slow:
        late = write_event(
            slow,
            event_type=EventType.RUN_ACCEPTED,
            run_id="products-late",
            dataset="products",
            revision=1,
            payload={"run_id": "products-late"},
            destinations=[],
            now=services.clock(),
        )
        slow.flush()
        _run_id, early = accept_quietly(services, cloud)
        first = pull_everything(client, limit=10)
        assert [e["id"] for e in first] == early
        slow.commit()
    page = client.get(
        "/api/events", query_string={"after": first[-1]["id"], "token": READ_TOKEN}
    ).get_json()
    assert [e["id"] for e in page["events"]] == [late]
    Webhook(SECRET).verify(page["events"][0]["body"], page["events"][0]["headers"])


def test_an_action_needs_the_status_token_and_the_read_token_is_refused(
    services: Services,
) -> None:
    """What acts (rather than reads) opens only with the status token: the read token gets
    401, and with no status token configured actions are off (403)."""
    from webhooks import access

    settings = dataclasses.replace(
        services.settings, read_token=READ_TOKEN, status_token=STATUS_TOKEN
    )
    app = create_app(dataclasses.replace(services, settings=settings))
    for token, expected in [(STATUS_TOKEN, None), (READ_TOKEN, 401), ("wrong", 401)]:
        with app.test_request_context(headers={"Authorization": f"Bearer {token}"}):
            refused = access.refusal(access.Access.ACT)
            assert (refused.status_code if refused else None) == expected, token
        with app.test_request_context(query_string={"token": token}):
            refused = access.refusal(access.Access.READ)
            assert (refused.status_code if refused else None) == (
                401 if token == "wrong" else None
            ), token
    only_read = dataclasses.replace(settings, status_token=None)
    app = create_app(dataclasses.replace(services, settings=only_read))
    with app.test_request_context(query_string={"token": READ_TOKEN}):
        refused = access.refusal(access.Access.ACT)
        assert refused is not None
        assert refused.status_code == 403
