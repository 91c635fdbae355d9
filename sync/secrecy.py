"""The one place that keeps secrets out of text: every log line, stored error, error message and
CLI output passes through :func:`scrub`.

A secret is any configured credential: the Cloud API token, the notification (webhook) token,
the status token, every destination's signing secret, and the alert channels' credentials (a
Slack-style webhook URL, a signing secret, the SMTP URL's password). The composition root
registers them once per process (:func:`register_settings`); the Cloud client registers the
token it is given. :func:`scrub` replaces each of them, raw or in its URL-encoded or
JSON-escaped spellings, and any ``api_token=`` query value, with ``***``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import traceback
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, quote_plus, unquote, urlsplit

if TYPE_CHECKING:
    from config.datasets import Datasets
    from config.settings import Settings

MASK: Final = "***"
MIN_LENGTH: Final = 4  # shorter values would mask ordinary words; no real credential is this short
MIN_PATH_LENGTH: Final = 20  # a webhook URL's path is a token when long (Slack's: ~60 characters)

_TOKEN_PARAM = re.compile(r"(api_token=)[^&\s\"'<>#]*", re.IGNORECASE)
_lock = threading.Lock()
_rendering = threading.RLock()  # re-entered should a collector's finalizer log while it renders
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def _spellings(secret: str) -> set[str]:
    """The ways a secret can appear in text: raw, percent-encoded (either hex case), JSON."""
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    forms |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), f) for f in set(forms)}
    forms.add(json.dumps(secret)[1:-1])
    forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])
    return {f for f in forms if f}


def register(*secrets: str | None) -> None:
    """Add values that must never appear in text this process writes."""
    global _pattern
    fresh = {s for s in secrets if s and len(s) >= MIN_LENGTH} - _secrets
    if not fresh:
        return
    with _lock:
        _secrets.update(fresh)
        forms = set().union(*(_spellings(s) for s in _secrets))
        # longest first, so a secret that contains another is masked whole
        _pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))


def secrets_of(settings: Settings, datasets: Datasets | None = None) -> list[str]:
    """Every secret a deployment is configured with: tokens and destination signing secrets."""
    found = [settings.api_token, settings.webhook_token, settings.status_token, settings.read_token]
    if datasets is not None:
        for dataset in datasets.by_name.values():
            for destination in dataset.destinations:
                secret = settings.secret(destination.secret_env or "")
                if secret:
                    found.append(secret)
                    found.append(secret.removeprefix("whsec_"))  # the key part on its own
        found.extend(_alert_secrets(settings, datasets))
    found.extend(_url_secrets(settings.smtp_url))
    return [s for s in found if s]


def _url_secrets(url: str | None) -> list[str]:
    """A URL that carries a credential: the URL, its password and its path (a Slack-style
    webhook's path is its token)."""
    if not url:
        return []
    parts = urlsplit(url)
    found = [url, unquote(parts.password or "")]
    if len(parts.path) >= MIN_PATH_LENGTH and not parts.password:
        found.append(parts.path)
    return found


def _alert_secrets(settings: Settings, datasets: Datasets) -> list[str]:
    """The alert channels' secrets: Slack-style webhook URLs and signing secrets."""
    found: list[str] = []
    for channel in getattr(datasets, "alerts", ()):
        if channel.url_env:
            found.extend(_url_secrets(settings.secret(channel.url_env)))
        secret = settings.secret(channel.secret_env or "")
        if secret:
            found.extend([secret, secret.removeprefix("whsec_")])
    return found


def register_settings(settings: Settings, datasets: Datasets | None = None) -> None:
    """Register every secret of this deployment."""
    register(*secrets_of(settings, datasets))


def scrub(text: str) -> str:
    """The text with every registered secret and every ``api_token=`` value masked."""
    text = _TOKEN_PARAM.sub(r"\1" + MASK, text)
    pattern = _pattern
    return text if pattern is None else pattern.sub(MASK, text)


def scrub_value(value: Any) -> Any:
    """A JSON-like value with every string in it (keys too) scrubbed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub_value(k): scrub_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_value(v) for v in value]
    return value


class ScrubbingFilter(logging.Filter):
    """Rewrites a log record's message and exception text so no secret reaches a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Scrub the record in place; never drops it."""
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the logging module's problem, not ours
            return True
        clean = scrub(message)
        if clean != message:
            record.msg = clean
            record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = exception_text(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        return True


ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def exception_text(exc_info: ExcInfo) -> str:
    """The traceback of ``exc_info`` as logging renders it, rendered by one thread at a time.

    Python 3.11 marks where in a line an error happened by parsing the line with ``ast.parse``,
    whose recursion counter all of a process's threads share: two threads rendering at once can
    fail with ``SystemError: AST constructor recursion depth mismatch`` (CPython gh-106905), and
    a rendering that fails inside a logging call loses the line or raises out of the call. Ours
    take turns; one that fails all the same (beside another library's thread) is rendered
    without the markers, last exception only."""
    with _rendering:
        try:
            return logging.Formatter().formatException(exc_info)
        except Exception:
            return _plain(exc_info)


def _plain(exc_info: ExcInfo) -> str:
    """A traceback's frames and exception, with nothing that parses source."""
    kind, error, tb = exc_info
    lines = ["Traceback (most recent call last):\n"]
    for frame in traceback.extract_tb(tb):
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n')
        if frame.line:
            lines.append(f"    {frame.line.strip()}\n")
    lines.extend(traceback.format_exception_only(kind, error))
    return "".join(lines).rstrip("\n")
