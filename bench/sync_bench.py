"""Sync benchmark: the sync task against a raw COPY of the same export, on PostgreSQL.

For each size the same run measures, side by side:

- **raw COPY**: download the gzip JSON Lines export, parse every line in Python, COPY
  ``(sku, jsonb)`` into a fresh table and add its primary key, in one transaction. That is the
  floor: what loading the export costs with no identity, no change detection, no lease.
- **first**: ``run_sync`` of a finished job into empty tables.
- **repeat, unchanged**: the same job synced again with its download forced (a new generation
  of the task); nothing may be written.
- **10% changed**: Cloud's "Continue" of the job with the last 10 of every 100 records changed
  (same SKUs, other title, description and price).

Records are realistic (about 500 bytes each, see ``bench/exports.py``) and each export is
rendered once and served from memory by this (the driver) process on loopback, so only the
importer is timed. The syncs of one size run in ONE long-lived spawned worker process, wired as a
worker is and warmed by a small sync first; a sync is timed from the claim (just before the
download starts) until its transaction has committed. Peak RSS is the worker's ``VmHWM``, reset
before each sync. Every sync is checked, not only timed: outcome, records read, the attempt's
counts, and the database itself (rows whose ``xmin`` is newer than the sync, rows whose
``last_changed_at`` moved).

    python -m bench.sync_bench                       # 10k and 100k, three runs, medians
    python -m bench.sync_bench --million             # and 1M
    python -m bench.sync_bench --records 10000 --runs 1
    python -m bench.sync_bench --records 100000 --earlier-windows 9   # a table with history

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
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis import Redis
from sqlalchemy import Engine, MetaData, event, func, make_url, select, text

from config.datasets import parse_datasets
from config.settings import Settings
from sync import bootstrap, db
from sync.bootstrap import Services
from sync.ingest import store
from sync.ingest.tasks import run_sync
from sync.models import Attempt, Base, Observation, utcnow

if TYPE_CHECKING:
    from bench.exports import ExportServer, RenderedExport
    from simulator import CloudState

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/scrapesync_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/6"
DEFAULT_SIZES = (10_000, 100_000)
MILLION = 1_000_000
DEFAULT_RUNS = 3
WARM_UP_RECORDS = 2_000
API_TOKEN = "bench-token"  # noqa: S105 - the simulator's account, never a real one
BLOCK = 100
CHANGED_PER_BLOCK = 10

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
TARGET_SIZE = 100_000
FIRST_MIN_VS_COPY = 0.35
REPEAT_MAX_SHARE = 0.3
CHANGED_MAX_SHARE = 0.4
RSS_MAX_GROWTH = 1.5

FIRST, REPEAT, CHANGED, COPY = "first", "repeat, unchanged", "10% changed", "raw COPY"
PHASES = (COPY, FIRST, REPEAT, CHANGED)


class BenchError(Exception):
    """A sync did not do what the benchmark set it up to do; its numbers mean nothing."""


@dataclass(frozen=True)
class WorkerRun:
    """What one timed load in the worker process took: wall time, CPU and memory."""

    seconds: float
    worker_cpu: float
    database_cpu: float | None
    rss_before_kib: int
    peak_rss_kib: int
    outcome: str
    records_read: int


@dataclass(frozen=True)
class Row:
    """One timed load of one size in one run."""

    records: int
    phase: str
    run: WorkerRun
    api_calls: int = 0
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    rows_written: int = 0
    changed_at_moved: int = 0


# --- the worker side: runs in a spawned process, imports only what a worker imports ------------


def _status_kib(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in KiB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise BenchError(f"/proc/self/status has no {field}")


def _reset_peak_rss() -> None:
    """Start a new peak: VmHWM drops to the current RSS (Linux 4.0 and later)."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
        refs.write("5")


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


@dataclass
class _Worker:
    services: Services
    backends: set[int]


_worker: _Worker | None = None


def start_worker(database_url: str, redis_url: str, api_url: str) -> int:
    """Wire this spawned process as a worker is wired and open its database connection."""
    global _worker
    settings = Settings(
        database_url=database_url, redis_url=redis_url, api_url=api_url, api_token=API_TOKEN
    )
    services = bootstrap.build(settings, datasets=parse_datasets(DATASETS_TOML, source="bench"))
    backends: set[int] = set()

    @event.listens_for(services.uow.engine, "connect")
    def _note_backend(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backends.add(int(cursor.fetchone()[0]))

    with services.uow.begin() as session:
        session.execute(text("SELECT 1"))
    _worker = _Worker(services, backends)
    return os.getpid()


def _timed(load: Any, profile_to: str | None) -> tuple[float, float, float | None, int, int, Any]:
    """Run ``load()`` and measure wall time, CPU of this process and of its backends, RSS."""
    assert _worker is not None
    _reset_peak_rss()
    before = _status_kib("VmRSS")
    profiler = cProfile.Profile() if profile_to else None
    database_cpu = _backends_cpu(_worker.backends)
    worker_cpu = _own_cpu()
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    result = load()
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - started
    worker_cpu = _own_cpu() - worker_cpu
    after = _backends_cpu(_worker.backends)
    database_cpu = after - database_cpu if after is not None and database_cpu is not None else None
    peak = _status_kib("VmHWM")
    if profiler is not None and profile_to:
        profiler.dump_stats(profile_to)
    return seconds, worker_cpu, database_cpu, before, peak, result


def sync_in_worker(task_key: str, profile_to: str | None, force: bool) -> WorkerRun:
    """Run the sync task once in this long-lived worker process and measure it."""
    assert _worker is not None
    services = _worker.services
    seconds, cpu, db_cpu, before, peak, result = _timed(
        lambda: run_sync(services, task_key, force=force), profile_to
    )
    return WorkerRun(seconds, cpu, db_cpu, before, peak, result.outcome, result.records_read)


def copy_in_worker(export_url: str, profile_to: str | None) -> WorkerRun:
    """The floor: download, gunzip and parse the export, COPY (sku, jsonb) into a fresh table
    and add its primary key, in one transaction on this worker's connection."""
    import httpx
    import orjson

    from bench.exports import iter_lines

    assert _worker is not None
    engine = _worker.services.uow.engine

    def load() -> int:
        count = 0
        with engine.connect() as conn:
            raw = conn.connection.driver_connection
            assert raw is not None
            with raw.transaction(), raw.cursor() as cursor:
                cursor.execute("DROP TABLE IF EXISTS copy_floor")
                cursor.execute("CREATE TABLE copy_floor (key text, doc jsonb)")
                with (
                    httpx.Client(timeout=60) as client,
                    client.stream("GET", export_url, headers={"Accept-Encoding": "gzip"}) as resp,
                    cursor.copy("COPY copy_floor (key, doc) FROM STDIN") as copy,
                ):
                    for line in iter_lines(resp.iter_raw()):
                        record = orjson.loads(line)
                        copy.write_row((record["sku"], orjson.dumps(record).decode()))
                        count += 1
                cursor.execute("ALTER TABLE copy_floor ADD PRIMARY KEY (key)")
        return count

    seconds, cpu, db_cpu, before, peak, count = _timed(load, profile_to)
    return WorkerRun(seconds, cpu, db_cpu, before, peak, "committed", count)


# --- the driver side: owns the simulator, the database checks and the table ------------------


@dataclass
class Bench:
    """What every phase needs: the database, the simulated Cloud and the options."""

    engine: Engine
    uow: db.UnitOfWork
    cloud: CloudState
    server: ExportServer
    database_url: str
    redis_url: str
    profile_dir: Path | None
    earlier_windows: int = 0
    sitemap_id: int = 0


def ensure_database(url: str) -> None:
    """Create the benchmark database of ``url`` when its server lacks it (CREATE DATABASE
    cannot run in a transaction, hence autocommit on the server's ``postgres`` database)."""
    parsed = make_url(url)
    name = parsed.database or ""
    server = parsed.set(database="postgres")
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


def recreate_schema(url: str) -> None:
    """Drop every table of the bench database and migrate it to head: the code under test may
    have changed the schema since the last run."""
    parsed = make_url(url)
    name = parsed.database or ""
    if "bench" not in name:
        raise BenchError(f"refusing to drop the tables of {name!r}: not a benchmark database")
    ensure_database(url)
    engine = db.make_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        meta.drop_all(engine)
    finally:
        engine.dispose()
    db.upgrade(url)


def reset_database(engine: Engine) -> None:
    """Empty every table of the application."""
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


def _profile_path(bench: Bench, n: int, phase: str, run: int) -> str | None:
    if bench.profile_dir is None:
        return None
    name = f"sync-{n}-{re.sub(r'[^a-z0-9]+', '-', phase.lower())}-{run}.pstats"
    return str(bench.profile_dir / name)


def keep_earlier_windows(engine: Engine, windows: int) -> None:
    """Give the observations table ``windows`` earlier windows of the run it holds (copies
    under other keys and run ids), as a deployment that keeps its history has, with the
    statistics autovacuum would have taken."""
    columns = (
        "dataset, entity_key, partition, start_url, payload, payload_hash, source_job_id, "
        "source_attempt_id, first_seen_at, last_changed_at"
    )
    with engine.begin() as conn:
        for w in range(1, windows + 1):
            conn.execute(
                text(
                    "INSERT INTO observations (observation_key, run_id, collection_window, "  # noqa: S608 - constant SQL
                    f"{columns}) SELECT md5(observation_key || :w) || md5(:w || observation_key), "
                    f"'products-earlier-' || :w, 'earlier-' || :w, {columns} FROM observations "
                    "WHERE run_id NOT LIKE 'products-earlier-%'"
                ),
                {"w": str(w)},
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE observations")


def _sync_phase(
    bench: Bench, pool: ProcessPoolExecutor, *, n: int, phase: str, job_id: int, run: int
) -> Row:
    task_key = store.task_key_for(job_id)
    with bench.uow.begin() as session:
        store.want_sync(session, job_id, now=utcnow())
        session.commit()
    mark = _mark(bench.engine)
    calls = bench.cloud.calls
    profile_to = _profile_path(bench, n, phase, run)
    result = pool.submit(sync_in_worker, task_key, profile_to, phase != FIRST).result()
    calls = bench.cloud.calls - calls
    if result.outcome != "committed" or result.records_read != n:
        raise BenchError(
            f"{phase} sync of job {job_id} ({n} records): outcome {result.outcome!r}, "
            f"{result.records_read} records read"
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
        run=result,
        api_calls=calls,
        inserted=attempt.inserted,
        updated=attempt.updated,
        unchanged=attempt.unchanged,
        rows_written=rows_written,
        changed_at_moved=moved,
    )


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise BenchError(message)


def _new_job(bench: Bench, export: RenderedExport) -> int:
    """A finished Cloud job whose download is ``export``."""
    cloud = bench.cloud
    job_id = cloud.create_job(bench.sitemap_id)
    cloud.set_generated(job_id, export.records)  # the job's counters; the body is the export
    cloud.finish_job(job_id)
    bench.server.exports.set(job_id, export)
    return job_id


def bench_size(
    bench: Bench, n: int, run: int, exports: tuple[RenderedExport, RenderedExport]
) -> list[Row]:
    """Raw COPY, first sync, unchanged repeat and 10%-changed sync of one n-record export, in
    one long-lived worker process, on empty tables."""
    from bench.exports import render

    original, changed_export = exports
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        pool.submit(
            start_worker, bench.database_url, bench.redis_url, bench.server.api_url
        ).result()
        reset_database(bench.engine)
        warm_up = _new_job(bench, render(WARM_UP_RECORDS))
        _sync_phase(bench, pool, n=WARM_UP_RECORDS, phase="warm-up", job_id=warm_up, run=run)
        bench.server.exports.set(warm_up, None)
        reset_database(bench.engine)

        job_id = _new_job(bench, original)
        export_url = f"{bench.server.api_url}scraping-job/{job_id}/json?api_token={API_TOKEN}"
        floor = pool.submit(copy_in_worker, export_url, _profile_path(bench, n, COPY, run))
        copy_run = floor.result()
        _check(copy_run.records_read == n, f"raw COPY read {copy_run.records_read} of {n}")
        with bench.engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE copy_floor")
        rows = [Row(records=n, phase=COPY, run=copy_run)]

        first = _sync_phase(bench, pool, n=n, phase=FIRST, job_id=job_id, run=run)
        _check(
            first.inserted == n and first.updated == 0 and first.rows_written == n,
            f"first sync of {n}: {first}",
        )
        keep_earlier_windows(bench.engine, bench.earlier_windows)
        repeat = _sync_phase(bench, pool, n=n, phase=REPEAT, job_id=job_id, run=run)
        _check(
            repeat.inserted == 0
            and repeat.updated == 0
            and repeat.unchanged == n
            and repeat.rows_written == 0
            and repeat.changed_at_moved == 0,
            f"repeat sync of {n} unchanged records rewrote rows: {repeat}",
        )
        bench.cloud.continue_job(job_id)
        bench.cloud.finish_job(job_id)
        bench.server.exports.set(job_id, changed_export)
        expected = sum(1 for i in range(n) if _is_changed(i))
        changed = _sync_phase(bench, pool, n=n, phase=CHANGED, job_id=job_id, run=run)
        _check(
            changed.inserted == 0
            and changed.updated == expected
            and changed.rows_written == expected
            and changed.changed_at_moved == expected,
            f"sync of {n} records with {expected} changed: {changed}",
        )
        bench.server.exports.set(job_id, None)
        bench.cloud.delete_job(job_id)
    return [*rows, first, repeat, changed]


def _is_changed(index: int) -> bool:
    """The last 10 records of every block of 100 change in the "10% changed" export."""
    return index % BLOCK >= BLOCK - CHANGED_PER_BLOCK


# --- the report --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """The median of several runs of one load of one size."""

    records: int
    phase: str
    seconds: float
    low: float
    high: float
    worker_cpu: float
    database_cpu: float | None
    peak_rss_kib: int
    rows: Row

    @property
    def rate(self) -> float:
        """Records per second at the median time."""
        return self.records / self.seconds


def summarise(rows: Sequence[Row]) -> list[Summary]:
    """Medians per (size, load), in size then phase order."""
    out: list[Summary] = []
    for n in sorted({r.records for r in rows}):
        for phase in PHASES:
            group = [r for r in rows if r.records == n and r.phase == phase]
            if not group:
                continue
            seconds = [r.run.seconds for r in group]
            db_cpu = [r.run.database_cpu for r in group if r.run.database_cpu is not None]
            out.append(
                Summary(
                    records=n,
                    phase=phase,
                    seconds=statistics.median(seconds),
                    low=min(seconds),
                    high=max(seconds),
                    worker_cpu=statistics.median(r.run.worker_cpu for r in group),
                    database_cpu=statistics.median(db_cpu) if db_cpu else None,
                    peak_rss_kib=max(r.run.peak_rss_kib for r in group),
                    rows=group[-1],
                )
            )
    return out


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def table(summaries: Sequence[Summary]) -> str:
    """The results as a markdown table, each load beside the raw COPY of the same export."""
    lines = [
        "| records | load | seconds (median) | min-max | records/s | x raw COPY rate "
        "| x first sync time | CPU s: worker / PostgreSQL | peak RSS MiB "
        "| inserted | updated | unchanged | rows written (xmin) | last_changed_at moved |",
        "| ---: | --- |" + " ---: |" * 12,
    ]
    by_key = {(s.records, s.phase): s for s in summaries}
    for s in summaries:
        floor = by_key.get((s.records, COPY))
        first = by_key.get((s.records, FIRST))
        vs_copy = f"{s.rate / floor.rate:.2f}" if floor is not None else "n/a"
        vs_first = (
            f"{s.seconds / first.seconds:.2f}"
            if first is not None and s.phase in (REPEAT, CHANGED)
            else ""
        )
        database = "n/a" if s.database_cpu is None else f"{s.database_cpu:.1f}"
        counts = (
            "| | | | |"
            if s.phase == COPY
            else f"| {s.rows.inserted:,} | {s.rows.updated:,} | {s.rows.unchanged:,} "
            f"| {s.rows.rows_written:,} | {s.rows.changed_at_moved:,} |"
        )
        lines.append(
            f"| {s.records:,} | {s.phase} | {s.seconds:.2f} | {s.low:.2f}-{s.high:.2f} "
            f"| {s.rate:,.0f} | {vs_copy} | {vs_first} | {s.worker_cpu:.1f} / {database} "
            f"| {_mib(s.peak_rss_kib)} {counts}"
        )
    return "\n".join(lines)


def verdicts(summaries: Sequence[Summary]) -> list[tuple[str, bool | None, str]]:
    """Each target, whether it was met (None: not measured at these sizes) and the numbers."""
    out: list[tuple[str, bool | None, str]] = []
    by_key = {(s.records, s.phase): s for s in summaries}
    target = f"first sync of {TARGET_SIZE:,} records >= {FIRST_MIN_VS_COPY}x the raw COPY rate"
    first, floor = by_key.get((TARGET_SIZE, FIRST)), by_key.get((TARGET_SIZE, COPY))
    if first is None or floor is None:
        out.append((target, None, "size not run"))
    else:
        ratio = first.rate / floor.rate
        out.append(
            (
                target,
                ratio >= FIRST_MIN_VS_COPY,
                f"{ratio:.2f}x: {first.rate:,.0f} vs {floor.rate:,.0f} records/s",
            )
        )
    for n in sorted({s.records for s in summaries}):
        first = by_key.get((n, FIRST))
        for phase, limit in ((REPEAT, REPEAT_MAX_SHARE), (CHANGED, CHANGED_MAX_SHARE)):
            s = by_key.get((n, phase))
            if first is None or s is None:
                continue
            share = s.seconds / first.seconds
            extra = ", zero rows rewritten" if phase == REPEAT else ""
            out.append(
                (
                    f"{phase} sync of {n:,} records <= {limit}x the first sync's time{extra}",
                    share <= limit and (phase != REPEAT or s.rows.rows_written == 0),
                    f"{share:.2f}x, {s.rows.rows_written:,} rows written",
                )
            )
    sizes = sorted({s.records for s in summaries})
    if len(sizes) > 1:
        low, high = sizes[0], sizes[-1]
        peak_low = max(s.peak_rss_kib for s in summaries if s.records == low and s.phase != COPY)
        peak_high = max(s.peak_rss_kib for s in summaries if s.records == high and s.phase != COPY)
        growth = peak_high / peak_low
        out.append(
            (
                f"peak RSS of a sync at {high:,} records <= {RSS_MAX_GROWTH}x that at {low:,}",
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
    parser.add_argument("--million", action="store_true", help="add a 1,000,000-record export")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs per size (median)")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--profile", type=Path, help="write cProfile stats per load here")
    parser.add_argument(
        "--earlier-windows",
        type=int,
        default=0,
        metavar="N",
        help="after the first sync, give the table N earlier windows of as many records",
    )
    parser.add_argument("--enforce", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    sizes = sorted(set(args.records) | ({MILLION} if args.million else set()))

    # The simulator (and Flask with it) is imported here, in the driver only, so the spawned
    # worker carries what a real worker carries and its RSS is comparable.
    from bench.exports import ExportServer, MemoryExports, render
    from simulator import CloudState
    from simulator.app import API_PREFIX, create_app

    try:
        recreate_schema(args.database_url)
    except BenchError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    Redis.from_url(args.redis_url).flushdb()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    engine = db.make_engine(args.database_url)
    cloud = CloudState(api_token=API_TOKEN)

    def count_call() -> None:
        with cloud.lock:
            cloud.calls += 1

    server = ExportServer(MemoryExports(create_app(cloud), API_PREFIX, count_call), API_PREFIX)
    bench = Bench(
        engine=engine,
        uow=db.UnitOfWork(engine),
        cloud=cloud,
        server=server,
        database_url=args.database_url,
        redis_url=args.redis_url,
        profile_dir=args.profile,
        earlier_windows=args.earlier_windows,
    )
    bench.sitemap_id = cloud.add_sitemap("products", start_urls=["https://alpha.example/"])
    rows: list[Row] = []
    loads: list[float] = [os.getloadavg()[0]]
    record_bytes = 0.0
    try:
        for n in sizes:
            exports = (render(n), render(n, changed=_is_changed))
            record_bytes = exports[0].record_bytes
            for run in range(args.runs):
                started = time.perf_counter()
                rows.extend(bench_size(bench, n, run, exports))
                loads.append(os.getloadavg()[0])
                print(
                    f"{n:,} records, run {run + 1}: {time.perf_counter() - started:.0f} s, "
                    f"load {loads[-1]:.1f}",
                    file=sys.stderr,
                )
            del exports
    except BenchError as exc:
        print(table(summarise(rows)), f"\nFAILED: {exc}", sep="\n")
        return 1
    finally:
        server.close()
        cloud.close()
        engine.dispose()
    summaries = summarise(rows)
    print(table(summaries))
    print(
        f"\nRecords: {record_bytes:.0f} bytes per JSON Lines line on average. Medians of "
        f"{args.runs} run(s). Machine: {os.cpu_count()} cores; 1-minute load average "
        f"{min(loads):.1f} to {max(loads):.1f} during the run. Each size runs in one long-lived "
        "spawned worker process; exports are served from memory on loopback."
        + (
            f" After the first sync the table holds {args.earlier_windows} earlier windows of "
            "as many records."
            if args.earlier_windows
            else ""
        )
        + "\n"
    )
    missed = False
    for target, met, numbers in verdicts(summaries):
        word = "not measured" if met is None else ("met" if met else "MISSED")
        missed = missed or met is False
        print(f"- {target}: {word} ({numbers})")
    return 1 if missed and args.enforce else 0


if __name__ == "__main__":
    sys.exit(main())
