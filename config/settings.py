"""Process settings: one frozen object built from the environment once per process."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

DEFAULT_DATABASE_URL = "sqlite:///scrapesync.db"
DEFAULT_API_URL = "https://api.webscraper.io/api/v1/"
DEFAULT_DATASETS_PATH = "config/datasets.toml"
_SCHEMA_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

# What a deployment (release, web and worker against PostgreSQL and Redis) cannot do without, and
# why. ``app.json`` declares each one (or an add-on provides it); ``scrapesync doctor`` checks them.
REQUIRED_VARIABLES: Mapping[str, str] = MappingProxyType(
    {
        "DATABASE_URL": "the system of record (PostgreSQL); the SQLite default is for one machine",
        "REDIS_URL": "the queue between web and worker, and the shared Cloud API budget",
        "WEBSCRAPER_API_TOKEN": "the worker reads Cloud's jobs and exports with it",
        "WEBHOOK_TOKEN": "the secret path segment of the notification URL set in Cloud",
        "SCRAPESYNC_STATUS_TOKEN": "protects /status, /api/runs and /metrics (off without it)",
    }
)


class ConfigError(Exception):
    """A setting is missing or malformed; the message names the variable."""


def normalise_database_url(url: str) -> str:
    """Map Heroku's ``postgres://`` and plain ``postgresql://`` onto the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


KNOWN_DATABASES = ("postgresql+psycopg", "sqlite", "sqlite+pysqlite")
DATABASE_URL_FORMS = "postgres://USER:PASSWORD@HOST:PORT/NAME or sqlite:///PATH"


def masked_url(url: str) -> str:
    """``url`` with the password (whatever follows ``user:`` before ``@``) replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***" if "@" in url else url
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        credentials, _, host = authority.rpartition("@")
        user, colon, _password = credentials.partition(":")
        authority = f"{user}{':***' if colon else ''}@{host}"
    return f"{scheme}://{authority}{slash}{tail}"


def check_database_url(url: str) -> str:
    """``url`` if its scheme is one scrapesync speaks, else a one-line error naming the scheme
    (the password masked)."""
    scheme, sep, _rest = url.partition("://")
    if not sep or not scheme:
        raise ConfigError(
            f"DATABASE_URL is not a database URL ({masked_url(url)!r}): use {DATABASE_URL_FORMS}"
        )
    if scheme.lower() not in KNOWN_DATABASES:
        raise ConfigError(
            f"DATABASE_URL has the scheme {scheme!r}, which scrapesync cannot use "
            f"({masked_url(url)}): use {DATABASE_URL_FORMS}"
        )
    return url


def _schema(name: str) -> str:
    if not _SCHEMA_NAME.match(name):
        raise ConfigError(
            "SCRAPESYNC_DATA_SCHEMA must be a plain SQL name (lower case letters, digits and "
            f"underscores, starting with a letter), got {name!r}"
        )
    return name


def _number(
    env: Mapping[str, str], name: str, default: float, *, zero_keeps_all: bool = False
) -> float:
    """A positive finite number; with ``zero_keeps_all`` (a retention period in days) 0 too."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    smallest_ok = value >= 0 if zero_keeps_all else value > 0
    if not (smallest_ok and value < float("inf")):  # NaN fails every comparison
        wanted = "0 (keep all) or a positive number of days" if zero_keeps_all else "positive"
        raise ConfigError(f"{name} must be {wanted}, got {raw!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """Everything a scrapesync process reads from its environment."""

    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str | None = None
    api_url: str = DEFAULT_API_URL
    datasets_path: Path = Path(DEFAULT_DATASETS_PATH)
    port: int = 5000
    api_token: str | None = field(default=None, repr=False)
    webhook_token: str | None = field(default=None, repr=False)
    status_token: str | None = field(default=None, repr=False)
    api_budget_limit: int = 200
    api_budget_window: float = 900.0
    lease_seconds: float = 60.0
    sweep_interval: float = 30.0
    reconcile_interval: float = 900.0
    max_sync_attempts: int = 12
    max_record_line_bytes: int = 4 * 1024 * 1024
    max_record_bytes: int = 1024 * 1024
    unknown_status_seconds: float = 3600.0
    export_dir: Path = Path("exports")
    shutdown_grace: float = 20.0
    kill_at: str | None = None
    kill_once_marker: str | None = None
    hold_at: str | None = None
    hold_file: str | None = None
    hold_seconds: float = 600.0
    # the PostgreSQL schema of the datasets' typed tables (SQLite prefixes their names instead)
    data_schema: str = "datasets"
    # days kept of notifications, attempts and delivered outbox events (0: keep all)
    notifications_retention_days: float = 90.0
    attempts_retention_days: float = 90.0
    outbox_retention_days: float = 30.0
    environment: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    # opens the read-only pages and APIs (/api/events, /api/runs, /api/changes, /metrics,
    # /status without its actions); the status token opens those and every action
    read_token: str | None = field(default=None, repr=False)
    # where e-mail alerts are sent from: smtp://user:password@host:port (smtps:// for TLS)
    smtp_url: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the settings named in DESIGN.md from ``env`` (default: the process environment)."""
        env = os.environ if env is None else env
        port_raw = env.get("PORT") or "5000"
        if not port_raw.isdigit():
            raise ConfigError(f"PORT must be a whole number, got {port_raw!r}")
        return cls(
            database_url=check_database_url(
                normalise_database_url(env.get("DATABASE_URL") or DEFAULT_DATABASE_URL)
            ),
            redis_url=env.get("REDIS_URL") or None,
            api_url=env.get("WEBSCRAPER_API_URL") or DEFAULT_API_URL,
            datasets_path=Path(env.get("SCRAPESYNC_DATASETS") or DEFAULT_DATASETS_PATH),
            port=int(port_raw),
            api_token=env.get("WEBSCRAPER_API_TOKEN") or None,
            webhook_token=env.get("WEBHOOK_TOKEN") or None,
            status_token=env.get("SCRAPESYNC_STATUS_TOKEN") or None,
            api_budget_limit=int(_number(env, "SCRAPESYNC_API_BUDGET", 200)),
            api_budget_window=_number(env, "SCRAPESYNC_API_WINDOW_SECONDS", 900.0),
            lease_seconds=_number(env, "SCRAPESYNC_LEASE_SECONDS", 60.0),
            sweep_interval=_number(env, "SCRAPESYNC_SWEEP_SECONDS", 30.0),
            reconcile_interval=_number(env, "SCRAPESYNC_RECONCILE_SECONDS", 900.0),
            max_sync_attempts=int(_number(env, "SCRAPESYNC_MAX_SYNC_ATTEMPTS", 12)),
            max_record_line_bytes=int(
                _number(env, "SCRAPESYNC_MAX_RECORD_LINE_BYTES", 4 * 1024 * 1024)
            ),
            max_record_bytes=int(_number(env, "SCRAPESYNC_MAX_RECORD_BYTES", 1024 * 1024)),
            unknown_status_seconds=_number(env, "SCRAPESYNC_UNKNOWN_STATUS_SECONDS", 3600.0),
            export_dir=Path(env.get("SCRAPESYNC_EXPORT_DIR") or "exports"),
            kill_at=env.get("SCRAPESYNC_KILL_AT") or None,
            kill_once_marker=env.get("SCRAPESYNC_KILL_ONCE_MARKER") or None,
            shutdown_grace=_number(env, "SCRAPESYNC_SHUTDOWN_GRACE_SECONDS", 20.0),
            hold_at=env.get("SCRAPESYNC_HOLD_AT") or None,
            hold_file=env.get("SCRAPESYNC_HOLD_FILE") or None,
            hold_seconds=_number(env, "SCRAPESYNC_HOLD_SECONDS", 600.0),
            data_schema=_schema(env.get("SCRAPESYNC_DATA_SCHEMA") or "datasets"),
            notifications_retention_days=_number(
                env, "SCRAPESYNC_NOTIFICATIONS_RETENTION_DAYS", 90.0, zero_keeps_all=True
            ),
            attempts_retention_days=_number(
                env, "SCRAPESYNC_ATTEMPTS_RETENTION_DAYS", 90.0, zero_keeps_all=True
            ),
            outbox_retention_days=_number(
                env, "SCRAPESYNC_OUTBOX_RETENTION_DAYS", 30.0, zero_keeps_all=True
            ),
            environment=dict(env),
            read_token=env.get("SCRAPESYNC_READ_TOKEN") or None,
            smtp_url=env.get("SCRAPESYNC_SMTP_URL") or None,
        )

    def secret(self, name: str) -> str | None:
        """The value of the environment variable ``name`` that the datasets file names as a
        secret (a destination's signing key), or None when it is unset or empty."""
        return self.environment.get(name) or None

    def require_api_token(self) -> str:
        """The Cloud API token, or a start-up error naming the variable."""
        if not self.api_token:
            raise ConfigError("WEBSCRAPER_API_TOKEN is not set: the worker needs it to read Cloud")
        return self.api_token

    def require_webhook_token(self) -> str:
        """The notification URL token, or a start-up error naming the variable."""
        if not self.webhook_token:
            raise ConfigError(
                "WEBHOOK_TOKEN is not set: the web process needs it to accept notifications"
            )
        return self.webhook_token

    def require_redis_url(self) -> str:
        """The Redis URL, or a start-up error naming the variable."""
        if not self.redis_url:
            raise ConfigError("REDIS_URL is not set: the worker and the queue need Redis")
        return self.redis_url
