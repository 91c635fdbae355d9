"""Typed-tables benchmark: what publishing to ``datasets.X`` (table, history, change feed) adds
to a sync, and how a filter on ``datasets.X`` compares with the same filter on a plain table.

In one process, on PostgreSQL, with the simulator in-process as Cloud (generated product
records: sku, title, price, url, retailer), each measured side by side in the same run:

- **first sync**: ``run_sync`` of a finished job of N records into empty tables, then its
  evaluation (acceptance and publication), once with publication to the typed tables switched
  off (the pointer and outbox only, as before) and once with it on, from a fresh schema each;
- **next run, same records**: a second job of the same N records (a new run: every row stays,
  only its run id and window move), evaluation timed with and without the typed tables;
- **same job again**: the second job synced again with its download forced (nothing
  changed, so its evaluation publishes nothing);
- **filter at 1M rows**: ``count(*) WHERE price < 20`` on ``datasets.products`` filled with
  1M rows (as publication leaves them) and on a plain ``(sku, title, price, url, retailer)``
  table of the same values; median of several runs each, both with and without an index on
  price.

    python -m bench.datasets_bench                 # 100k records, 5 rounds per arm, 1M-row filter
    python -m bench.datasets_bench --records 10000 --runs 3 --filter-rows 100000

The benchmark owns its database: it drops and re-migrates every table (only in a database whose
name contains "bench"), then asks for a checkpoint, so that every round starts from the same
state: no checkpoint under way and the whole WAL allowance ahead. Without it the WAL of earlier
rounds (about 0.5 GB a round, more with the typed tables) started checkpoints at moments that
fell on either arm: an UPDATE of the run's observations just after one writes a full-page image
of every page (+0.1 GB of WAL, +0.8 s), which weighed on whichever arm it met. What the typed
tables' own writes cost later checkpoints is printed instead, as the WAL each arm's first
evaluation writes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from decimal import Decimal
from typing import Any

import httpx
import orjson
from sqlalchemy import make_url, text

from bench.exports import MemoryExports, RenderedExport, render, render_lines
from bench.sync_bench import ensure_database, recreate_schema
from config.datasets import parse_datasets
from config.settings import Settings
from simulator import CloudState
from simulator import create_app as create_simulator
from simulator.app import API_PREFIX
from simulator.records import generate_records
from sync import bootstrap, db
from sync.bootstrap import Services
from sync.cloud.budget import MemoryApiBudget
from sync.datasets import materialise
from sync.datasets.changes import ChangeSet
from sync.ingest import store, tasks
from sync.queue import RecordingDispatcher
from sync.runs import evaluation

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/scrapesync_datasets_bench"
API_TOKEN = "bench-token"  # noqa: S105 - the simulator's account, never a real one
DATASETS_TOML = """
[datasets.products]
sitemap = "products"
entity_key = ["sku"]
window = "job"
partition = "retailer"
required = ["sku", "price"]
[datasets.products.quality]
use_cloud_quality = false
max_record_drop_percent = 90
[datasets.products.columns]
sku = "text"
title = "text"
price = "numeric"
url = "text"
retailer = "text"
[datasets.products.watch]
price = { percent = 1 }
title = true
"""
FILTER_RUNS = 7


def reset(url: str) -> None:
    """Empty the bench database (created when missing): drop the data schema, then every table,
    and migrate again."""
    if "bench" not in (make_url(url).database or ""):
        raise SystemExit(f"refusing to reset {url}: its name must contain 'bench'")
    ensure_database(url)
    engine = db.make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA IF EXISTS datasets CASCADE"))
    recreate_schema(url)
    with engine.begin() as conn:
        conn.execute(text("CHECKPOINT"))
    engine.dispose()


def wal_position(services: Services) -> int:
    """Where PostgreSQL's write-ahead log is, in bytes."""
    with services.uow.engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_current_wal_lsn() - '0/0'")).scalar_one())


def small_export(n: int) -> RenderedExport:
    """An export of the simulator's minimal records (sku, title, price, url, retailer: about
    220 bytes a line with Cloud's meta fields), every field of which is a typed column."""
    lines = (
        orjson.dumps(
            {
                "web-scraper-order": f"1764000000-{i + 1}",
                "web-scraper-start-url": f"https://{record['retailer']}/",
                **record,
            }
        ).decode()
        + "\n"
        for i, record in enumerate(generate_records(n))
    )
    return render_lines(lines, n)


def wire(url: str, cloud: CloudState, downloads: MemoryExports) -> Services:
    """Services as a worker has them, on the bench database and the in-process simulator
    (downloads served from memory)."""
    settings = Settings(database_url=url, api_url="http://cloud.test/api/v1/", api_token=API_TOKEN)
    built = bootstrap.build(
        settings,
        datasets=parse_datasets(DATASETS_TOML, source="bench"),
        dispatcher=RecordingDispatcher(),
        transport=httpx.WSGITransport(app=downloads),
        budget=MemoryApiBudget(limit=100_000, window=900.0),
        sleep=lambda _: None,
    )
    bootstrap.use(built)
    return built


@contextmanager
def publication_as(stand_in: Callable[..., materialise.Materialised]) -> Iterator[None]:
    """Publication to the typed tables replaced by ``stand_in`` for the block."""
    real = materialise.apply_publication
    materialise.apply_publication = stand_in  # type: ignore[assignment]
    try:
        yield
    finally:
        materialise.apply_publication = real  # type: ignore[assignment]


def typed_tables_off() -> AbstractContextManager[None]:
    """Publication as it was before the typed tables: pointer and outbox events only."""

    def nothing(_session: Any, dataset: Any, run: Any, **kw: Any) -> materialise.Materialised:
        return materialise.Materialised(ChangeSet(dataset.name, run.run_id, None), ())

    return publication_as(nothing)


def sync_and_evaluate(
    services: Services,
    cloud: CloudState,
    downloads: MemoryExports,
    export: RenderedExport,
    wal: list[int] | None = None,
) -> tuple[float, float]:
    """A finished job whose download is ``export`` synced then evaluated: (sync seconds,
    evaluation seconds); the bytes of WAL the evaluation wrote are appended to ``wal``."""
    sitemap = next(sid for sid, s in cloud.sitemaps.items() if s.name == "products")
    job_id = cloud.create_job(sitemap)
    cloud.set_generated(job_id, export.records)  # the job's counters; the body is the export
    cloud.finish_job(job_id)
    downloads.set(job_id, export)
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    started = time.perf_counter()
    outcome = tasks.run_sync(services, wish.task_key).outcome
    synced = time.perf_counter()
    position = wal_position(services) if wal is not None else 0
    evaluated = time.perf_counter()
    judged = evaluation.evaluate_run(services, f"products-job-{job_id}")
    done = time.perf_counter()
    if wal is not None:
        wal.append(wal_position(services) - position)
    if outcome != "committed" or judged.outcome != "published":
        raise SystemExit(f"job {job_id}: sync {outcome}, evaluation {judged.outcome}")
    return synced - started, done - evaluated


def resync_same_job(services: Services, cloud: CloudState) -> tuple[float, float]:
    """The last job synced again with its download forced: (sync seconds, evaluation
    seconds); the evaluation finds nothing changed and publishes nothing."""
    job_id = max(cloud.jobs)
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    started = time.perf_counter()
    tasks.run_sync(services, wish.task_key, force=True)
    synced = time.perf_counter()
    judged = evaluation.evaluate_run(services, f"products-job-{job_id}")
    done = time.perf_counter()
    if judged.outcome != "unchanged":
        raise SystemExit(f"job {job_id}: a forced repeat was {judged.outcome}")
    return synced - started, done - synced


OFF, ON = "without typed tables", "with typed tables"
PHASES = ("first sync", "next run, same records", "same job again (forced)")
FIRST_BUDGET = 0.25  # typed tables add at most this share to a first sync
SAME_BUDGET = 0.1  # seconds they add at most to a forced repeat of unchanged data


def publication_timed(spent: list[float]) -> AbstractContextManager[None]:
    """Publication to the typed tables as it is, each call's seconds appended to ``spent``."""
    real = materialise.apply_publication

    def timed(*args: Any, **kwargs: Any) -> materialise.Materialised:
        started = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    return publication_as(timed)


Times = tuple[float, float, float]  # sync, evaluation, and the typed tables' part of it


def one_round(
    url: str, export: RenderedExport, *, typed: bool, wal: list[int] | None = None
) -> dict[str, Times]:
    """phase -> (sync seconds, evaluation seconds, seconds of it inside the publication to the
    typed tables), from a fresh schema, with the typed tables on or off; the WAL bytes the first
    evaluation wrote are appended to ``wal``."""
    reset(url)
    cloud = CloudState(api_token=API_TOKEN)
    cloud.add_sitemap("products", start_urls=["https://alpha.example/"])
    downloads = MemoryExports(create_simulator(cloud), API_PREFIX, lambda: None)
    services = wire(url, cloud, downloads)
    spent: list[float] = []
    measured: list[Times] = []

    def phase(times: tuple[float, float]) -> None:
        measured.append((*times, sum(spent)))
        spent.clear()

    try:
        with publication_timed(spent) if typed else typed_tables_off():
            phase(sync_and_evaluate(services, cloud, downloads, export, wal))
            phase(sync_and_evaluate(services, cloud, downloads, export))
            phase(resync_same_job(services, cloud))
    finally:
        cloud.close()
        services.uow.engine.dispose()
    return dict(zip(PHASES, measured, strict=True))


def bench_publication(
    url: str, export: RenderedExport, warm_up: RenderedExport, runs: int
) -> tuple[dict[tuple[str, str], list[Times]], dict[str, list[int]]]:
    """(phase, arm) -> each round's :data:`Times`, and arm -> each round's WAL bytes written by
    the first evaluation. The arms alternate, and which goes first alternates from round to
    round, so a machine getting busier or quieter weighs on both alike."""
    one_round(url, warm_up, typed=True)  # warm-up: imports, connections, plans
    measured: dict[tuple[str, str], list[Times]] = {}
    wal: dict[str, list[int]] = {OFF: [], ON: []}
    for r in range(runs):
        arms = (False, True) if r % 2 == 0 else (True, False)
        for typed in arms:
            arm = ON if typed else OFF
            for phase, times in one_round(url, export, typed=typed, wal=wal[arm]).items():
                measured.setdefault((phase, arm), []).append(times)
        print(f"round {r + 1} of {runs} done", file=sys.stderr, flush=True)
    return measured, wal


def bench_filter(url: str, n: int) -> list[tuple[str, float]]:
    """Median seconds of ``count(*) WHERE price < 20`` on datasets.products and on a plain
    typed table, both of ``n`` rows, without and with an index on price."""
    engine = db.make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS plain_products"))
        conn.execute(
            text(
                "CREATE TABLE plain_products (sku text PRIMARY KEY, title text, "
                "price numeric, url text, retailer text)"
            )
        )
        conn.execute(text("TRUNCATE datasets.products, datasets.products_closed"))
        records = generate_records(n)
        raw = conn.connection.driver_connection
        assert raw is not None
        with (
            raw.cursor() as cursor,
            cursor.copy(
                "COPY plain_products (sku, title, price, url, retailer) FROM STDIN"
            ) as copy,
        ):
            for r in records:
                copy.write_row((r["sku"], r["title"], Decimal(r["price"]), r["url"], r["retailer"]))
        conn.execute(
            text(
                "INSERT INTO datasets.products (entity_key, sku, title, price, url, retailer, "
                "partition, run_id, collection_window, first_seen_at, last_changed_at, "
                "payload_hash, changed_by_run_id) SELECT sku, sku, title, price, url, retailer, "
                "retailer, 'products-job-1', 'job-1', now(), now(), md5(sku) || md5(sku), "
                "'products-job-1' FROM plain_products"
            )
        )
        conn.execute(text("ANALYZE plain_products"))
        conn.execute(text("ANALYZE datasets.products"))
    results = []
    for indexed in (False, True):
        if indexed:
            with engine.begin() as conn:
                conn.execute(text("CREATE INDEX ON plain_products (price)"))
                conn.execute(text("CREATE INDEX ON datasets.products (price)"))
                conn.execute(text("ANALYZE plain_products"))
                conn.execute(text("ANALYZE datasets.products"))
        for table in ("plain_products", "datasets.products"):
            times = []
            with engine.connect() as conn:
                query = text(f"SELECT count(*) FROM {table} WHERE price < 20")  # noqa: S608 - fixed names
                conn.execute(query)  # warm
                for _ in range(FILTER_RUNS):
                    started = time.perf_counter()
                    conn.execute(query).scalar_one()
                    times.append(time.perf_counter() - started)
            label = f"{table}{', indexed' if indexed else ''}"
            results.append((label, statistics.median(times)))
    engine.dispose()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5, help="rounds per arm (medians)")
    parser.add_argument("--filter-rows", type=int, default=1_000_000)
    parser.add_argument("--enforce", action="store_true", help="exit 1 when a budget is missed")
    parser.add_argument(
        "--small",
        action="store_true",
        help="the simulator's minimal records (every field a typed column), not realistic ones",
    )
    args = parser.parse_args(argv)
    make = small_export if args.small else render
    export, warm_up = make(args.records), make(2_000)
    measured, wal = bench_publication(args.database_url, export, warm_up, args.runs)

    def median(phase: str, arm: str, part: int | None = None) -> float:
        rounds = measured[(phase, arm)]
        return statistics.median(t[0] + t[1] if part is None else t[part] for t in rounds)

    print(
        f"\n{args.records:,} records of {export.record_bytes:.0f} bytes a line "
        f"({'minimal' if args.small else 'realistic'}), medians of {args.runs} rounds per arm"
    )
    print(
        "| phase | sync s | evaluation s | of it, publishing to the typed tables s | total s "
        "| min-max total s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for phase in PHASES:
        for arm in (OFF, ON):
            totals = [t[0] + t[1] for t in measured[(phase, arm)]]
            inside = f"{median(phase, arm, 2):.2f}" if arm == ON else ""
            print(
                f"| {phase}, {arm} | {median(phase, arm, 0):.2f} | {median(phase, arm, 1):.2f} "
                f"| {inside} | {median(phase, arm):.2f} | {min(totals):.2f}-{max(totals):.2f} |"
            )
    first_off, first_on = median(PHASES[0], OFF), median(PHASES[0], ON)
    first_share = (first_on - first_off) / first_off
    # a repeat's sync never touches the typed tables: what they add is in its evaluation
    repeat_added = median(PHASES[1], ON, 1) - median(PHASES[1], OFF, 1)
    same_added = median(PHASES[2], ON, 1) - median(PHASES[2], OFF, 1)
    first_ok, same_ok = first_share <= FIRST_BUDGET, same_added <= SAME_BUDGET
    print(
        f"\nfirst sync: typed tables add {first_on - first_off:.2f} s ({100 * first_share:.0f}%; "
        f"budget {100 * FIRST_BUDGET:.0f}%): {'met' if first_ok else 'MISSED'}"
    )
    # the same, timed inside the publication alone: no noise from the rest of the round, but
    # blind to what its writes cost the statements after it (checkpoints, cache)
    inside = median(PHASES[0], ON, 2)
    print(
        f"first sync: publishing to the typed tables itself took {inside:.2f} s "
        f"({100 * inside / first_off:.0f}% of the first sync without them)"
    )
    megabytes = {arm: statistics.median(wal[arm]) / 1e6 for arm in (OFF, ON)}
    print(
        f"first sync: its evaluation wrote {megabytes[OFF]:.0f} MB of WAL without the typed "
        f"tables, {megabytes[ON]:.0f} MB with them"
    )
    print(f"next run, same records: typed tables add {repeat_added:.2f} s to its evaluation")
    print(
        f"same job again: typed tables add {same_added:.2f} s to its evaluation "
        f"(budget {SAME_BUDGET} s): {'met' if same_ok else 'MISSED'}"
    )
    filters = bench_filter(args.database_url, args.filter_rows)
    print(f"\nfilter price < 20 at {args.filter_rows:,} rows (median of {FILTER_RUNS})")
    print("| table | ms |")
    print("| --- | ---: |")
    for label, seconds in filters:
        print(f"| {label} | {seconds * 1000:.1f} |")
    return 1 if args.enforce and not (first_ok and same_ok) else 0


if __name__ == "__main__":
    sys.exit(main())
