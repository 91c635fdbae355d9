"""The operator's commands, one function each; ``scrapesync.cli`` puts them in one group."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from config.settings import ConfigError, Settings
from scrapesync import decisions
from scrapesync.deliveries import deliveries_group
from scrapesync.schema import db_group
from scrapesync.terminal import CommandError, Progress, echo, echo_json
from sync import logs
from sync.bootstrap import Services
from sync.cloud.client import CloudClient
from sync.states import AttemptOutcome, ClaimOutcome, LaunchState, RunState, TaskState

if TYPE_CHECKING:
    from sync.runs.check import Rejudgement


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


def _services(*, cloud: bool = False) -> Services:
    """The command's services; ``cloud``: it talks to Cloud, so it stops before doing anything
    when WEBSCRAPER_API_TOKEN is missing (naming it), not halfway through."""
    from sync import bootstrap

    services = bootstrap.from_env(role="cli")
    if cloud:
        services.settings.require_api_token()
    return services


@click.command("sync")
@click.argument("job_id", type=int)
@click.option(
    "--force",
    is_flag=True,
    help="Download and merge the job's data even if Cloud reports it unchanged since the last "
    "sync (e.g. after changing the datasets file).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def sync_command(job_id: int, force: bool, as_json: bool) -> None:
    """Synchronise one Cloud scraping job now, in the foreground."""
    from sync import warm
    from sync.ingest import intake, tasks
    from sync.runs import evaluation

    services = _services(cloud=True)
    logs.configure()
    warm.warm()  # this command is the work horse: ready before its attempt starts
    wish = intake.want_sync(services, job_id, queue=False).wish  # this command is the worker
    progress = Progress(enabled=_interactive() and not as_json)
    try:
        result = tasks.run_sync(_with_progress(services, progress), wish.task_key, force=force)
    finally:
        progress.close()
    if result.outcome == ClaimOutcome.NOT_CLAIMED:
        raise CommandError(
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
        if result.invalid:
            line += f" invalid={result.invalid}"
    if result.outcome == AttemptOutcome.UNCHANGED:
        line += (
            f" run={result.run_id}: Cloud reports the job as at its last sync; nothing downloaded "
            "(--force re-imports it)"
        )
    if result.error:
        line += f" ({result.error})"
    if not as_json:
        echo(line)
    verdict = None
    if (
        result.outcome in (AttemptOutcome.COMMITTED, AttemptOutcome.UNCHANGED)
        and result.state == TaskState.COMMITTED
        and result.run_id
    ):
        verdict = evaluation.evaluate_run(services, result.run_id, force=force)
        if not as_json:
            echo(f"run {result.run_id}: {verdict.state} ({verdict.outcome})")
    if as_json:
        from scrapesync.habits import sync_json

        echo_json(sync_json(result, verdict))
    if result.outcome not in (AttemptOutcome.COMMITTED, AttemptOutcome.UNCHANGED):
        sys.exit(1)


# --- operations: launch, reconcile, rerun, status, simulator, demo ------------------------------


def _foreground(services: Services) -> Services:
    """Without Redis there is no worker: syncs the command asks for run here and now."""
    from dataclasses import replace

    from sync.ingest import tasks
    from sync.queue import RecordingDispatcher

    if not isinstance(services.dispatcher, RecordingDispatcher):
        return services

    def run_now(task_key: str) -> None:
        tasks.run_sync(foreground, task_key)

    foreground = replace(services, dispatcher=RecordingDispatcher(on_sync=run_now))
    return foreground


def _interactive() -> bool:
    """Whether a person watches: a terminal gets a progress bar, a pipe one summary line."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def _with_progress(services: Services, progress: Progress) -> Services:
    """The same services, whose Cloud clients report downloads and listings to ``progress``."""
    if not progress.enabled:
        return services
    from dataclasses import replace

    build = services.cloud

    def cloud() -> CloudClient:
        client = build()
        client.progress = progress
        return client

    return replace(services, cloud=cloud)


@click.command("launch")
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
    from sync.runs import launch

    services = _services(cloud=True)
    try:
        outcome = launch.launch(services, dataset, window=window, start_urls=start_urls)
    except launch.LaunchError as exc:
        raise CommandError(str(exc)) from None
    if as_json:
        echo_json(outcome.as_dict())
    else:
        job = f"Cloud job {outcome.job_id}" if outcome.job_id is not None else "no Cloud job yet"
        echo(f"run {outcome.run_id}: {job} ({outcome.said()})")
    if outcome.state != LaunchState.CREATED:
        sys.exit(1)


@click.command("reconcile")
@click.option("--since", default="7d", show_default=True, help="Look back this far: 7d, 12h, 30m.")
@click.option("--dry-run", is_flag=True, help="Only report what a pass would do.")
@click.option(
    "--wait",
    "wait",
    is_flag=True,
    help="When Cloud or the API budget says to wait, wait (up to 15 min) and list again; "
    "without it the pass ends at once, incomplete, and says how long it would have waited.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def reconcile_command(since: str, dry_run: bool, wait: bool, as_json: bool) -> None:
    """Compare Cloud's jobs with ours and heal what notifications, workers and Redis lost
    (exit 3 when Cloud's listing could not be read whole)."""

    from sync.operations import reconcile

    try:
        look_back = reconcile.parse_since(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    interactive = _interactive() and not as_json
    progress = Progress(enabled=interactive)
    services = _foreground(_with_progress(_services(cloud=True), progress))
    try:
        report = reconcile.reconcile(
            services,
            since=look_back,
            dry_run=dry_run,
            max_wait=reconcile.CLI_MAX_WAIT if wait else 0.0,
            on_progress=progress.reporter("checks") if interactive else None,
        )
    finally:
        progress.close()
    if as_json:
        echo_json(report.as_dict())
    else:
        echo(report.summary_line())
        if interactive:
            for wish in report.wanted:
                echo(f"  job {wish.job_id}: {wish.reason}")
            for run_id in report.runs_evaluated:
                echo(f"  run {run_id}: evaluated")
    if not report.complete:
        sys.exit(3)


@click.command("rerun")
@click.argument("run_id")
@click.option("--partition", help="Re-scrape this partition from its observations' start URLs.")
@click.option("--failed-pages", is_flag=True, help="Re-scrape the run's problematic URLs.")
@click.option("--url", "urls", multiple=True, help="Re-scrape this URL (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def rerun_command(
    run_id: str, partition: str | None, failed_pages: bool, urls: tuple[str, ...], as_json: bool
) -> None:
    """Launch a recovery job under RUN_ID for one partition, its failed pages or given URLs."""
    from sync.runs import launch, rerun

    chosen = sum([partition is not None, failed_pages, bool(urls)])
    if chosen != 1:
        raise click.UsageError("choose exactly one of --partition, --failed-pages or --url")
    services = _services(cloud=True)
    try:
        outcome = rerun.rerun(
            services, run_id, partition=partition, failed_pages=failed_pages, urls=urls
        )
    except (rerun.RerunError, launch.LaunchError) as exc:
        raise CommandError(str(exc)) from None
    if as_json:
        echo_json(outcome.as_dict())
    else:
        job = f"Cloud job {outcome.job_id}" if outcome.job_id is not None else "no Cloud job yet"
        echo(
            f"run {outcome.run_id}: recovery batch {outcome.batch_id} with "
            f"{len(outcome.start_urls)} start URLs: {job} ({outcome.said()})"
        )
    if outcome.state != LaunchState.CREATED:
        sys.exit(1)


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the overview as JSON.")
@click.option("--limit", default=20, show_default=True, help="How many recent runs to show.")
@click.argument("run_id", required=False)
@click.option("--dataset", help="Only this dataset's runs, publication and tasks.")
def status_command(as_json: bool, limit: int, run_id: str | None, dataset: str | None) -> None:
    """Runs, coverage and verdicts; tasks, outbox backlog, last reconcile, API budget (RUN_ID:
    that run in detail, with the diagnosis of a rejection)."""
    if run_id is not None:
        return decisions.show_run(run_id, as_json)
    from sync.operations import status, status_text

    values = status.overview(_services(), limit=limit, dataset=dataset)
    if as_json:
        echo_json(values)
    else:
        echo(status_text.format_table(values))


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor_command(as_json: bool) -> None:
    """Check variables, database, Redis, the Cloud token and each dataset against its sitemap."""
    from sync.operations import doctor

    report = doctor.diagnose(_settings())
    echo(report.to_json() if as_json else report.text())
    if not report.ok:
        sys.exit(1)


@click.command("check")
@click.argument("run_id")
@click.option(
    "--datasets",
    "datasets_path",
    type=click.Path(dir_okay=False),
    help="Judge under this datasets file instead of the deployment's (SCRAPESYNC_DATASETS).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict and every check as JSON.")
def check_command(run_id: str, datasets_path: str | None, as_json: bool) -> None:
    """Judge RUN_ID again and print every rule's verdict; changes nothing (exit 0: accepted,
    1: not accepted or no such run, 2: the datasets file or the database cannot be used)."""
    from pathlib import Path

    from config.datasets import load_datasets
    from sync.runs import check

    services = _services()
    datasets = load_datasets(Path(datasets_path)) if datasets_path else services.datasets
    result = check.rejudge(services, run_id, datasets)
    if result is None:
        raise CommandError(f"no run {run_id!r} in the database")
    if as_json:
        echo_json({"datasets_file": datasets_path, **result.as_dict()})
    else:
        source = datasets_path or str(services.settings.datasets_path)
        echo(_check_report(result, source))
    if result.state != RunState.ACCEPTED:
        sys.exit(1)


def _check_report(result: Rejudgement, source: str) -> str:
    """A re-judgement as the lines ``scrapesync check`` prints."""
    verbs: dict[str, str] = {
        RunState.ACCEPTED: "would be accepted",
        RunState.REJECTED: "would be rejected",
    }
    verb = verbs.get(result.state, f"would stay {result.state}")
    lines = [f"run {result.run_id} (now {result.current_state}) under {source}: {verb}"]
    lines.append(result.baseline_line())
    rows = [("RULE", "SUBJECT", "VERDICT", "GOT", "BASELINE", "ALLOWED")]
    for check in result.checks:
        rows.append(
            (
                check["rule"],
                check["subject"] or "-",
                check["verdict"],
                "-" if check["got"] is None else str(check["got"]),
                "-" if check["baseline"] is None else str(check["baseline"]),
                check["allowed"],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    if result.reasons:
        lines.append("reasons:")
        lines += [f"  - {r['code']}: {r['message']}" for r in result.reasons]
    from sync.operations.run_detail import diagnosis_lines

    return "\n".join(lines + diagnosis_lines(result.diagnosis))


@click.command("simulator")
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
    echo(f"simulated Web Scraper Cloud at {server.api_url} (Ctrl-C stops it)")
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        state.close()


@click.command("demo")
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

    from scrapesync import demo

    result = demo.run_demo(Path(folder) if folder else None, records=records, echo=echo)
    if not result.ok:
        raise CommandError(result.problem or "the demo did not finish")


@click.command("export")
@click.argument("dataset")
@click.option("--run", "run_id", help="Export this accepted run instead of the published one.")
@click.option(
    "--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True
)
@click.option(
    "--out",
    type=click.Path(),
    help="A folder (versioned file name inside), a file path, or - for standard output "
    "(default: SCRAPESYNC_EXPORT_DIR).",
)
@click.option("--json", "as_json", is_flag=True, help="Print where the export went as JSON.")
def export_command(
    dataset: str, run_id: str | None, fmt: str, out: str | None, as_json: bool
) -> None:
    """Write the published run of DATASET (or --run) with its manifest; quarantined rows never."""
    from pathlib import Path

    from scrapesync import habits
    from sync.datasets import export

    to_stdout = out == habits.STDOUT
    if to_stdout and as_json:
        raise click.UsageError("--out - writes the records to standard output: drop --json")
    services = _services()
    progress = Progress(enabled=_interactive() and not to_stdout and not as_json)

    def write(folder: Path | None) -> export.ExportResult:
        return export.export_dataset(
            services,
            dataset,
            run_id=run_id,
            fmt=fmt,
            out=folder,
            on_progress=progress.reporter("export") if progress.enabled else None,
        )

    try:
        chosen = Path(out) if out and not to_stdout else None
        result = habits.export_to_stdout(write) if to_stdout else write(chosen)
    except export.ExportError as exc:
        raise CommandError(str(exc)) from None
    finally:
        progress.close()
    if to_stdout:
        echo(f"run={result.run_id} revision={result.revision} records={result.records}", err=True)
        return
    if as_json:
        echo_json(habits.export_json(result))
        return
    echo(
        f"{result.path} run={result.run_id} revision={result.revision} "
        f"records={result.records} sha256={result.sha256}"
    )
    echo(f"{result.manifest_path}")


@click.command("diff")
@click.argument("dataset")
@click.option(
    "--from", "from_run", help="The earlier run (default: the one published before --to)."
)
@click.option("--to", "to_run", help="The later run (default: the one published last).")
@click.option("--json", "as_json", is_flag=True, help="Print the change set as one JSON object.")
@click.option(
    "--limit", default=20, show_default=True, help="Entries of each kind listed (not with --json)."
)
def diff_command(
    dataset: str, from_run: str | None, to_run: str | None, as_json: bool, limit: int
) -> None:
    """What changed in DATASET between two published runs: entities added, removed, changed."""
    from sync.datasets import diff

    try:
        result = diff.diff(_services(), dataset, from_run=from_run, to_run=to_run)
    except diff.DiffError as exc:
        raise CommandError(str(exc)) from None
    if as_json:
        echo_json(result.changes.as_dict())
    else:
        echo(diff.report(result, limit=limit))


ALL = (
    db_group,
    sync_command,
    launch_command,
    reconcile_command,
    rerun_command,
    status_command,
    doctor_command,
    check_command,
    simulator_command,
    demo_command,
    export_command,
    diff_command,
    deliveries_group,
    *decisions.ALL,
)
