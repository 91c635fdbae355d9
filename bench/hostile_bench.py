"""Hostile-export memory benchmark: the worker's peak RSS when Cloud's export carries poison.

Three jobs of 10,000 realistic records each, synced by a fresh ``scrapesync sync JOB_ID``
process (the foreground sync a worker runs) against the simulator on loopback, with the exports
served from memory by this (the driver) process:

- **clean**: 10,000 good records, the reference.
- **hostile**: the same with one NUL in a value, one 50 MB line and one partition value of
  250 characters: 9,997 stored and 3 counted invalid, and the peak must stay within 1.5x clean.
- **gzip bomb**: the same with one line that inflates from about 1 MB of gzip to 1 GiB.

Peak RSS is the child's ``ru_maxrss`` from ``wait4``. Every sync is checked, not only measured:
committed, records stored and records counted invalid with their reasons.

    python -m bench.hostile_bench                # three runs of each, medians
    python -m bench.hostile_bench --runs 1

The benchmark owns its database (default ``scrapesync_bench_hostile``): it drops and re-migrates
every table (only in a database whose name contains "bench"). It needs no Redis.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select

from bench.exports import ExportServer, MemoryExports, RenderedExport
from bench.sync_bench import recreate_schema
from simulator import CloudState, generate_records
from simulator import create_app as create_simulator
from sync import db
from sync.models import Attempt, Observation

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/scrapesync_bench_hostile"
RECORDS = 10_000
API_TOKEN = "bench-token"  # noqa: S105 - the simulator's token, not a secret
DATASETS = """
[datasets.products]
sitemap = "products"
entity_key = ["sku"]
window = "job"
partition = "retailer"
required = ["sku", "price"]
"""
PIECE = 1 << 20


class BenchError(Exception):
    """The sync did not do its job, whatever its memory."""


@dataclass(frozen=True)
class Scenario:
    """One kind of export: its name, what must be stored and what must be counted invalid."""

    name: str
    stored: int
    invalid: dict[int, str]


SCENARIOS = (
    Scenario("clean", RECORDS, {}),
    Scenario(
        "hostile",
        RECORDS - 3,
        {101: "nul_character", 5_001: "line_too_long", 9_001: "partition_too_long"},
    ),
    Scenario("gzip bomb", RECORDS - 1, {5_001: "line_too_long"}),
)


def _lines(name: str) -> Iterator[bytes]:
    """The export of a scenario as JSON Lines, in pieces; a huge line comes in 1 MiB pieces."""
    records = generate_records(RECORDS, partitions=("alpha.example", "beta.example"))
    for index, generated in enumerate(records):
        record = dict(generated)
        if name == "hostile" and index == 100:
            record["title"] = "nul\x00here"
        if name == "hostile" and index == 9_000:
            record["retailer"] = "p" * 250
        if name != "clean" and index == 5_000:
            size = 50_000_000 if name == "hostile" else 1 << 30
            rest = {k: v for k, v in record.items() if k != "title"}
            yield (json.dumps(rest)[:-1] + ', "title": "').encode()
            for _ in range(size // PIECE):
                yield b"d" * PIECE
            yield b'"}\n'
            continue
        yield json.dumps(record).encode() + b"\n"


def render(name: str) -> RenderedExport:
    """Gzip a scenario's export piece by piece (the 1 GiB line is never built whole here)."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    chunks: list[bytes] = []
    raw = 0
    for piece in _lines(name):
        raw += len(piece)
        out = compressor.compress(piece)
        if out:
            chunks.append(out)
    chunks.append(compressor.flush())
    return RenderedExport(tuple(chunks), RECORDS, raw)


def sync_in_child(env: dict[str, str], job_id: int) -> int:
    """Run ``scrapesync sync JOB_ID`` in a fresh process; its peak RSS in KiB."""
    scrapesync = str(Path(sys.executable).parent / "scrapesync")
    child = subprocess.Popen(
        [scrapesync, "sync", str(job_id)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _pid, status, usage = os.wait4(child.pid, 0)
    out = child.stdout.read().decode() if child.stdout else ""
    err = child.stderr.read().decode() if child.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise BenchError(f"scrapesync sync {job_id} failed: {out[-2000:]} {err[-2000:]}")
    return int(usage.ru_maxrss)


def check(database_url: str, job_id: int, scenario: Scenario) -> None:
    """The job committed with what it must store and count invalid."""
    engine = db.make_engine(database_url)
    try:
        with engine.connect() as conn:
            attempt = conn.execute(
                select(Attempt.outcome, Attempt.invalid_records, Attempt.invalid_detail)
                .where(Attempt.job_id == job_id)
                .order_by(Attempt.started_at.desc())
                .limit(1)
            ).one()
            stored = conn.execute(
                select(func.count()).where(Observation.source_job_id == job_id)
            ).scalar_one()
    finally:
        engine.dispose()
    lines = {x["line"]: x["reason"] for x in (attempt.invalid_detail or {}).get("lines", [])}
    if attempt.outcome != "committed" or stored != scenario.stored or lines != scenario.invalid:
        raise BenchError(
            f"{scenario.name}: outcome {attempt.outcome}, {stored} stored, invalid {lines}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Measure each scenario ``--runs`` times and print the medians as a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    recreate_schema(args.database_url)
    state = CloudState(api_token=API_TOKEN)
    sitemap = state.add_sitemap("products", start_urls=["https://alpha.example/"])
    app = MemoryExports(create_simulator(state), "/api/v1", on_call=lambda: None)
    server = ExportServer(app, "/api/v1")
    peaks: dict[str, list[int]] = {s.name: [] for s in SCENARIOS}
    sizes: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory() as folder:
        datasets = Path(folder) / "datasets.toml"
        datasets.write_text(DATASETS)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": folder,
            "DATABASE_URL": args.database_url,
            "WEBSCRAPER_API_URL": server.api_url,
            "WEBSCRAPER_API_TOKEN": API_TOKEN,
            "SCRAPESYNC_DATASETS": str(datasets),
        }
        try:
            for scenario in SCENARIOS:
                export = render(scenario.name)
                sizes[scenario.name] = (export.gzip_bytes, export.raw_bytes)
                for _ in range(args.runs):
                    job_id = state.create_job(sitemap)
                    state.run_job(job_id, n=RECORDS)
                    app.set(job_id, export)
                    peaks[scenario.name].append(sync_in_child(env, job_id))
                    check(args.database_url, job_id, scenario)
                    app.set(job_id, None)
                del export
        finally:
            server.close()
            state.close()
    clean = statistics.median(peaks["clean"])
    print("| export | gzip MiB | inflated MiB | stored | invalid | peak RSS MiB | x clean |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    within = True
    for scenario in SCENARIOS:
        peak = statistics.median(peaks[scenario.name])
        gz, raw = sizes[scenario.name]
        ratio = peak / clean
        within = within and ratio <= 1.5
        print(
            f"| {scenario.name} | {gz / 2**20:.1f} | {raw / 2**20:.0f} | {scenario.stored:,} | "
            f"{len(scenario.invalid)} | {peak / 1024:.0f} | {ratio:.2f} |"
        )
    print(f"\npeak RSS within 1.5x of the clean job: {'yes' if within else 'NO'}")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
