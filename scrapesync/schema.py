"""``scrapesync db``: the schema of the system of record and of the datasets' tables."""

from __future__ import annotations

import click

from config.settings import ConfigError, Settings
from scrapesync.terminal import CommandError, echo, echo_json
from sync import db


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


@click.group("db")
def db_group() -> None:
    """Database schema."""


@db_group.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def db_upgrade(revision: str, as_json: bool) -> None:
    """Apply database migrations (the release process)."""
    settings = _settings()
    db.upgrade(settings.database_url, revision)
    datasets = _upgrade_datasets(settings) if revision == "head" else []
    if as_json:
        echo_json({"revision": revision, "datasets": datasets})
        return
    echo(f"database at revision {revision}")
    for line in datasets:
        echo(line)


def _upgrade_datasets(settings: Settings) -> list[str]:
    """Bring the datasets' tables in line with the datasets file (after the migrations)."""
    from config.datasets import DatasetsFileError, load_datasets
    from sync.datasets.upgrade import upgrade_datasets

    if not settings.datasets_path.exists():
        return [f"no datasets file at {settings.datasets_path}: no dataset tables to check"]
    try:
        datasets = load_datasets(settings.datasets_path)
    except DatasetsFileError as exc:
        raise CommandError(str(exc)) from None
    engine = db.make_engine(settings.database_url)
    try:
        done = upgrade_datasets(db.UnitOfWork(engine), datasets, settings.data_schema)
    finally:
        engine.dispose()
    return [d.describe() for d in done]


@db_group.command("downgrade")
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Drop what the downgrade drops (it says what first).")
@click.option("--json", "as_json", is_flag=True, help="Print what was dropped as JSON.")
def db_downgrade(revision: str, yes: bool, as_json: bool) -> None:
    """Revert database migrations to REVISION (``base`` empties the schema and drops the
    datasets' tables); below head it says what it drops and needs --yes."""
    from sync.operations import downgrade

    settings = _settings()
    db.require_database(settings.database_url)
    plan = downgrade.plan(settings.database_url, revision, settings.data_schema)
    if plan.below_head or plan.dataset_objects:
        if not (yes and as_json):
            for line in plan.lines():
                echo(line, err=not yes)
        if not yes:
            raise CommandError(
                f"not downgraded: this drops data (above); run `scrapesync db downgrade "
                f"{revision} --yes` to go ahead"
            )
    db.downgrade(settings.database_url, revision)
    if revision == "base":
        downgrade.drop_dataset_objects(settings.database_url, settings.data_schema)
    if as_json:
        echo_json(
            {
                "revision": revision,
                "reverted": list(plan.reverted),
                "tables": list(plan.tables),
                "dataset_objects": list(plan.dataset_objects),
            }
        )
        return
    echo(f"database at revision {revision}")
