"""The arms of ``bench/pipeline_bench.py``: the raw COPY, the ``scrapesync sync`` command and
dlt, each loading one size's export and its 10%-changed "Continue", each checked, not only timed.

How each is timed, and why so, is told in ``bench/pipeline_bench.py``'s docstring; the launcher
that spawns the measured processes is described at ``LAUNCHER``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, make_url, text

from bench.pipeline_report import ARMS, CHANGED, COPY, DLT, FIRST, NEXT, TYPED, Load
from bench.sync_bench import (
    API_TOKEN,
    DATASETS_TOML,
    BenchError,
    _check,
    _is_changed,
    copy_in_worker,
)

if TYPE_CHECKING:
    from bench.exports import ExportServer, RenderedExport
    from simulator import CloudState

ROOT = Path(__file__).resolve().parent.parent
DLT_SCRIPT = ROOT / "bench" / "dlt_load.py"
DLT_DATASET = "dlt_products"
HOOK_SECRET_ENV = "PIPELINE_BENCH_HOOK_SECRET"  # noqa: S105 - a variable's name, no secret
CONTINUE_SECONDS = 60  # how long the simulated "Continue" runs on Cloud's clock
DAY_SECONDS = 86_400  # the next day's job: the dataset's next daily window, so a new run

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
    at = log_times(done.stderr)  # the command's log lines go to stderr, its results to stdout
    if "attempt.started" not in at:
        raise BenchError(f"{what}: no attempt.started log line in\n{done.stderr[-2000:]}")
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


def log_times(log: str) -> dict[str, float]:
    """When each event of the command's JSON log lines was written (the first of each name)."""
    at: dict[str, float] = {}
    for line in log.splitlines():
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
    _check_fed(bench, run_id, expected, f"{arm}, {CHANGED} of {n:,}")
    bench.server.exports.set(job_id, None)
    bench.cloud.delete_job(job_id)
    loads.append(_next_day(bench, n, arm, exports, env))
    return loads


def _next_day(bench: Bench, n: int, arm: str, exports: Exports, env: dict[str, str]) -> Load:
    """The next day's job of the sitemap, a new run of the dataset, whose export is the first
    one again: a tenth of its entities differ from the table the "Continue" left. Its
    publication is measured against that table, as every daily sync after the first is."""
    what = f"{arm}, {NEXT} of {n:,}"
    bench.clock.offset += DAY_SECONDS
    job_id = new_job(bench, exports.first)
    load, stdout = sync_command(bench, job_id, env, what)
    run_id, counts = outcome(stdout, what)
    _check(
        (counts.get("read"), counts.get("inserted"), counts.get("updated")) == (n, n, 0),
        f"{what}: {counts}, want read={n} inserted={n} updated=0",
    )
    check_published(
        bench,
        n=n,
        run_id=run_id,
        typed=arm == TYPED,
        total=exports.first_total,
        events=1,
        what=what,
    )
    current = scalar(
        bench.engine, "SELECT run_id FROM publications WHERE dataset = 'products' AND is_current"
    )
    _check(current == run_id, f"{what}: the published run is {current}, not {run_id}")
    _check_fed(bench, run_id, sum(1 for i in range(n) if _is_changed(i)), what)
    bench.server.exports.set(job_id, None)
    bench.cloud.delete_job(job_id)
    return _as(load, n, arm, NEXT)


def _check_fed(bench: Bench, run_id: str, expected: int, what: str) -> None:
    """The change feed of the run's publication names exactly the ``expected`` changed
    entities."""
    fed = scalar(
        bench.engine,
        "SELECT count(DISTINCT entity_key) FROM datasets.products_changes WHERE run_id = :run "
        "AND kind = 'changed' AND revision = (SELECT revision FROM runs WHERE run_id = :run)",
        run=run_id,
    )
    _check(fed == expected, f"{what}: change feed names {fed}, want {expected}")


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
