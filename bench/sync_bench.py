"""Sync benchmark: records per second, peak RSS and Cloud API calls of the sync task on
PostgreSQL, for a first sync, a repeat of unchanged data and a sync where 10% of records changed.

Cloud is the simulator served on loopback by this (the driver) process, so every record crosses a
real socket as gzip JSON Lines, as in a deployment; in-process ``WSGITransport`` would render the
export on the syncing thread and charge the simulator's work to the sync. Each sync runs once in
a freshly spawned worker process, so its peak RSS (``VmHWM``) belongs to that sync alone and sizes
do not contaminate each other. The driver checks the database itself: rows a sync wrote are
counted by ``xmin`` and by ``last_changed_at``, not only by the counts on the attempt row.

Wall time is what the targets are about; CPU seconds of the worker, of its PostgreSQL backends
and of the simulated Cloud are printed too, because they barely move when other processes share
the machine and wall time does.

The 10% change is Cloud's "Continue" of the same job with a new generation of records: in every
block of 100 records the last 10 are rendered from another seed, so the same SKUs come back with
a different title and price, spread over the whole table. The records stay lazily generated, so
a million-record job costs the simulator a few kilobytes until it is downloaded.

    python -m bench.sync_bench --records 10000 100000 1000000
    python -m bench.sync_bench --quick

The benchmark owns its database and Redis database: it drops and re-migrates every table (only
in a database whose name contains "bench") and flushes the Redis database at start.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import os
import re
import resource
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis import Redis
from sqlalchemy import URL, Engine, MetaData, event, func, make_url, select, text

from config.datasets import parse_datasets
from config.settings import Settings
from sync import bootstrap, db, store
from sync.models import Attempt, Base, Observation, utcnow
from sync.tasks import run_sync

if TYPE_CHECKING:
    from simulator import CloudState

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/scrapesync_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/6"
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000)
API_TOKEN = "bench-token"  # noqa: S105 - the simulator's account, never a real one
BLOCK = 100
CHANGED_PER_BLOCK = 10
CHANGED_SEED = 1

DATASETS_TOML = """
[datasets.products]
sitemap = "products"
entity_key = ["sku"]
window = "daily"
partition = "retailer"
required = ["sku", "price"]
[datasets.products.quality]
parsers = { price = "number" }
"""

# Targets on the reference machine (2 cores): see bench/README.md.
FIRST_SYNC_SIZE = 100_000
FIRST_SYNC_MIN_RATE = 20_000.0
REPEAT_MAX_SHARE = 0.5
RSS_MAX_GROWTH = 1.5


class BenchError(Exception):
    """A sync did not do what the benchmark set it up to do; its numbers mean nothing."""


@dataclass(frozen=True)
class WorkerRun:
    """What one sync in a fresh worker process took: wall time and memory."""

    seconds: float
    worker_cpu: float
    database_cpu: float | None
    rss_before_kib: int
    peak_rss_kib: int
    outcome: str
    records_read: int


@dataclass(frozen=True)
class Row:
    """One line of the result table: one sync of one size."""

    records: int
    phase: str
    seconds: float
    worker_cpu: float
    database_cpu: float | None
    cloud_cpu: float
    rss_before_kib: int
    peak_rss_kib: int
    api_calls: int
    inserted: int
    updated: int
    unchanged: int
    rows_written: int
    changed_at_moved: int

    @property
    def rate(self) -> float:
        """Records per second."""
        return self.records / self.seconds


# --- the worker side: runs in a spawned process, imports only what a worker imports ------------


def _status_kib(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in KiB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise BenchError(f"/proc/self/status has no {field}")


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of a local process, or None when it cannot be read (a
    PostgreSQL server on another machine)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _backends_cpu(pids: set[int]) -> float | None:
    """CPU time of the PostgreSQL backends serving this worker."""
    times = [_cpu_seconds(pid) for pid in pids]
    return None if not times or None in times else sum(t for t in times if t is not None)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sync_in_worker(
    database_url: str, redis_url: str, api_url: str, task_key: str, profile_to: str | None
) -> WorkerRun:
    """Run the sync task once in this fresh process, as an RQ worker would, and measure it."""
    settings = Settings(
        database_url=database_url,
        redis_url=redis_url,
        api_url=api_url,
        api_token=API_TOKEN,
    )
    services = bootstrap.build(settings, datasets=parse_datasets(DATASETS_TOML, source="bench"))
    backends: set[int] = set()

    @event.listens_for(services.uow.engine, "connect")
    def _note_backend(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backends.add(int(cursor.fetchone()[0]))

    with services.uow.begin() as session:  # a long-lived worker already holds a connection
        session.execute(text("SELECT 1"))
    before = _status_kib("VmRSS")
    profiler = cProfile.Profile() if profile_to else None
    database_cpu = _backends_cpu(backends)
    worker_cpu = _own_cpu()
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    result = run_sync(services, task_key)
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - started
    worker_cpu = _own_cpu() - worker_cpu
    after = _backends_cpu(backends)
    database_cpu = after - database_cpu if after is not None and database_cpu is not None else None
    peak = _status_kib("VmHWM")
    if profiler is not None and profile_to:
        profiler.dump_stats(profile_to)
    services.uow.engine.dispose()
    return WorkerRun(
        seconds, worker_cpu, database_cpu, before, peak, result.outcome, result.records_read
    )


# --- the driver side: owns the simulator, the database checks and the table ------------------


@dataclass(frozen=True)
class Bench:
    """What every phase needs: the database, the simulated Cloud and the options."""

    engine: Engine
    uow: db.UnitOfWork
    cloud: CloudState
    database_url: str
    redis_url: str
    api_url: str
    profile_dir: Path | None


def _create_database(server: URL, name: str) -> None:
    """Create the benchmark database on a fresh server (CREATE DATABASE cannot run in a
    transaction, hence autocommit)."""
    engine = db.make_engine(server.render_as_string(hide_password=False))
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
            ).first()
            if exists is None:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        engine.dispose()


def _recreate_schema(url: str) -> None:
    """Drop every table of the bench database and migrate it to head: the code under test may
    have changed the schema since the last run."""
    parsed = make_url(url)
    name = parsed.database or ""
    if "bench" not in name:
        raise BenchError(f"refusing to drop the tables of {name!r}: not a benchmark database")
    _create_database(parsed.set(database="postgres"), name)
    engine = db.make_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        meta.drop_all(engine)
    finally:
        engine.dispose()
    db.upgrade(url)


def _reset_database(engine: Engine) -> None:
    tables = ", ".join(t.name for t in reversed(Base.metadata.sorted_tables))
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


def _mark(engine: Engine) -> tuple[int, datetime]:
    """The current transaction id (as 32-bit xmin values compare) and time: rows written after
    this have a larger xmin and a later last_changed_at."""
    with engine.begin() as conn:
        xid = int(conn.execute(text("SELECT txid_current() % 4294967296")).scalar_one())
    return xid, utcnow()


def _written_since(engine: Engine, mark: tuple[int, datetime]) -> tuple[int, int]:
    """Observations written after ``mark``: by xmin, and by last_changed_at."""
    xid, at = mark
    with engine.begin() as conn:
        by_xmin = conn.execute(
            text("SELECT count(*) FROM observations WHERE xmin::text::bigint > :xid"),
            {"xid": xid},
        ).scalar_one()
        by_time = conn.execute(
            select(func.count()).select_from(Observation).where(Observation.last_changed_at >= at)
        ).scalar_one()
    return int(by_xmin), int(by_time)


def _run_phase(bench: Bench, *, n: int, phase: str, job_id: int) -> Row:
    task_key = store.task_key_for(job_id)
    with bench.uow.begin() as session:
        store.want_sync(session, job_id, now=utcnow())
        session.commit()
    mark = _mark(bench.engine)
    calls = bench.cloud.calls
    cloud_cpu = _own_cpu()  # this process now only serves the simulated Cloud
    profile_to = (
        str(bench.profile_dir / f"sync-{n}-{re.sub(r'[^a-z0-9]+', '-', phase)}.pstats")
        if bench.profile_dir is not None
        else None
    )
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        run = pool.submit(
            sync_in_worker,
            bench.database_url,
            bench.redis_url,
            bench.api_url,
            task_key,
            profile_to,
        ).result()
    calls = bench.cloud.calls - calls
    cloud_cpu = _own_cpu() - cloud_cpu
    if run.outcome != "committed" or run.records_read != n:
        raise BenchError(
            f"{phase} sync of job {job_id} ({n} records): outcome {run.outcome!r}, "
            f"{run.records_read} records read"
        )
    with bench.uow.begin() as session:
        attempt = session.execute(
            select(Attempt.inserted, Attempt.updated, Attempt.unchanged)
            .where(Attempt.task_key == task_key)
            .order_by(Attempt.started_at.desc())
            .limit(1)
        ).one()
    rows_written, moved = _written_since(bench.engine, mark)
    return Row(
        records=n,
        phase=phase,
        seconds=run.seconds,
        worker_cpu=run.worker_cpu,
        database_cpu=run.database_cpu,
        cloud_cpu=cloud_cpu,
        rss_before_kib=run.rss_before_kib,
        peak_rss_kib=run.peak_rss_kib,
        api_calls=calls,
        inserted=attempt.inserted,
        updated=attempt.updated,
        unchanged=attempt.unchanged,
        rows_written=rows_written,
        changed_at_moved=moved,
    )


def _give_changed_generation(cloud: CloudState, job_id: int, n: int) -> int:
    """Continue the job with the same SKUs, the last 10 of every 100 from another seed;
    returns how many records were re-rendered."""
    from simulator import generate_records

    cloud.continue_job(job_id)
    cloud.set_records(job_id, [])
    changed = 0
    for block in range(0, n, BLOCK):
        size = min(BLOCK, n - block)
        same = max(0, size - CHANGED_PER_BLOCK)
        cloud.add_records(job_id, generate_records(same, start=block))
        cloud.add_records(
            job_id, generate_records(size - same, seed=CHANGED_SEED, start=block + same)
        )
        changed += size - same
    cloud.finish_job(job_id)
    return changed


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise BenchError(message)


def bench_size(bench: Bench, sitemap_id: int, n: int) -> list[Row]:
    """First sync, unchanged repeat and 10%-changed sync of one n-record job on empty tables."""
    _reset_database(bench.engine)
    cloud = bench.cloud
    job_id = cloud.create_job(sitemap_id)
    cloud.set_generated(job_id, n)
    cloud.finish_job(job_id)

    first = _run_phase(bench, n=n, phase="first", job_id=job_id)
    _check(
        first.inserted == n and first.updated == 0 and first.rows_written == n,
        f"first sync of {n}: {first}",
    )
    repeat = _run_phase(bench, n=n, phase="repeat, unchanged", job_id=job_id)
    _check(
        repeat.inserted == 0
        and repeat.updated == 0
        and repeat.unchanged == n
        and repeat.rows_written == 0
        and repeat.changed_at_moved == 0,
        f"repeat sync of {n} unchanged records rewrote rows: {repeat}",
    )
    expected = _give_changed_generation(cloud, job_id, n)
    changed = _run_phase(bench, n=n, phase="10% changed", job_id=job_id)
    _check(
        changed.inserted == 0
        and 0.99 * expected <= changed.updated <= expected
        and changed.rows_written == changed.updated
        and changed.changed_at_moved == changed.updated,
        f"sync of {n} records with {expected} changed: {changed}",
    )
    cloud.delete_job(job_id)
    return [first, repeat, changed]


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def table(rows: Sequence[Row]) -> str:
    """The results as a markdown table."""
    lines = [
        "| records | sync | seconds | records/s | CPU s: worker / PostgreSQL / Cloud "
        "| peak RSS MiB | RSS before MiB | API calls "
        "| inserted | updated | unchanged | rows written (xmin) | last_changed_at moved |",
        "|" + " ---: |" + " --- |" + " ---: |" * 11,
    ]
    for r in rows:
        database = "n/a" if r.database_cpu is None else f"{r.database_cpu:.1f}"
        lines.append(
            f"| {r.records:,} | {r.phase} | {r.seconds:.2f} | {r.rate:,.0f} "
            f"| {r.worker_cpu:.1f} / {database} / {r.cloud_cpu:.1f} "
            f"| {_mib(r.peak_rss_kib)} | {_mib(r.rss_before_kib)} | {r.api_calls} "
            f"| {r.inserted:,} | {r.updated:,} | {r.unchanged:,} | {r.rows_written:,} "
            f"| {r.changed_at_moved:,} |"
        )
    return "\n".join(lines)


def verdicts(rows: Sequence[Row]) -> list[tuple[str, bool | None, str]]:
    """Each target, whether it was met (None: not measured at these sizes) and the numbers."""
    out: list[tuple[str, bool | None, str]] = []
    firsts = {r.records: r for r in rows if r.phase == "first"}
    repeats = {r.records: r for r in rows if r.phase.startswith("repeat")}
    target = f"first sync of {FIRST_SYNC_SIZE:,} records >= {FIRST_SYNC_MIN_RATE:,.0f} records/s"
    first = firsts.get(FIRST_SYNC_SIZE)
    if first is None:
        out.append((target, None, "size not run"))
    else:
        out.append((target, first.rate >= FIRST_SYNC_MIN_RATE, f"{first.rate:,.0f} records/s"))
    for n, repeat in repeats.items():
        share = repeat.seconds / firsts[n].seconds
        out.append(
            (
                f"repeat of {n:,} unchanged records <= {REPEAT_MAX_SHARE:.0%} of the first sync's "
                "time, zero rows rewritten",
                share <= REPEAT_MAX_SHARE and repeat.rows_written == 0,
                f"{share:.0%} of the first sync's time, {repeat.rows_written} rows rewritten",
            )
        )
    if len(firsts) > 1:
        low, high = min(firsts), max(firsts)
        peak_low = max(r.peak_rss_kib for r in rows if r.records == low)
        peak_high = max(r.peak_rss_kib for r in rows if r.records == high)
        growth = peak_high / peak_low
        out.append(
            (
                f"peak RSS at {high:,} records <= {RSS_MAX_GROWTH}x that at {low:,}",
                growth <= RSS_MAX_GROWTH,
                f"{_mib(peak_high)} MiB vs {_mib(peak_low)} MiB ({growth:.2f}x)",
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table; 1 when a sync misbehaves (or, with --enforce,
    when a target is missed)."""
    parser = argparse.ArgumentParser(prog="python -m bench.sync_bench", description=__doc__)
    parser.add_argument("--records", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} only")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--profile", type=Path, help="write cProfile stats per sync here")
    parser.add_argument("--enforce", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    sizes = sorted(QUICK_SIZES if args.quick else set(args.records))

    # The simulator (and Flask with it) is imported here, in the driver only, so the spawned
    # workers carry what a real worker carries and their RSS is comparable.
    from simulator import CloudState, serve

    try:
        _recreate_schema(args.database_url)
    except BenchError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    Redis.from_url(args.redis_url).flushdb()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    engine = db.make_engine(args.database_url)
    cloud = CloudState(api_token=API_TOKEN)
    sitemap_id = cloud.add_sitemap("products", start_urls=["https://alpha.example/"])
    rows: list[Row] = []
    load_before = os.getloadavg()[0]
    try:
        with serve(cloud) as server:
            bench = Bench(
                engine=engine,
                uow=db.UnitOfWork(engine),
                cloud=cloud,
                database_url=args.database_url,
                redis_url=args.redis_url,
                api_url=server.api_url,
                profile_dir=args.profile,
            )
            for n in sizes:
                started = time.perf_counter()
                rows.extend(bench_size(bench, sitemap_id, n))
                done = time.perf_counter() - started
                print(f"{n:,} records: three syncs in {done:.0f} s", file=sys.stderr)
    except BenchError as exc:
        print(table(rows), f"\nFAILED: {exc}", sep="\n")
        return 1
    finally:
        cloud.close()
        engine.dispose()
    print(table(rows))
    print(
        f"\nMachine: {os.cpu_count()} cores; 1-minute load average {load_before:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end. Cloud is the simulator on loopback in the driver "
        "process; each sync runs in its own spawned worker process.\n"
    )
    missed = False
    for target, met, numbers in verdicts(rows):
        word = "not measured" if met is None else ("met" if met else "MISSED")
        missed = missed or met is False
        print(f"- {target}: {word} ({numbers})")
    return 1 if missed and args.enforce else 0


if __name__ == "__main__":
    sys.exit(main())
