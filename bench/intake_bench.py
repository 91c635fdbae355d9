"""Intake benchmark: Cloud's finished-job notifications against the web process, beside a floor.

Both apps run under the Procfile's web line (gunicorn, 2 workers x 4 threads); wrk drives each
with 16 connections from 2 threads:

- **floor**: ``bench/intake_floor.py``, a Flask view that does one INSERT and one commit per
  request (distinct jobs);
- **distinct jobs**: every notification names a new scraping job;
- **repeats of one job**: every notification names the same job.

After each measured run the benchmark checks what was acknowledged: at least one stored
notification per 2xx answer, and (for the web process) every wanted sync task has its RQ job
waiting in Redis. Throughput is requests per second over the run; p50/p99 are wrk's latency
percentiles. Each figure is the median of several runs, measured side by side in one run.

    python -m bench.intake_bench                     # 3 runs of 10 s per scenario
    python -m bench.intake_bench --runs 1 --duration 5

Needs wrk (``apt-get install -y wrk``). The benchmark owns its database and Redis database: it
drops and re-migrates every table (only in a database whose name contains "bench") and flushes
the Redis database.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from redis import Redis
from sqlalchemy import Engine, text

from bench.intake_floor import TABLE as FLOOR_TABLE
from bench.sync_bench import BenchError, recreate_schema, reset_database
from sync import db
from sync.queue import QUEUE_NAME, sync_job_id

ROOT = Path(__file__).resolve().parent.parent
# Apart from the sync benchmark's, so that the two can run at once: each drops its tables and
# flushes its Redis database.
DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/scrapesync_bench_intake"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/9"
TOKEN = "bench-webhook-token"  # noqa: S105 - the benchmark's own token
SCRIPTS = {"distinct jobs": "intake_distinct.lua", "repeats of one job": "intake_repeat.lua"}
FLOOR, APP = "floor (one INSERT + commit)", "scrapesync"

# Targets (see bench/README.md).
MIN_VS_FLOOR = 0.5
MAX_P99_MS = 50.0


@dataclass(frozen=True)
class Load:
    """What wrk saw in one measured run."""

    app: str
    scenario: str
    requests: int
    seconds: float
    non_2xx: int
    errors: int
    p50_ms: float
    p99_ms: float

    @property
    def rate(self) -> float:
        """Requests answered per second."""
        return self.requests / self.seconds


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def web_command(app: str, port: int, env: dict[str, str]) -> list[str]:
    """The Procfile's web line for ``app`` on a loopback port, with ``env`` passed to gunicorn."""
    line = next(
        raw.partition(":")[2]
        for raw in (ROOT / "Procfile").read_text().splitlines()
        if raw.startswith("web:")
    )
    argv = shlex.split(line.replace("$PORT", str(port)).replace("0.0.0.0:", "127.0.0.1:"))
    if argv[0] != "gunicorn":
        raise BenchError(f"the Procfile's web line does not run gunicorn: {line!r}")
    argv[0] = str(Path(sys.executable).with_name("gunicorn"))
    argv[-1] = app
    flags = [f"--env={name}={value}" for name, value in env.items()]
    return [argv[0], *flags, *argv[1:]]


@contextmanager
def running(name: str, argv: list[str], port: int, log_dir: Path) -> Iterator[str]:
    """Run one web app until the block ends; yields its base URL once it answers /healthz."""
    log = (log_dir / f"{name.split()[0]}.log").open("w")
    process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise BenchError(f"{name} exited with {process.returncode}; see {log.name}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"{name} did not answer /healthz within 30 s; see {log.name}")
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def wrk(url: str, scenario: str, *, seconds: int, connections: int, threads: int) -> dict[str, int]:
    """Run wrk once against ``url``; its summary as numbers."""
    binary = shutil.which("wrk")
    if binary is None:
        raise BenchError("wrk is not installed: apt-get install -y wrk")
    script = Path(__file__).with_name(SCRIPTS[scenario])
    out = subprocess.run(
        [binary, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=False,
        timeout=seconds + 60,
    )
    if out.returncode != 0:
        raise BenchError(f"wrk failed ({out.returncode}): {out.stdout}{out.stderr}")
    summary = next((line for line in out.stdout.splitlines() if line.startswith("WRK ")), None)
    if summary is None:
        raise BenchError(f"wrk printed no summary:\n{out.stdout}")
    numbers: dict[str, int] = json.loads(summary[4:])
    return numbers


def _count(engine: Engine, table: str) -> int:
    with engine.begin() as conn:
        count = conn.execute(text(f"SELECT count(*) FROM {table}"))  # noqa: S608 - constant names
        return int(count.scalar_one())


def _unqueued(engine: Engine, redis: Redis) -> int:
    """Wanted sync tasks whose RQ job does not wait in the queue."""
    raw: list[bytes] = redis.lrange(f"rq:queue:{QUEUE_NAME}", 0, -1)  # type: ignore[assignment]
    queued = {j.decode() for j in raw}
    with engine.begin() as conn:
        tasks = conn.execute(
            text(
                "SELECT task_key, requested_generation, attempt_count FROM sync_tasks "
                "WHERE state = 'pending'"
            )
        ).all()
    return sum(1 for t in tasks if sync_job_id(t[0], t[1], t[2]) not in queued)


def measure(
    engine: Engine,
    redis: Redis,
    app: str,
    base: str,
    scenario: str,
    args: argparse.Namespace,
) -> Load:
    """Warm up, then measure one scenario and check that every 2xx answer was kept."""
    table = FLOOR_TABLE if app == FLOOR else "notifications"
    if app == FLOOR:
        with engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {FLOOR_TABLE}"))
    else:
        reset_database(engine)
        redis.flushdb()
    url = f"{base}/webhooks/webscraper/{TOKEN}"
    wrk(url, scenario, seconds=2, connections=args.connections, threads=args.threads)
    time.sleep(0.5)
    before = _count(engine, table)
    got = wrk(
        url, scenario, seconds=args.duration, connections=args.connections, threads=args.threads
    )
    time.sleep(0.5)
    stored = _count(engine, table) - before
    ok = got["requests"] - got["non2xx"]
    if got["non2xx"] or got["errors"]:
        raise BenchError(
            f"{app}, {scenario}: {got['non2xx']} non-2xx answers, {got['errors']} errors"
        )
    if stored < ok:
        raise BenchError(f"{app}, {scenario}: {ok} notifications acknowledged, {stored} stored")
    if app == APP:
        missing = _unqueued(engine, redis)
        if missing:
            raise BenchError(f"{scenario}: {missing} wanted sync tasks have no waiting RQ job")
    return Load(
        app=app,
        scenario=scenario,
        requests=got["requests"],
        seconds=got["duration_us"] / 1e6,
        non_2xx=got["non2xx"],
        errors=got["errors"],
        p50_ms=got["p50_us"] / 1000,
        p99_ms=got["p99_us"] / 1000,
    )


@dataclass(frozen=True)
class Median:
    """The median of several runs of one app under one scenario."""

    app: str
    scenario: str
    rate: float
    low: float
    high: float
    p50_ms: float
    p99_ms: float


def medians(loads: Sequence[Load]) -> dict[tuple[str, str], Median]:
    """Medians per (app, scenario)."""
    out: dict[tuple[str, str], Median] = {}
    for key in dict.fromkeys((x.app, x.scenario) for x in loads):
        group = [x for x in loads if (x.app, x.scenario) == key]
        rates = [x.rate for x in group]
        out[key] = Median(
            key[0],
            key[1],
            statistics.median(rates),
            min(rates),
            max(rates),
            statistics.median(x.p50_ms for x in group),
            statistics.median(x.p99_ms for x in group),
        )
    return out


def table(results: dict[tuple[str, str], Median]) -> str:
    """The results as a markdown table, each scenario beside the floor."""
    floor = results[(FLOOR, "distinct jobs")]
    lines = [
        "| endpoint | notifications | requests/s (median) | min-max | x floor | p50 ms | p99 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in results.values():
        lines.append(
            f"| {m.app} | {m.scenario} | {m.rate:,.0f} | {m.low:,.0f}-{m.high:,.0f} "
            f"| {m.rate / floor.rate:.2f} | {m.p50_ms:.1f} | {m.p99_ms:.1f} |"
        )
    return "\n".join(lines)


def verdicts(results: dict[tuple[str, str], Median]) -> list[tuple[str, bool, str]]:
    """Each target, whether it was met, and the numbers."""
    floor = results[(FLOOR, "distinct jobs")]
    distinct = results[(APP, "distinct jobs")]
    repeat = results[(APP, "repeats of one job")]
    ratio = distinct.rate / floor.rate
    return [
        (
            f"distinct jobs >= {MIN_VS_FLOOR}x the floor's throughput",
            ratio >= MIN_VS_FLOOR,
            f"{ratio:.2f}x: {distinct.rate:,.0f} vs {floor.rate:,.0f} requests/s",
        ),
        (
            "repeats of one job no slower than distinct jobs",
            repeat.rate >= distinct.rate,
            f"{repeat.rate:,.0f} vs {distinct.rate:,.0f} requests/s",
        ),
        (
            f"p99 <= {MAX_P99_MS:.0f} ms at the benchmark's connections",
            max(distinct.p99_ms, repeat.p99_ms) <= MAX_P99_MS,
            f"{distinct.p99_ms:.1f} ms distinct, {repeat.p99_ms:.1f} ms repeats",
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table; 1 when an acknowledged notification was lost (or,
    with --enforce, when a target is missed)."""
    parser = argparse.ArgumentParser(prog="python -m bench.intake_bench", description=__doc__)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--duration", type=int, default=10, help="seconds per measured run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--enforce", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    try:
        recreate_schema(args.database_url)
    except BenchError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    engine = db.make_engine(args.database_url)
    redis = Redis.from_url(args.redis_url)
    env = {"DATABASE_URL": args.database_url, "REDIS_URL": args.redis_url, "WEBHOOK_TOKEN": TOKEN}
    floor_app = f"bench.intake_floor:create_app({args.database_url!r}, {TOKEN!r})"
    floor_port, app_port = _free_port(), _free_port()
    loads: list[Load] = []
    load_avg: list[float] = []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="intake-bench-") as logs,
            running(FLOOR, web_command(floor_app, floor_port, {}), floor_port, Path(logs)) as fl,
            running(
                APP, web_command("webhooks:create_app()", app_port, env), app_port, Path(logs)
            ) as web,
        ):
            for run in range(args.runs):
                load_avg.append(os.getloadavg()[0])
                loads.append(measure(engine, redis, FLOOR, fl, "distinct jobs", args))
                for scenario in SCRIPTS:
                    loads.append(measure(engine, redis, APP, web, scenario, args))
                print(f"run {run + 1} done", file=sys.stderr)
    except BenchError as exc:
        print(f"FAILED: {exc}")
        return 1
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {FLOOR_TABLE}"))
        engine.dispose()
    results = medians(loads)
    print(table(results))
    print(
        f"\nMedians of {args.runs} run(s) of {args.duration} s; wrk with {args.connections} "
        f"connections, {args.threads} threads, on the same machine; 1-minute load average "
        f"{min(load_avg):.1f} to {max(load_avg):.1f} at the start of each run.\n"
    )
    missed = False
    for target, met, numbers in verdicts(results):
        missed = missed or not met
        print(f"- {target}: {'met' if met else 'MISSED'} ({numbers})")
    return 1 if missed and args.enforce else 0


if __name__ == "__main__":
    sys.exit(main())
