"""The datasets file's alert channels (``[[alerts]]``) and its alert timings (``alert_interval``,
each dataset's ``stale_after``): who is told, in words, when something needs a person."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

ALERT_KINDS = ("slack", "webhook", "email")
DEFAULT_ALERT_INTERVAL = 6 * 3600.0
# how long without an accepted run a dataset may go by default, per collection window ("job"
# windows follow no calendar: no default)
DEFAULT_STALE_AFTER: dict[str, float | None] = {
    "daily": 2 * 86400.0,
    "weekly": 8 * 86400.0,
    "job": None,
}
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?[smhdw])+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_KEYS = {
    "slack": {"kind", "url_env", "datasets"},
    "webhook": {"kind", "url", "secret_env", "datasets"},
    "email": {"kind", "to", "from", "datasets"},
}


class AlertsConfigError(ValueError):
    """An ``[[alerts]]`` entry or an alert timing cannot be used; the message says which."""


@dataclass(frozen=True)
class AlertChannel:
    """Where alerts go: a Slack-style incoming webhook, a signed JSON POST, or e-mail. Secrets
    are named by their environment variables, never written here."""

    kind: str
    url_env: str | None = None
    url: str | None = None
    secret_env: str | None = None
    to: tuple[str, ...] = ()
    sender: str | None = None
    datasets: tuple[str, ...] = ()  # none named: every dataset

    @property
    def key(self) -> str:
        """A stable name for this channel, used in alert rows and status (no secret in it)."""
        if self.kind == "slack":
            return f"slack:{self.url_env}"
        if self.kind == "webhook":
            return f"webhook:{self.url}"
        return "email:" + ",".join(self.to)

    def covers(self, dataset: str | None) -> bool:
        """Whether this channel is told about ``dataset`` (an account-wide alert: every one)."""
        return dataset is None or not self.datasets or dataset in self.datasets


def parse_duration(where: str, value: Any) -> float:
    """A duration: seconds as a number, or text such as ``"90s"``, ``"30m"``, ``"6h"``,
    ``"2d"``, ``"1w"``, ``"1h30m"``."""
    if isinstance(value, bool):
        raise AlertsConfigError(f'{where} must be a duration such as "6h", got {value!r}')
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.match(value.strip().lower()):
        parts = _PART.findall(value.strip().lower())
        seconds = sum(float(n) * _UNITS[unit] for n, unit in parts)
    else:
        raise AlertsConfigError(
            f'{where} must be a duration such as "30m", "6h" or "2d" (or seconds), got {value!r}'
        )
    if not 0 < seconds < float("inf"):
        raise AlertsConfigError(f"{where} must be longer than nothing, got {value!r}")
    return seconds


def parse_stale_after(where: str, value: Any, window: str) -> float | None:
    """A dataset's ``stale_after``: a duration, ``"off"`` (or false), or the window's default."""
    if value is None:
        return DEFAULT_STALE_AFTER.get(window)
    if value is False or value == "off":
        return None
    return parse_duration(where, value)


def _names(where: str, value: Any, *, what: str) -> tuple[str, ...]:
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise AlertsConfigError(f"{where} must be a non-empty list of {what}")


def _variable(where: str, raw: dict[str, Any], key: str, purpose: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise AlertsConfigError(
            f"{where} needs {key}, the name of the environment variable that holds {purpose}"
        )
    return value


def parse_channel(where: str, raw: Any, known: frozenset[str]) -> AlertChannel:
    """One ``[[alerts]]`` entry; ``known`` are the datasets a channel may be limited to."""
    if not isinstance(raw, dict):
        raise AlertsConfigError(f"{where} must be a table")
    kind = raw.get("kind")
    if kind not in ALERT_KINDS:
        raise AlertsConfigError(
            f"{where}.kind must be one of {', '.join(ALERT_KINDS)}, got {kind!r}"
        )
    unknown = set(raw) - _KEYS[kind]
    if unknown:
        raise AlertsConfigError(f"{where} (kind {kind!r}) has unknown keys {sorted(unknown)}")
    datasets: tuple[str, ...] = ()
    if "datasets" in raw:
        datasets = _names(f"{where}.datasets", raw["datasets"], what="dataset names")
        missing = sorted(set(datasets) - known)
        if missing:
            raise AlertsConfigError(
                f"{where}.datasets names unknown datasets {missing} "
                f"(known: {', '.join(sorted(known)) or 'none'})"
            )
    if kind == "slack":
        url_env = _variable(where, raw, "url_env", "the incoming webhook's URL")
        return AlertChannel(kind, url_env=url_env, datasets=datasets)
    if kind == "webhook":
        url = raw.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise AlertsConfigError(f"{where}.url must be an http(s) URL")
        secret_env = _variable(where, raw, "secret_env", "the signing secret")
        return AlertChannel(kind, url=url, secret_env=secret_env, datasets=datasets)
    to = _names(f"{where}.to", raw.get("to"), what="e-mail addresses")
    if not all("@" in address for address in to):
        raise AlertsConfigError(f"{where}.to must hold e-mail addresses (name@host)")
    sender = raw.get("from")
    if sender is not None and (not isinstance(sender, str) or "@" not in sender):
        raise AlertsConfigError(f"{where}.from must be an e-mail address")
    return AlertChannel(kind, to=to, sender=sender, datasets=datasets)


def parse_channels(where: str, raw: Any, known: frozenset[str]) -> tuple[AlertChannel, ...]:
    """The file's ``[[alerts]]`` array of tables."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise AlertsConfigError(f"{where}: alerts must be an array of tables ([[alerts]])")
    return tuple(
        parse_channel(f"{where}: [[alerts]] #{i + 1}", r, known) for i, r in enumerate(raw)
    )
