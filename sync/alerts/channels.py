"""Alert channels: how one message reaches people, and what the answer means.

- ``slack``: a Slack-style incoming webhook, ``POST {"text": ...}`` to the URL held by the
  variable ``url_env`` (the URL is the credential: it is registered as a secret).
- ``webhook``: a JSON POST signed like deliveries (Standard Webhooks; ``webhook-id`` = the
  alert id, so a receiver deduplicates a re-send).
- ``email``: SMTP from ``SCRAPESYNC_SMTP_URL`` (``smtp://user:password@host:port``, STARTTLS
  when the server offers it; ``smtps://`` for TLS from the start). The password is sent only
  over TLS, or to a server on this machine's loopback.

Failure classes, decided here alone: a 2xx (or an accepted mail) is sent; a refusal that will
not change by itself (HTTP 4xx other than 408/429, a mail address or login refused) is
``dead``; anything else is retried (``failed``). Secrets never reach the error texts.
"""

from __future__ import annotations

import ipaddress
import smtplib
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from config.alerts import AlertChannel
from config.settings import Settings
from sync.delivery.destinations import event_body, signed_headers
from sync.states import DeliveryState

USER_AGENT = "scrapesync-alerts/0.1"
_REASON_WORDS = {
    "run_rejected": "run rejected",
    "partition_quarantined": "partitions quarantined",
    "delivery_dead": "deliveries dead",
    "task_stuck": "sync tasks stuck",
    "budget_spent": "Cloud budget spent",
    "stale": "dataset stale",
}


class AlertChannelError(Exception):
    """A channel cannot be used as configured; the message names the variable, never a secret."""


@dataclass(frozen=True)
class Message:
    """One claimed alert row, as a channel sends it."""

    alert_id: str
    dataset: str | None
    reason: str
    status: str
    text: str
    command: str
    details: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class Sent:
    """How one attempt ended: ``delivered``, ``failed`` (retry) or ``dead``, and why."""

    state: str
    status: int | None = None
    error: str | None = None


def title(message: Message) -> str:
    """A one-line summary: the e-mail subject."""
    what = _REASON_WORDS.get(message.reason, message.reason)
    whom = message.dataset or "Cloud account"
    if message.status == "recovered":
        return f"[scrapesync] {whom}: recovered ({what})"
    return f"[scrapesync] {whom}: {what}"


def document(message: Message) -> dict[str, Any]:
    """The JSON a signed webhook channel receives as ``data``."""
    return {
        "dataset": message.dataset,
        "reason": message.reason,
        "status": message.status,
        "title": title(message),
        "text": message.text,
        "command": message.command,
        "details": message.details,
    }


def _scrub(text: str, *secrets: str | None) -> str:
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _http_outcome(response: httpx.Response, *secrets: str | None) -> Sent:
    status = response.status_code
    if 200 <= status < 300:
        return Sent(DeliveryState.DELIVERED, status=status)
    snippet = _scrub(response.text[:200], *secrets).strip()
    error = f"HTTP {status}{': ' + snippet if snippet else ''}"
    if status in (408, 429) or status >= 500:
        return Sent(DeliveryState.FAILED, status=status, error=error)
    return Sent(DeliveryState.DEAD, status=status, error=f"{error}: refused, not retried")


def _post(client: httpx.Client, url: str, secrets: tuple[str | None, ...], **kw: Any) -> Sent:
    try:
        response = client.post(url, **kw)
    except httpx.TransportError as exc:
        # the exception's text may hold the URL, which is the credential of a Slack-style hook
        return Sent(
            DeliveryState.FAILED, error=f"{type(exc).__name__}: {_scrub(str(exc), *secrets)}"
        )
    return _http_outcome(response, *secrets)


def _missing(variable: str | None, purpose: str) -> Sent:
    return Sent(
        DeliveryState.FAILED,
        error=f"AlertChannelError: environment variable {variable} ({purpose}) is not set",
    )


def send(settings: Settings, client: httpx.Client, channel: AlertChannel, message: Message) -> Sent:
    """One attempt at sending ``message`` on ``channel``."""
    if channel.kind == "slack":
        url = settings.secret(channel.url_env or "")
        if url is None:
            return _missing(channel.url_env, "the incoming webhook's URL")
        path = urlsplit(url).path
        return _post(
            client, url, (url, path if len(path) >= 20 else None), json={"text": message.text}
        )
    if channel.kind == "webhook":
        secret = settings.secret(channel.secret_env or "")
        if secret is None:
            return _missing(channel.secret_env, "the signing secret")
        body = event_body(
            message.alert_id, f"alert.{message.status}", message.created_at, document(message)
        )
        try:
            headers = signed_headers(
                secret, message.alert_id, int(datetime.now(UTC).timestamp()), body
            )
        except Exception as exc:  # a malformed whsec_ secret: say which variable, not its value
            return Sent(DeliveryState.DEAD, error=f"{channel.secret_env}: {type(exc).__name__}")
        assert channel.url is not None
        return _post(client, channel.url, (secret,), content=body, headers=headers)
    return send_mail(settings, channel, message, timeout=client.timeout.read or 10.0)


# --- e-mail -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SmtpServer:
    """Where mail goes, read from ``SCRAPESYNC_SMTP_URL``."""

    host: str
    port: int
    tls: bool  # TLS from the first byte (smtps://)
    user: str | None
    password: str | None

    @property
    def loopback(self) -> bool:
        """Whether the server is on this machine (a password may then go without TLS)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def smtp_server(url: str | None) -> SmtpServer:
    """The SMTP server of ``SCRAPESYNC_SMTP_URL``, or an error that never shows its password."""
    if not url:
        raise AlertChannelError("SCRAPESYNC_SMTP_URL is not set: e-mail alerts need it")
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise AlertChannelError(
            "SCRAPESYNC_SMTP_URL must look like smtp://user:password@host:587 (or smtps://...)"
        )
    try:
        port = parts.port or (465 if parts.scheme == "smtps" else 587)
    except ValueError:
        raise AlertChannelError("SCRAPESYNC_SMTP_URL has a port that is not a number") from None
    return SmtpServer(
        host=parts.hostname,
        port=port,
        tls=parts.scheme == "smtps",
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )


def email_of(channel: AlertChannel, server: SmtpServer, message: Message) -> EmailMessage:
    """The e-mail of one alert (its Message-ID is the alert id, so a re-send is recognisable)."""
    mail = EmailMessage()
    sender = channel.sender or (
        server.user if server.user and "@" in server.user else f"scrapesync@{server.host}"
    )
    mail["From"] = sender
    mail["To"] = ", ".join(channel.to)
    mail["Subject"] = title(message)
    mail["Message-ID"] = f"<{message.alert_id}@scrapesync>"
    mail.set_content(message.text + "\n")
    return mail


_REFUSED = (
    smtplib.SMTPAuthenticationError,
    smtplib.SMTPRecipientsRefused,
    smtplib.SMTPSenderRefused,
    smtplib.SMTPNotSupportedError,
)


def send_mail(
    settings: Settings, channel: AlertChannel, message: Message, *, timeout: float
) -> Sent:
    """One attempt at mailing ``message`` to the channel's addresses."""
    try:
        server = smtp_server(settings.smtp_url)
    except AlertChannelError as exc:
        return Sent(DeliveryState.FAILED, error=f"AlertChannelError: {exc}")
    secrets = (settings.smtp_url, server.password)
    try:
        _deliver_mail(server, email_of(channel, server, message), timeout=timeout)
    except AlertChannelError as exc:
        return Sent(DeliveryState.DEAD, error=f"AlertChannelError: {exc}")
    except _REFUSED as exc:
        return Sent(DeliveryState.DEAD, error=f"{type(exc).__name__}: {_scrub(str(exc), *secrets)}")
    except (OSError, smtplib.SMTPException) as exc:
        return Sent(
            DeliveryState.FAILED, error=f"{type(exc).__name__}: {_scrub(str(exc), *secrets)}"
        )
    return Sent(DeliveryState.DELIVERED)


def _deliver_mail(server: SmtpServer, mail: EmailMessage, *, timeout: float) -> None:
    context = ssl.create_default_context()
    client: smtplib.SMTP
    if server.tls:
        client = smtplib.SMTP_SSL(server.host, server.port, timeout=timeout, context=context)
    else:
        client = smtplib.SMTP(server.host, server.port, timeout=timeout)
    with client:
        client.ehlo()
        secure = server.tls
        if not secure and client.has_extn("starttls"):
            client.starttls(context=context)
            client.ehlo()
            secure = True
        if server.user is not None:
            if not secure and not server.loopback:
                raise AlertChannelError(
                    f"the SMTP server {server.host} offers no STARTTLS: the password is not sent "
                    "in the clear (use smtps:// or a server that offers STARTTLS)"
                )
            client.login(server.user, server.password or "")
        client.send_message(mail)
