"""Settings come from the environment names in DESIGN.md, once, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.settings import ConfigError, Settings


def test_defaults_match_the_documented_interface() -> None:
    """With nothing set, SQLite in the working folder, the real Cloud API, the default file."""
    settings = Settings.from_env({})
    assert settings.database_url == "sqlite:///scrapesync.db"
    assert settings.api_url == "https://api.webscraper.io/api/v1/"
    assert settings.datasets_path == Path("config/datasets.toml")
    assert settings.redis_url is None


@pytest.mark.parametrize(
    "url",
    ["postgres://u:p@db.example:5432/app", "postgresql://u:p@db.example:5432/app"],
)
def test_heroku_postgres_urls_use_the_psycopg_driver(url: str) -> None:
    """Heroku's postgres:// scheme (and plain postgresql://) map onto psycopg 3."""
    settings = Settings.from_env({"DATABASE_URL": url})
    assert settings.database_url == "postgresql+psycopg://u:p@db.example:5432/app"


def test_every_documented_variable_is_read() -> None:
    """Each environment variable of the interface lands in its setting."""
    settings = Settings.from_env(
        {
            "DATABASE_URL": "sqlite:///x.db",
            "REDIS_URL": "redis://127.0.0.1:6379/3",
            "WEBSCRAPER_API_TOKEN": "tok",
            "WEBSCRAPER_API_URL": "http://127.0.0.1:8001/api/v1/",
            "WEBHOOK_TOKEN": "hook",
            "SCRAPESYNC_DATASETS": "/etc/scrapesync/datasets.toml",
            "PORT": "8080",
        }
    )
    assert settings.redis_url == "redis://127.0.0.1:6379/3"
    assert settings.require_api_token() == "tok"
    assert settings.api_url == "http://127.0.0.1:8001/api/v1/"
    assert settings.require_webhook_token() == "hook"
    assert settings.datasets_path == Path("/etc/scrapesync/datasets.toml")
    assert settings.port == 8080


@pytest.mark.parametrize(
    ("method", "variable"),
    [
        ("require_api_token", "WEBSCRAPER_API_TOKEN"),
        ("require_webhook_token", "WEBHOOK_TOKEN"),
        ("require_redis_url", "REDIS_URL"),
    ],
)
def test_a_missing_secret_is_an_error_naming_the_variable(method: str, variable: str) -> None:
    """A process that needs a missing variable stops with its name in the message."""
    with pytest.raises(ConfigError, match=variable):
        getattr(Settings.from_env({}), method)()


def test_secrets_stay_out_of_the_repr() -> None:
    """Printing the settings never shows the API or webhook token."""
    settings = Settings.from_env({"WEBSCRAPER_API_TOKEN": "very-secret", "WEBHOOK_TOKEN": "hook-x"})
    assert "very-secret" not in repr(settings)
    assert "hook-x" not in repr(settings)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PORT", "eighty"),
        ("SCRAPESYNC_API_BUDGET", "-1"),
        ("SCRAPESYNC_LEASE_SECONDS", "nan"),
        ("SCRAPESYNC_SWEEP_SECONDS", "inf"),
        ("SCRAPESYNC_SHUTDOWN_GRACE_SECONDS", "0"),
    ],
)
def test_malformed_numbers_are_refused_by_name(name: str, value: str) -> None:
    """A setting that is not a usable number is a start-up error naming it."""
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})


def test_default_lease_and_sweep_pick_up_a_dead_workers_task_within_about_ninety_seconds() -> None:
    """A 60 s lease (heartbeat every 20 s) and a 30 s sweep; SIGTERM leaves a sync 20 s of
    Heroku's 30 s grace."""
    settings = Settings.from_env({})
    assert (settings.lease_seconds, settings.sweep_interval) == (60.0, 30.0)
    assert settings.lease_seconds + settings.sweep_interval <= 90.0
    assert settings.shutdown_grace == 20.0
    tuned = Settings.from_env(
        {"SCRAPESYNC_LEASE_SECONDS": "1", "SCRAPESYNC_SHUTDOWN_GRACE_SECONDS": "5"}
    )
    assert (tuned.lease_seconds, tuned.shutdown_grace) == (1.0, 5.0)


def test_the_limits_on_clouds_exports_have_defaults_and_can_be_set() -> None:
    """Record-line and record size caps and the unknown-status time: defaults, and overrides."""
    default = Settings.from_env({})
    assert (default.max_record_line_bytes, default.max_record_bytes) == (4 << 20, 1 << 20)
    assert default.unknown_status_seconds == 3600.0
    custom = Settings.from_env(
        {
            "SCRAPESYNC_MAX_RECORD_LINE_BYTES": "65536",
            "SCRAPESYNC_MAX_RECORD_BYTES": "2048",
            "SCRAPESYNC_UNKNOWN_STATUS_SECONDS": "600",
        }
    )
    assert (custom.max_record_line_bytes, custom.max_record_bytes) == (65536, 2048)
    assert custom.unknown_status_seconds == 600.0


RETENTION_DAYS = (
    "SCRAPESYNC_NOTIFICATIONS_RETENTION_DAYS",
    "SCRAPESYNC_ATTEMPTS_RETENTION_DAYS",
    "SCRAPESYNC_OUTBOX_RETENTION_DAYS",
)


def test_retention_days_default_to_ninety_ninety_and_thirty_and_zero_keeps_all() -> None:
    """Notifications and attempts are kept 90 days and delivered events 30 by default; 0 is a
    valid setting (keep everything) and a fraction of a day is too."""
    settings = Settings.from_env({})
    assert (
        settings.notifications_retention_days,
        settings.attempts_retention_days,
        settings.outbox_retention_days,
    ) == (90.0, 90.0, 30.0)
    zero = Settings.from_env({**dict.fromkeys(RETENTION_DAYS, "0")})
    assert (
        zero.notifications_retention_days,
        zero.attempts_retention_days,
        zero.outbox_retention_days,
    ) == (0.0, 0.0, 0.0)
    assert Settings.from_env({RETENTION_DAYS[2]: "0.5"}).outbox_retention_days == 0.5


@pytest.mark.parametrize("value", ["-1", "a week", "nan", "inf"])
@pytest.mark.parametrize("name", RETENTION_DAYS)
def test_retention_days_that_are_not_a_number_of_days_are_refused_by_name(
    name: str, value: str
) -> None:
    """A negative, non-numeric or endless retention period is a start-up error naming it."""
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})
