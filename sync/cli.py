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
    if result.outcome == "committed" and result.state == "committed" and result.run_id:
        from sync import runs

        evaluation = runs.evaluate_run(services, result.run_id)
        click.echo(f"run {result.run_id}: {evaluation.state} ({evaluation.outcome})")
    if result.outcome not in ("committed",):
        sys.exit(1)


# --- operations: launch, reconcile, rerun, status, simulator, demo ------------------------------


def _foreground(services: Services) -> Services:
    """Without Redis there is no worker: syncs the command asks for run here and now."""
    from dataclasses import replace

    from sync import tasks
    from sync.queue import RecordingDispatcher

    if not isinstance(services.dispatcher, RecordingDispatcher):
        return services
    foreground = replace(services)

    def run_now(task_key: str) -> None:
        tasks.run_sync(foreground, task_key)

    foreground.dispatcher = RecordingDispatcher(on_sync=run_now)
    return foreground


def _interactive() -> bool:
    """Whether a person watches: a terminal gets a progress bar, a pipe one summary line."""
    return sys.stdout.isatty()


def _echo_json(values: object) -> None:
    import json

    click.echo(json.dumps(values, indent=2, default=str, sort_keys=False))


@main.command("launch")
@click.argument("dataset")
@click.option("--window", help="Collection window (default: the current one), e.g. 2026-12-02.")
@click.option(
    "--start-url", "start_urls", multiple=True, help="Start URL for this job only (repeatable)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def launch_command(
    dataset: str, window: str | None, start_urls: tuple[str, ...], as_json: bool
) -> None:
    """Start the Cloud job of DATASET's run for a window (the same window: the same run and job)."""
    from sync import launch

    services = _services()
    try:
        outcome = launch.launch(services, dataset, window=window, start_urls=start_urls)
    except launch.LaunchError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        _echo_json(outcome.as_dict())
    else:
        job = f"Cloud job {outcome.job_id}" if outcome.job_id is not None else "no Cloud job yet"
        click.echo(f"run {outcome.run_id}: {job} ({outcome.state}: {outcome.message})")
    if outcome.state != "created":
        sys.exit(1)


@main.command("reconcile")
@click.option("--since", default="7d", show_default=True, help="Look back this far: 7d, 12h, 30m.")
@click.option("--dry-run", is_flag=True, help="Only report what a pass would do.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def reconcile_command(since: str, dry_run: bool, as_json: bool) -> None:
    """Compare Cloud's jobs with ours and heal what notifications, workers and Redis lost."""
    from typing import Any

    from sync import reconcile

    try:
        look_back = reconcile.parse_since(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    services = _foreground(_services())
    interactive = _interactive() and not as_json
    bar: Any = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = click.progressbar(length=total, label="checking Cloud jobs")
            bar.__enter__()
        bar.update(1)

    try:
        report = reconcile.reconcile(
            services,
            since=look_back,
            dry_run=dry_run,
            on_progress=progress if interactive else None,
        )
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    if as_json:
        _echo_json(report.as_dict())
        return
    click.echo(report.summary_line())
    if interactive:
        for wish in report.wanted:
            click.echo(f"  job {wish.job_id}: {wish.reason}")
        for run_id in report.runs_evaluated:
            click.echo(f"  run {run_id}: evaluated")


@main.command("rerun")
@click.argument("run_id")
@click.option("--partition", help="Re-scrape this partition from its observations' start URLs.")
@click.option("--failed-pages", is_flag=True, help="Re-scrape the run's problematic URLs.")
@click.option("--url", "urls", multiple=True, help="Re-scrape this URL (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def rerun_command(
    run_id: str, partition: str | None, failed_pages: bool, urls: tuple[str, ...], as_json: bool
) -> None:
    """Launch a recovery job under RUN_ID for one partition, its failed pages or given URLs."""
    from sync import launch, rerun

    chosen = sum([partition is not None, failed_pages, bool(urls)])
    if chosen != 1:
        raise click.UsageError("choose exactly one of --partition, --failed-pages or --url")
    services = _services()
    try:
        outcome = rerun.rerun(
            services, run_id, partition=partition, failed_pages=failed_pages, urls=urls
        )
    except (rerun.RerunError, launch.LaunchError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        _echo_json(outcome.as_dict())
    else:
        job = f"Cloud job {outcome.job_id}" if outcome.job_id is not None else "no Cloud job yet"
        click.echo(
            f"run {outcome.run_id}: recovery batch {outcome.batch_id} with "
            f"{len(outcome.start_urls)} start URLs: {job} ({outcome.state}: {outcome.message})"
        )
    if outcome.state != "created":
        sys.exit(1)


@main.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the overview as JSON.")
@click.option("--limit", default=20, show_default=True, help="How many recent runs to show.")
def status_command(as_json: bool, limit: int) -> None:
    """Runs, coverage and verdicts; tasks, outbox backlog, last reconcile, API budget."""
    from sync import status

    values = status.overview(_services(), limit=limit)
    if as_json:
        _echo_json(values)
    else:
        click.echo(status.format_table(values))


@main.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor_command(as_json: bool) -> None:
    """Check variables, database, Redis, the Cloud token and each dataset against its sitemap."""
    from sync import doctor

    report = doctor.diagnose(_settings())
    click.echo(report.to_json() if as_json else report.text())
    if not report.ok:
        sys.exit(1)


@main.command("simulator")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8800, show_default=True, help="0: any free port.")
@click.option("--token", default="sim-token", show_default=True, help="The API token it accepts.")
@click.option("--sitemap", "sitemaps", multiple=True, help="Create a sitemap of this name.")
@click.option("--notify-url", help="Where finished jobs are notified (the web process's URL).")
def simulator_command(
    host: str, port: int, token: str, sitemaps: tuple[str, ...], notify_url: str | None
) -> None:
    """Serve a local Web Scraper Cloud (API under /api/v1/, control under /_sim/)."""
    from simulator import CloudState, serve

    state = CloudState(api_token=token, notify_url=notify_url)
    for name in sitemaps:
        state.add_sitemap(name)
    server = serve(state, host=host, port=port)
    click.echo(f"simulated Web Scraper Cloud at {server.api_url} (Ctrl-C stops it)")
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        state.close()


@main.command("demo")
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False),
    help="Where the demo keeps its database and exports (default: a new folder under ./var).",
)
@click.option("--records", default=300, show_default=True, help="Records the simulated job has.")
def demo_command(folder: str | None, records: int) -> None:
    """Run the whole flow once on this machine: simulator, web, worker; launch to delivery."""
    from pathlib import Path

    from sync import demo

    result = demo.run_demo(Path(folder) if folder else None, records=records, echo=click.echo)
    if not result.ok:
        raise click.ClickException(result.problem or "the demo did not finish")


@main.command("export")
@click.argument("dataset")
@click.option("--run", "run_id", help="Export this accepted run instead of the published one.")
@click.option(
    "--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True
)
@click.option(
    "--out",
    type=click.Path(),
    help="A folder (versioned file name inside) or a file path (default: SCRAPESYNC_EXPORT_DIR).",
)
def export_command(dataset: str, run_id: str | None, fmt: str, out: str | None) -> None:
    """Write the published run of DATASET (or --run) with its manifest; quarantined rows never."""
    from pathlib import Path

    from sync import export

    services = _services()
    try:
        result = export.export_dataset(
            services, dataset, run_id=run_id, fmt=fmt, out=Path(out) if out else None
        )
    except export.ExportError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"{result.path} run={result.run_id} revision={result.revision} "
        f"records={result.records} sha256={result.sha256}"
    )
    click.echo(f"{result.manifest_path}")
