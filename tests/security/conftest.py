"""Fixtures for hostile input: a deployment with every kind of secret configured."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import quote

import pytest
from redis import Redis
from sqlalchemy import select

from config.datasets import Datasets
from simulator import CloudState
from sync import bootstrap
from sync.bootstrap import Services
from sync.db import UnitOfWork
from sync.models import Attempt, Launch, MaintenanceRun, SyncTask
from tests.harness import API_TOKEN, DATASETS_TOML, WEBHOOK_TOKEN, datasets_from, wire

STATUS_TOKEN = "status-secret-77e1c9"
SIGNING_SECRET = "sign/secret+with spaces&more"
SECRETS = (API_TOKEN, WEBHOOK_TOKEN, STATUS_TOKEN, SIGNING_SECRET)

DESTINATION_TOML = """
[[datasets.products.destinations]]
url = "https://receiver.example/hooks"
secret_env = "PRODUCTS_HOOK_SECRET"
"""


def spellings(secret: str) -> list[str]:
    """A secret as a hostile echo would spell it: raw and URL-encoded."""
    return [secret, quote(secret, safe=""), quote(secret, safe="").lower()]


def leaked(text: str) -> list[str]:
    """The secrets (in any spelling) that appear in ``text``."""
    return [s for s in SECRETS for form in spellings(s) if form in text]


def echo_of_every_secret() -> str:
    """A string that quotes every configured secret in every spelling."""
    return " ".join(form for s in SECRETS for form in spellings(s))


def echoing_422(cloud: CloudState, path: str, **only: str) -> None:
    """Arm Cloud to answer a 422 whose validationErrors quote every secret."""
    body = {"success": False, "validationErrors": {"api_token": [echo_of_every_secret()]}}
    cloud.inject_fault(
        "status",
        path_contains=path,
        times=None,
        status=422,
        body=json.dumps(body),
        content_type="application/json",
        **only,
    )


def stored_text(services: Services) -> str:
    """Every error column and summary the sync path and reconcile write, as one text."""
    with services.uow.begin() as session:
        parts = [
            *[str(e) for e in session.execute(select(Attempt.error)).scalars()],
            *[str(e) for e in session.execute(select(SyncTask.last_error)).scalars()],
            *[str(e) for e in session.execute(select(Launch.last_error)).scalars()],
            *[json.dumps(s) for s in session.execute(select(MaintenanceRun.summary)).scalars()],
        ]
    return "\n".join(parts)


@pytest.fixture
def secret_datasets() -> Datasets:
    """The test datasets file with a signed destination."""
    return datasets_from(DATASETS_TOML + DESTINATION_TOML)


@pytest.fixture
def guarded(
    services: Services,
    uow: UnitOfWork,
    redis_conn: Redis,
    cloud: CloudState,
    secret_datasets: Datasets,
    sleeps: list[float],
) -> Iterator[Services]:
    """Services configured with an API token, a webhook token, a status token and a signing
    secret, on the test databases and the in-process simulator."""
    settings = replace(
        services.settings,
        status_token=STATUS_TOKEN,
        environment={"PRODUCTS_HOOK_SECRET": SIGNING_SECRET},
    )
    built = wire(settings, secret_datasets, uow, redis_conn, cloud, sleeps)
    yield built
    bootstrap.use(services)
