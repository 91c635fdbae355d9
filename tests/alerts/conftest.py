"""Fixtures for alerts: the acceptance fixtures (a dataset of one run per job, a signed HTTP
destination) with alert channels, a Slack-style receiver on a loopback socket and a real SMTP
server (aiosmtpd) that asks for a password."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from email import message_from_bytes
from email.message import Message
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP as SMTPServer  # noqa: N811 - aiosmtpd's name for its server
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session

from config.datasets import Datasets
from sync import bootstrap, secrecy
from sync.bootstrap import Services
from tests.acceptance.conftest import receiver  # noqa: F401 - shared fixture
from tests.acceptance.flow import DATASETS_TOML, SECRET, SECRET_ENV, wire_receiver
from tests.fakes import Receiver
from tests.harness import datasets_from

SLACK_ENV = "OPS_SLACK_URL"
SLACK_TOKEN = "xoxbTOKEN9f3k2LmQ7vR4sW8nZ"  # the secret part of a Slack-style webhook URL
SMTP_USER = "alerts@example.com"
SMTP_PASSWORD = "smtp-pa55word-7QxZ"
ALERT_SECRETS = (SLACK_TOKEN, SMTP_PASSWORD)

ALERTS_TOML = f"""
alert_interval = "6h"

[[alerts]]
kind = "slack"
url_env = "{SLACK_ENV}"

[[alerts]]
kind = "email"
to = ["ops@example.com"]
from = "scrapesync@example.com"
datasets = ["products"]
"""


@dataclass
class Mailbox:
    """What a real SMTP server on a loopback port received, and who logged in."""

    port: int = 0
    messages: list[Message] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The SCRAPESYNC_SMTP_URL of this server."""
        return f"smtp://{SMTP_USER}:{SMTP_PASSWORD}@127.0.0.1:{self.port}"

    async def handle_DATA(  # noqa: N802 - the hook name aiosmtpd calls
        self, server: SMTPServer, session: Session, envelope: Envelope
    ) -> str:
        """Keep the message."""
        content = envelope.original_content or b""
        self.messages.append(message_from_bytes(content))
        return "250 OK"

    def authenticate(
        self, server: SMTPServer, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        """Let in the configured user only."""
        if isinstance(data, LoginPassword):
            login, password = data.login.decode(), data.password.decode()
            self.logins.append((login, password))
            if (login, password) == (SMTP_USER, SMTP_PASSWORD):
                return AuthResult(success=True)
        return AuthResult(success=False, handled=False)

    def bodies(self) -> list[str]:
        """Each message's text."""
        texts = []
        for message in self.messages:
            payload = message.get_payload(decode=True)
            texts.append(payload.decode() if isinstance(payload, bytes) else str(payload))
        return texts


def free_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    """A real SMTP server on a loopback port that needs the configured login."""
    box = Mailbox(port=free_port())
    controller = Controller(
        box,
        hostname="127.0.0.1",
        port=box.port,
        authenticator=box.authenticate,
        auth_require_tls=False,
        auth_required=False,  # with no TLS aiosmtpd warns; the login is still checked
    )
    controller.start()
    yield box
    controller.stop()


@pytest.fixture
def slack() -> Iterator[Receiver]:
    """A Slack-style incoming webhook on a loopback port, answering 200."""
    found = Receiver(status=200)
    with found.serve(f"/services/T0ALERTS/B0ALERTS/{SLACK_TOKEN}"):
        yield found


@pytest.fixture
def loopback() -> Iterator[Receiver]:
    """The dataset's signed destination on a loopback port, answering 204."""
    found = Receiver(secret=SECRET)
    with found.serve():
        yield found


@pytest.fixture
def datasets() -> Datasets:
    """The acceptance dataset, with a Slack-style channel and an e-mail channel."""
    return datasets_from(ALERTS_TOML + DATASETS_TOML)


def alert_environment(slack: Receiver, mailbox: Mailbox) -> dict[str, str]:
    """The variables the alert channels and the destination read."""
    return {SECRET_ENV: SECRET, SLACK_ENV: slack.url, "SCRAPESYNC_SMTP_URL": mailbox.url}


@pytest.fixture
def services(
    services: Services,
    receiver: Receiver,  # noqa: F811
    slack: Receiver,
    mailbox: Mailbox,
) -> Services:
    """The sync fixtures' services announcing to the signed receiver, with the channels'
    variables set as a deployment sets them."""
    announcing = wire_receiver(services, receiver)
    settings = replace(
        announcing.settings, environment=alert_environment(slack, mailbox), smtp_url=mailbox.url
    )
    secrecy.register_settings(settings, announcing.datasets)
    wired = replace(announcing, settings=settings)
    bootstrap.use(wired)
    return wired
