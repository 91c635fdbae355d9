"""The ``scrapesync`` command: the operator's way in."""

from __future__ import annotations

import sys

import click
from sqlalchemy.exc import OperationalError

from config.datasets import DatasetsFileError
from config.settings import ConfigError, Settings
from sync import db, logs
from sync.bootstrap import Services


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
    except OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        click.echo(f"error: cannot reach the database: {reason}", err=True)
        sys.exit(2)


def _services() -> Services:
    from sync import bootstrap

    return bootstrap.from_env()


@main.command("sync")
@click.argument("job_id", type=int)
def sync_command(job_id: int) -> None:
    """Synchronise one Cloud scraping job now, in the foreground."""
    from sync import store, tasks

    services = _services()
    logs.configure()
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    result = tasks.run_sync(services, wish.task_key)
    if result.outcome == "not_claimed":
        raise click.ClickException(
            f"task {wish.task_key} is {result.state} (another worker holds it, or it waits "
            f"until {result.next_attempt_at:%Y-%m-%d %H:%M:%S} UTC)"
        )
    line = f"{wish.task_key}: {result.outcome}"
    if result.counts is not None:
        c = result.counts
        line += (
            f" run={result.run_id} read={result.records_read} inserted={c.inserted} "
            f"updated={c.updated} unchanged={c.unchanged} missing_key={result.missing_key}"
        )
    if result.error:
        line += f" ({result.error})"
    click.echo(line)
    if result.outcome not in ("committed",):
        sys.exit(1)
