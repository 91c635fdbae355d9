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
  by the same command (no ``--force``: the job's fingerprint moved); then the next day's job of
  the sitemap (Cloud's clock a day on: the dataset's next daily window, a new run) whose export
  is the first one again, so that a tenth of its entities differ from the published table. That
  is the sync a daily scrape waits for every day after its first: a whole run imported, judged,
  and published against the table of the day before. Its peer is dlt's merge of the changed
  export (dlt has no runs: merging an export into its table is the same work either way).
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
``LAUNCHER`` in ``bench/pipeline_arms.py``). The raw COPY runs in a warm worker process, as in
``bench/sync_bench.py``. The command runs the code of the checkout this file belongs to
(``PYTHONPATH``), so a copy of a commit (``git archive``) measures that commit. A 2,000-record
pass of every arm warms the machine first; within a run the arms take turns going first.

Every load is checked, not only timed: the command's outcome lines (records read, inserted or
updated, the run ``published``), ``datasets.products`` holding N rows whose prices add up to the
export's, the ``dataset.published`` events (one per publication) with a delivery row each, the
change feed naming exactly the changed records, and dlt's table holding N rows with the right
price total. A mismatch fails the run.

    python -m bench.pipeline_bench                    # 10k and 100k, three runs, medians
    python -m bench.pipeline_bench --million          # and 1M (long: dlt alone takes minutes)
    python -m bench.pipeline_bench --records 10000 --runs 1
    python -m bench.pipeline_bench --dlt-file-format csv   # dlt with another loader file format

The benchmark owns its database (default ``scrapesync_pipeline_bench``, created when missing): it
drops every table and the ``datasets`` and dlt schemas, only in a database whose name contains
"bench".
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from sqlalchemy import make_url

from bench.pipeline_arms import ROOT, Bench, Exports, SteppedClock, bench_size
from bench.pipeline_report import Load, report, summarise
from bench.sync_bench import API_TOKEN, BenchError, _is_changed, ensure_database, start_worker
from sync import db

if TYPE_CHECKING:
    from bench.exports import RenderedExport

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/scrapesync_pipeline_bench"
DEFAULT_SIZES = (10_000, 100_000)
MILLION = 1_000_000
DEFAULT_RUNS = 3
WARM_UP_RECORDS = 2_000
DLT_VENV = ROOT / "bench" / ".venv-dlt"


# --- the driver ---------------------------------------------------------------------------------


def price_total(export: RenderedExport) -> Decimal:
    """The sum of the export's prices, as the tables must add them up."""
    from bench.exports import iter_lines

    return sum(
        (Decimal(orjson.loads(line)["price"]) for line in iter_lines(iter(export.chunks)) if line),
        Decimal(0),
    )


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
    parser.add_argument(
        "--cloud-latency",
        type=float,
        default=0.0,
        metavar="MS",
        help="milliseconds the simulated Cloud waits before every answer (default 0: loopback)",
    )
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
    server.exports.latency = args.cloud_latency / 1000
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
        + (
            f" Every answer of the simulated Cloud waited {args.cloud_latency:g} ms."
            if args.cloud_latency
            else ""
        )
    )
    missed = report(summarise(loads), sizes, conditions)
    return 1 if missed and args.enforce else 0


if __name__ == "__main__":
    sys.exit(main())
