"""Pipeline benchmark: what a user waits for, from a finished Cloud job to its published,
announced table, beside a raw COPY of the same export (the floor) and dlt (the peer).

For each size the same run measures, on PostgreSQL, with the export served from memory on
loopback by this (the driver) process (``bench/exports.py``; the rest of Cloud is the simulator):

- **raw COPY**: ``bench.sync_bench.copy_in_worker`` in a long-lived spawned worker: download,
  gunzip, parse, COPY ``(sku, jsonb)`` into a fresh table, add its primary key. The floor.
- **scrapesync**: the real ``scrapesync sync JOB_ID`` command, a subprocess of
  ``.venv/bin/scrapesync`` with ``DATABASE_URL``, ``WEBSCRAPER_API_URL``,
  ``WEBSCRAPER_API_TOKEN`` and ``SCRAPESYNC_DATASETS`` set and NO ``REDIS_URL``: the command
  imports the export, then evaluates the run in the same process (acceptance, publication into
  ``datasets.products`` with its history and change feed, the outbox event and its delivery row)
  and prints ``run ...: published (...)``. Once with no ``[columns]`` table (every field a text
  column) and once with every field typed (``price`` numeric), each from a fresh schema; then,
  per arm, Cloud's "Continue" of the job with the last 10 of every 100 records changed, synced
  by the same command (no ``--force``: the job's fingerprint moved).
- **dlt**: ``bench/dlt_load.py`` run by ``bench/.venv-dlt`` (created on first use; dlt is no
  dependency of scrapesync): the same export over HTTP, parsed from JSON Lines, loaded with
  ``write_disposition="merge"`` and primary key ``sku`` (``price`` a decimal), then the
  10%-changed export merged into the same table.

What is timed. A user waits for the work, not for Python to import: start-up is left out of
every figure and printed apart. scrapesync is timed from the ``attempt.started`` log line its
process writes once it has claimed the job's sync task (the line's ``ts``: wall clock, ms) to
the process's exit (``os.wait4`` returning in the small launcher that spawned it: wall clock).
The Cloud calls, the download, the import, the evaluation, the publication and the outbox write
are all inside, and so are the modules the command imports lazily on the way; its start-up (from
spawn to that line: interpreter, imports, wiring, the intake of the wish to sync) is not. dlt is
timed inside its script around ``pipeline.run``, after an untimed 10-record load in the same
process that pays its lazy imports (``bench/dlt_load.py``): if anything, this favours dlt. Peak
RSS of either process is ``ru_maxrss`` from ``os.wait4`` (the whole process, start-up included),
taken by that launcher, a bare interpreter, so that the driver's memory is not counted in (see
``LAUNCHER``). The raw COPY runs in a warm worker process, as in ``bench/sync_bench.py``.

Every load is checked, not only timed: the command's outcome lines (records read, inserted or
updated, the run ``published``), ``datasets.products`` holding N rows whose prices add up to the
export's, the ``dataset.published`` events (one per publication) with a delivery row each, the
change feed naming exactly the changed records, and dlt's table holding N rows with the right
price total. A mismatch fails the run.

    python -m bench.pipeline_bench                    # 10k and 100k, three runs, medians
    python -m bench.pipeline_bench --million          # and 1M (long: dlt alone takes minutes)
    python -m bench.pipeline_bench --records 10000 --runs 1

The benchmark owns its database (default ``scrapesync_pipeline_bench``, created when missing): it
drops every table and the ``datasets`` and dlt schemas, only in a database whose name contains
"bench".
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import Engine, make_url, text

from bench.pipeline_report import (
    ARMS,
    CHANGED,
    COPY,
    DLT,
    FIRST,
    TYPED,
    Load,
    report,
    summarise,
)
from bench.sync_bench import (
    API_TOKEN,
    DATASETS_TOML,
    BenchError,
    _check,
    _is_changed,
    copy_in_worker,
    ensure_database,
    start_worker,
)
from sync import db

if TYPE_CHECKING:
    from bench.exports import ExportServer, RenderedExport
    from simulator import CloudState

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/scrapesync_pipeline_bench"
DEFAULT_SIZES = (10_000, 100_000)
MILLION = 1_000_000
DEFAULT_RUNS = 3
WARM_UP_RECORDS = 2_000
DLT_VENV = ROOT / "bench" / ".venv-dlt"
DLT_SCRIPT = ROOT / "bench" / "dlt_load.py"
DLT_DATASET = "dlt_products"
HOOK_SECRET_ENV = "PIPELINE_BENCH_HOOK_SECRET"  # noqa: S105 - a variable's name, no secret
CONTINUE_SECONDS = 60  # how long the simulated "Continue" runs on Cloud's clock

DESTINATION_TOML = f"""
[[datasets.products.destinations]]
url = "http://127.0.0.1:9/hooks/scrapesync"
secret_env = "{HOOK_SECRET_ENV}"
"""
COLUMNS_TOML = """
[datasets.products.columns]
sku = "text"
title = "text"
description = "text"
price = "numeric"
retailer = "text"
url = "text"
image_url = "text"
"""


@dataclass
class Bench:
    """What every arm needs: the database, the simulated Cloud, the paths and the options."""

    engine: Engine
    database_url: str
    cloud: CloudState
    clock: SteppedClock
    server: ExportServer
    workdir: Path
    dlt_python: Path
    dlt_file_format: str | None
    pool: ProcessPoolExecutor
    sitemap_id: int = 0
    dlt_runs: int = 0
    dlt_version: str = "?"


@dataclass(frozen=True)
class Exports:
    """One size's two exports, rendered before any timing, with the price totals they hold."""

    first: RenderedExport
    changed: RenderedExport
    first_total: Decimal
    changed_total: Decimal

    @property
    def phases(self) -> tuple[tuple[str, RenderedExport, Decimal], ...]:
        """(phase, export, price total) of the first load and of the 10%-changed one."""
        return ((FIRST, self.first, self.first_total), (CHANGED, self.changed, self.changed_total))


class SteppedClock:
    """Cloud's clock: the wall clock, moved forward on demand (a job that ran a while)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        """Now, on Cloud's clock."""
        return time.time() + self.offset


# --- the database -------------------------------------------------------------------------------


def reset_all(bench: Bench) -> None:
    """A fresh schema for an arm: drop the data and dlt schemas and every table, migrate again,
    checkpoint."""
    from bench.datasets_bench import reset

    drop_dlt(bench.engine)
    reset(bench.database_url)


def drop_dlt(engine: Engine) -> None:
    """Drop the dlt schemas (dataset, staging, warm-up) and checkpoint."""
    names = [f"{DLT_DATASET}{s}" for s in ("", "_staging", "_warm", "_warm_staging")]
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for name in names:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        conn.exec_driver_sql("CHECKPOINT")


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    """One value of a query."""
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def price_total(export: RenderedExport) -> Decimal:
    """The sum of the export's prices, as the tables must add them up."""
    from bench.exports import iter_lines

    return sum(
        (Decimal(orjson.loads(line)["price"]) for line in iter_lines(iter(export.chunks)) if line),
        Decimal(0),
    )


# --- the arms -----------------------------------------------------------------------------------


def new_job(bench: Bench, export: RenderedExport) -> int:
    """A finished Cloud job whose download is ``export``."""
    job_id = bench.cloud.create_job(bench.sitemap_id)
    bench.cloud.set_generated(job_id, export.records)  # the counters; the body is the export
    bench.cloud.finish_job(job_id)
    bench.server.exports.set(job_id, export)
    return job_id


def continue_job(bench: Bench, job_id: int, export: RenderedExport) -> None:
    """Cloud's "Continue": the job runs again for a while and its download becomes ``export``."""
    bench.cloud.continue_job(job_id)
    bench.cloud.start_job(job_id)
    bench.clock.offset += CONTINUE_SECONDS
    bench.cloud.finish_job(job_id)
    bench.server.exports.set(job_id, export)


@dataclass(frozen=True)
class Process:
    """A finished subprocess: when it was spawned and ended (wall clock), its output, rusage."""

    spawned: float
    ended: float
    returncode: int
    stdout: str
    stderr: str
    peak_rss_kib: int


# A small launcher between this process and the one measured. A child's ru_maxrss keeps the
# high-water mark of the memory it was forked from (Linux carries it across exec), so a command
# spawned straight from this driver, which holds the rendered exports, would report at least the
# driver's peak. Spawned from a bare interpreter (-S: no site, about 9 MiB), its figure is its own.
# The launcher also takes the spawn and exit times, right beside the child.
LAUNCHER = """
import json, os, sys, time
spawned = time.time()
pid = os.posix_spawn(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
ended = time.time()
with open(sys.argv[1], "w") as out:
    json.dump([spawned, ended, os.waitstatus_to_exitcode(status), usage.ru_maxrss], out)
"""


def run_process(bench: Bench, argv: Sequence[str], env: dict[str, str]) -> Process:
    """Run a command to its end through the launcher; its output goes to files, so nothing
    blocks on a pipe."""
    out_path, err_path = bench.workdir / "stdout", bench.workdir / "stderr"
    measured = bench.workdir / "measured.json"
    measured.unlink(missing_ok=True)
    with out_path.open("wb") as out, err_path.open("wb") as err:
        subprocess.run(
            [sys.executable, "-S", "-c", LAUNCHER, str(measured), *argv],
            env=env,
            cwd=bench.workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            check=True,
        )
    spawned, ended, returncode, peak = json.loads(measured.read_text())
    return Process(spawned, ended, returncode, out_path.read_text(), err_path.read_text(), peak)


def scrapesync_env(bench: Bench, datasets_file: Path) -> dict[str, str]:
    """The command's environment: no Redis, so it evaluates and publishes in the foreground."""
    env = {
        k: v for k, v in os.environ.items() if k != "REDIS_URL" and not k.startswith("SCRAPESYNC_")
    }
    env.update(
        DATABASE_URL=bench.database_url,
        WEBSCRAPER_API_URL=bench.server.api_url,
        WEBSCRAPER_API_TOKEN=API_TOKEN,
        SCRAPESYNC_DATASETS=str(datasets_file),
        # the code of this benchmark's checkout, wherever the virtual environment points
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **{HOOK_SECRET_ENV: "bench-hook-secret"},
    )
    return env


def sync_command(bench: Bench, job_id: int, env: dict[str, str], what: str) -> tuple[Load, str]:
    """``scrapesync sync JOB_ID`` timed from its ``attempt.started`` line to its exit."""
    scrapesync = Path(sys.prefix) / "bin" / "scrapesync"
    done = run_process(bench, [str(scrapesync), "sync", str(job_id)], env)
    if done.returncode != 0:
        raise BenchError(f"{what}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr}")
    at = log_times(done.stdout)
    if "attempt.started" not in at:
        raise BenchError(f"{what}: no attempt.started log line in\n{done.stdout[-2000:]}")
    started = at["attempt.started"]
    committed, evaluated = at.get("attempt.committed"), at.get("run.evaluated")
    load = Load(
        0,
        "",
        "",
        done.ended - started,
        startup=started - done.spawned,
        peak_rss_kib=done.peak_rss_kib,
        importing=None if committed is None else committed - started,
        evaluating=None if committed is None or evaluated is None else evaluated - committed,
    )
    return load, done.stdout


def log_times(stdout: str) -> dict[str, float]:
    """When each event of the command's JSON log lines was written (the first of each name)."""
    at: dict[str, float] = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            at.setdefault(entry.get("event", ""), datetime.fromisoformat(entry["ts"]).timestamp())
    return at


def outcome(stdout: str, what: str) -> tuple[str, dict[str, int]]:
    """The run id and counts of the command's summary line; the run must be published."""
    counts: dict[str, int] = {}
    run_id, state = "", ""
    for line in stdout.splitlines():
        if " run=" in line and " read=" in line:
            for part in line.split():
                key, _, value = part.partition("=")
                if value.isdigit():
                    counts[key] = int(value)
        elif line.startswith("run "):
            run_id, _, rest = line[4:].partition(": ")
            state = rest.split(" ")[0]
    _check(state == "published", f"{what}: run {run_id!r} is {state!r}, not published")
    return run_id, counts


def check_published(
    bench: Bench, *, n: int, run_id: str, typed: bool, total: Decimal, events: int, what: str
) -> None:
    """The typed table holds the export; the publications are announced, each to its destination."""
    price = "price" if typed else "price::numeric"
    with bench.engine.connect() as conn:
        sql = f"SELECT count(*), sum({price}) FROM datasets.products"  # noqa: S608 - constant
        rows, got = conn.execute(text(sql)).one()
    _check(rows == n and got == total, f"{what}: {rows} rows, prices {got}; want {n}, {total}")
    kind = scalar(
        bench.engine,
        "SELECT data_type FROM information_schema.columns WHERE table_schema = 'datasets' "
        "AND table_name = 'products' AND column_name = 'price'",
    )
    _check(kind == ("numeric" if typed else "text"), f"{what}: price is a {kind} column")
    announced = scalar(
        bench.engine,
        "SELECT count(DISTINCT o.event_id) FROM outbox o JOIN deliveries d USING (event_id) "
        "WHERE o.run_id = :run AND o.event_type = 'dataset.published'",
        run=run_id,
    )
    _check(announced == events, f"{what}: {announced} announced publications, want {events}")


def scrapesync_arm(bench: Bench, n: int, arm: str, exports: Exports) -> list[Load]:
    """First sync and the 10%-changed "Continue", each by the command, from a fresh schema."""
    typed = arm == TYPED
    datasets_file = bench.workdir / ("typed.toml" if typed else "text.toml")
    datasets_file.write_text(DATASETS_TOML + DESTINATION_TOML + (COLUMNS_TOML if typed else ""))
    env = scrapesync_env(bench, datasets_file)
    reset_all(bench)
    job_id = new_job(bench, exports.first)
    expected = sum(1 for i in range(n) if _is_changed(i))
    loads: list[Load] = []
    run_id = ""
    for publications, (phase, export, total) in enumerate(exports.phases, start=1):
        what = f"{arm}, {phase} sync of {n:,}"
        if phase == CHANGED:
            continue_job(bench, job_id, export)
        load, stdout = sync_command(bench, job_id, env, what)
        synced, counts = outcome(stdout, what)
        run_id = run_id or synced
        _check(synced == run_id, f"{what}: run {synced}, want {run_id}")
        inserted, updated = (n, 0) if phase == FIRST else (0, expected)
        _check(
            (counts.get("read"), counts.get("inserted"), counts.get("updated"))
            == (n, inserted, updated),
            f"{what}: {counts}, want read={n} inserted={inserted} updated={updated}",
        )
        check_published(
            bench, n=n, run_id=run_id, typed=typed, total=total, events=publications, what=what
        )
        loads.append(_as(load, n, arm, phase))
    fed = scalar(
        bench.engine,
        "SELECT count(DISTINCT entity_key) FROM datasets.products_changes WHERE run_id = :run "
        "AND kind = 'changed' AND revision = (SELECT revision FROM runs WHERE run_id = :run)",
        run=run_id,
    )
    _check(fed == expected, f"{arm}, {CHANGED} of {n:,}: change feed names {fed}, want {expected}")
    bench.server.exports.set(job_id, None)
    bench.cloud.delete_job(job_id)
    return loads


def _as(load: Load, n: int, arm: str, phase: str) -> Load:
    return replace(load, records=n, arm=arm, phase=phase)


def dlt_load(bench: Bench, job_id: int, pipelines_dir: Path, what: str) -> tuple[Load, Any]:
    """One run of ``bench/dlt_load.py`` by dlt's own python, timed inside around
    ``pipeline.run``."""
    url = make_url(bench.database_url)
    # dlt insists on a password; the benchmark's PostgreSQL trusts loopback and ignores it
    url = url.set(drivername="postgresql", password=url.password or "unused")
    argv = [
        str(bench.dlt_python),
        str(DLT_SCRIPT),
        f"--export-url={bench.server.api_url}scraping-job/{job_id}/json?api_token={API_TOKEN}",
        f"--database-url={url.render_as_string(hide_password=False)}",
        f"--pipelines-dir={pipelines_dir}",
        f"--dataset={DLT_DATASET}",
        *([f"--loader-file-format={bench.dlt_file_format}"] if bench.dlt_file_format else []),
    ]
    env = dict(
        os.environ,
        RUNTIME__DLTHUB_TELEMETRY="false",  # no phoning home from a benchmark
        DLT_DATA_DIR=str(pipelines_dir),
    )
    done = run_process(bench, argv, env)
    if done.returncode != 0:
        raise BenchError(f"{what}: exit {done.returncode}\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    startup = result["started_at"] - done.spawned
    return Load(0, DLT, "", result["seconds"], startup, done.peak_rss_kib), result


def dlt_arm(bench: Bench, n: int, exports: Exports) -> list[Load]:
    """dlt's first merge load of the export, then its merge of the 10%-changed export."""
    drop_dlt(bench.engine)
    pipelines_dir = bench.workdir / f"dlt-{bench.dlt_runs}"  # dlt's local state, new per arm
    bench.dlt_runs += 1
    job_id = new_job(bench, exports.first)
    loads = []
    for phase, export, total in exports.phases:
        bench.server.exports.set(job_id, export)
        what = f"dlt, {phase} load of {n:,}"
        load, result = dlt_load(bench, job_id, pipelines_dir, what)
        _check(
            result["rows"] == n and Decimal(result["price_sum"]) == total,
            f"{what}: {result['rows']} rows, prices {result['price_sum']}; want {n}, {total}",
        )
        _check(result["price_type"] == "numeric", f"{what}: price is {result['price_type']}")
        bench.dlt_version = result["dlt"]
        loads.append(_as(load, n, DLT, phase))
    bench.server.exports.set(job_id, None)
    bench.cloud.delete_job(job_id)
    return loads


def copy_arm(bench: Bench, n: int, exports: Exports) -> list[Load]:
    """The floor, in the long-lived spawned worker (start-up outside, as in the sync benchmark)."""
    drop_dlt(bench.engine)  # the same checkpointed start as the other arms
    job_id = new_job(bench, exports.first)
    url = f"{bench.server.api_url}scraping-job/{job_id}/json?api_token={API_TOKEN}"
    floor = bench.pool.submit(copy_in_worker, url, None).result()
    _check(floor.records_read == n, f"raw COPY read {floor.records_read} of {n}")
    with bench.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE copy_floor")
    bench.server.exports.set(job_id, None)
    bench.cloud.delete_job(job_id)
    return [Load(n, COPY, FIRST, floor.seconds)]


def bench_size(bench: Bench, n: int, run: int, exports: Exports) -> list[Load]:
    """Every arm once for one size; the arms' order turns with the run, so that a slower stretch
    of a shared machine falls on each arm in turn."""
    order = ARMS[run % len(ARMS) :] + ARMS[: run % len(ARMS)]
    loads: list[Load] = []
    for arm in order:
        if arm == COPY:
            loads += copy_arm(bench, n, exports)
        elif arm == DLT:
            loads += dlt_arm(bench, n, exports)
        else:
            loads += scrapesync_arm(bench, n, arm, exports)
    return loads


# --- the driver ---------------------------------------------------------------------------------


def ensure_dlt(venv: Path) -> Path:
    """dlt's own virtual environment, made on first use: dlt is no dependency of scrapesync."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} for dlt (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = subprocess.run([str(python), "-c", "import dlt, psycopg2"], capture_output=True)
    if probe.returncode != 0:
        print('installing "dlt[postgres]" into it', file=sys.stderr)
        install = [str(python), "-m", "pip", "install", "--quiet", "dlt[postgres]"]
        subprocess.run(install, check=True)
    return python


def code_state() -> str:
    """The commit measured, and whether the working tree had changes beside it."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    commit = head.stdout.strip() or f"{ROOT} (not a git checkout)"
    return f"{commit} with uncommitted changes" if dirty.stdout.strip() else commit


def render_exports(n: int) -> Exports:
    """The export of n records and its 10%-changed "Continue", rendered before any timing."""
    from bench.exports import render

    first, changed = render(n), render(n, changed=_is_changed)
    return Exports(first, changed, price_total(first), price_total(changed))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline_bench", description=__doc__)
    parser.add_argument("--records", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--million", action="store_true", help="add a 1,000,000-record export")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs per size (median)")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--dlt-venv", type=Path, default=DLT_VENV, help="made when missing")
    parser.add_argument("--dlt-file-format", help="dlt's loader_file_format (default: dlt's)")
    parser.add_argument("--enforce", action="store_true", help="exit 1 when a target is missed")
    return parser.parse_args(argv)


def run_all(bench: Bench, sizes: Sequence[int], runs: int) -> tuple[list[Load], list[float]]:
    """A warm-up of every arm, then each size's runs; the load averages seen on the way."""
    bench_size(bench, WARM_UP_RECORDS, 0, render_exports(WARM_UP_RECORDS))
    loads: list[Load] = []
    seen = [os.getloadavg()[0]]
    for n in sizes:
        exports = render_exports(n)
        for run in range(runs):
            started = time.perf_counter()
            loads += bench_size(bench, n, run, exports)
            seen.append(os.getloadavg()[0])
            print(
                f"{n:,} records, run {run + 1}: {time.perf_counter() - started:.0f} s, "
                f"load {seen[-1]:.1f}",
                file=sys.stderr,
            )
        del exports
    return loads, seen


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a table per size; 1 when a load misbehaves (or, with
    --enforce, when a target is missed)."""
    args = parse_args(argv)
    sizes = sorted(set(args.records) | ({MILLION} if args.million else set()))
    name = make_url(args.database_url).database or ""
    if "bench" not in name:
        print(f"refusing to use {name!r}: not a benchmark database (no 'bench')", file=sys.stderr)
        return 1
    code = code_state()
    dlt_python = ensure_dlt(args.dlt_venv)
    ensure_database(args.database_url)

    # The simulator (and Flask with it) is imported here, in the driver only.
    from bench.exports import ExportServer, MemoryExports
    from simulator import CloudState
    from simulator.app import API_PREFIX, create_app

    clock = SteppedClock()
    cloud = CloudState(api_token=API_TOKEN, rate_limit=1_000_000, clock=clock)
    server = ExportServer(MemoryExports(create_app(cloud), API_PREFIX, lambda: None), API_PREFIX)
    engine = db.make_engine(args.database_url)
    spawn = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory(prefix="pipeline-bench-") as workdir,
        ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool,
    ):
        pool.submit(start_worker, args.database_url, "", server.api_url).result()  # no Redis
        bench = Bench(
            engine=engine,
            database_url=args.database_url,
            cloud=cloud,
            clock=clock,
            server=server,
            workdir=Path(workdir),
            dlt_python=dlt_python,
            dlt_file_format=args.dlt_file_format,
            pool=pool,
        )
        bench.sitemap_id = cloud.add_sitemap("products", start_urls=["https://alpha.example/"])
        try:
            loads, seen = run_all(bench, sizes, args.runs)
        except BenchError as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            server.close()
            cloud.close()
            engine.dispose()
    conditions = (
        f"Code: {code}. Medians of {args.runs} run(s). Machine: {os.cpu_count()} cores; "
        f"1-minute load average {min(seen):.1f} to {max(seen):.1f} during the run. "
        f"dlt {bench.dlt_version} "
        f"({args.dlt_file_format or 'its default file format'}). scrapesync: the `scrapesync "
        "sync` process from its attempt.started log line to its exit; dlt: `pipeline.run` in "
        "its process; raw COPY: in a warm worker process. Start-up is shown apart, in no figure."
    )
    missed = report(summarise(loads), sizes, conditions)
    return 1 if missed and args.enforce else 0


if __name__ == "__main__":
    sys.exit(main())
