"""The ``scrapesync`` command: the operator's way in."""

from __future__ import annotations

import sys

import click

from config.datasets import DatasetsFileError
from config.settings import ConfigError, Settings
from sync import db


@click.group()
def main() -> None:
    """Keep a database in step with Web Scraper Cloud."""


@main.group("db")
def db_group() -> None:
    """Database schema."""


@db_group.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply database migrations (the release process)."""
    settings = _settings()
    db.upgrade(settings.database_url, revision)
    click.echo(f"database at revision {revision}")


@db_group.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Revert database migrations to REVISION (``base`` empties the schema)."""
    settings = _settings()
    db.downgrade(settings.database_url, revision)
    click.echo(f"database at revision {revision}")


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def run() -> None:
    """Entry point that turns configuration errors into one clear line."""
    try:
        main()
    except (ConfigError, DatasetsFileError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
