"""One bad record, or one strange answer from Cloud, never sinks a job: poison records are set
aside and counted with their reason and line, the rest is stored, and what retrying cannot fix
is settled at once instead of after every retry."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from flask import Flask
from sqlalchemy import select

from simulator import CloudState, generate_records
from simulator import create_app as create_simulator
from sync import bootstrap
from sync.bootstrap import Services
from sync.ingest import tasks
from sync.models import Observation, Run, ScrapingJob
from tests.harness import (
    at_time,
    attempts_of,
    drain,
    notify,
    observation_count,
    products_sitemap,
    task_of,
)

pytestmark = pytest.mark.redis


def _records(n: int) -> list[dict[str, Any]]:
    return [dict(r) for r in generate_records(n, partitions=("alpha.example", "beta.example"))]


def _finished(cloud: CloudState, records: list[dict[str, Any]]) -> int:
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, records=records)
    return job_id


def _synced(web: Flask, services: Services, job_id: int) -> SimpleNamespace:
    """Notify, let the worker run every queued job, and return the sync's last attempt."""
    assert notify(web, job_id).status_code == 200
    drain(services)
    return attempts_of(services, f"job-{job_id}")[-1]


def _reasons(attempt: SimpleNamespace) -> dict[int, str]:
    return {line["line"]: line["reason"] for line in attempt.invalid_detail["lines"]}


def test_records_with_a_nul_or_an_overlong_partition_are_set_aside_and_the_rest_stored(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A NUL in a value, a NUL in a key and a 300-character partition: those three lines are
    counted invalid with their reasons and line numbers; the other records commit at once."""
    records = _records(40)
    records[4]["title"] = "before\x00after"
    records[9]["bad\x00key"] = "x"
    records[14]["retailer"] = "r" * 300
    job_id = _finished(cloud, records)
    attempt = _synced(web, services, job_id)
    assert attempt.outcome == "committed"
    assert len(attempts_of(services, f"job-{job_id}")) == 1
    assert observation_count(services) == 37
    assert attempt.invalid_records == 3
    assert _reasons(attempt) == {5: "nul_character", 10: "nul_character", 15: "partition_too_long"}
    detail = attempt.invalid_detail
    assert sum(sum(r.values()) for r in detail["partitions"].values()) == 2  # partition known
    assert detail["unplaced"] == {"partition_too_long": 1}
    assert task_of(services, f"job-{job_id}").state == "committed"


def test_a_partition_full_of_poison_is_quarantined_by_acceptance(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Invalid records count against their partition: a partition whose records are mostly
    poison fails acceptance with an invalid_records reason, the others pass."""
    records = _records(40)
    for record in records:
        if record["retailer"] == "beta.example":
            record["title"] = "\x00"
    job_id = _finished(cloud, records)
    attempt = _synced(web, services, job_id)
    assert attempt.outcome == "committed"
    with services.uow.begin() as session:
        run = session.execute(select(Run)).scalar_one()
        codes = [r["code"] for r in run.reasons]
        partitions = {r.get("partition") for r in run.reasons}
    assert "partition_quarantined" in codes
    assert "beta.example" in partitions
    assert "alpha.example" not in partitions


def test_counters_beyond_32_bits_are_stored_as_cloud_reported_them(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A page counter over 2**31 no longer fails every attempt: the job commits and keeps it."""
    job_id = _finished(cloud, _records(10))
    cloud.job(job_id).jobs_scheduled = 2**40
    cloud.job(job_id).jobs_executed = 2**40
    attempt = _synced(web, services, job_id)
    assert attempt.outcome == "committed"
    with services.uow.begin() as session:
        assert session.get(ScrapingJob, job_id).jobs_scheduled == 2**40  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("field", "value"),
    [("time_created", 1e20), ("jobs_failed", 2**70), ("stored_record_count", -5)],
)
def test_a_job_cloud_describes_impossibly_is_quarantined_at_once(
    web: Flask, services: Services, cloud: CloudState, field: str, value: float
) -> None:
    """time_created = 1e20 or a counter beyond 64 bits: one attempt, then quarantined with the
    reason; never twelve retries ending dead."""
    job_id = _finished(cloud, _records(10))
    setattr(cloud.job(job_id), field, value)
    attempt = _synced(web, services, job_id)
    task = task_of(services, f"job-{job_id}")
    assert task.state == "quarantined"
    assert task.failure_count == 0
    assert len(attempts_of(services, f"job-{job_id}")) == 1
    assert field in task.last_error
    assert attempt.error_class == "UnusableJobError"


@pytest.mark.parametrize("status", ["", "archived-by-robots"])
def test_a_job_in_a_status_nobody_knows_is_quarantined_after_the_limit(
    web: Flask, services: Services, cloud: CloudState, status: str
) -> None:
    """An empty or unknown status is polled like a running job until the configured time has
    passed since the first attempt; then the task is quarantined with the reason."""
    job_id = _finished(cloud, _records(10))
    cloud.job(job_id).status = status
    key = f"job-{job_id}"
    notify(web, job_id)
    first = tasks.run_sync(services, key)
    assert first.outcome == "retry_wait"
    limit = services.settings.unknown_status_seconds
    early = tasks.run_sync(at_time(services, first.next_attempt_at + timedelta(seconds=1)), key)
    assert early.outcome == "retry_wait"
    started = attempts_of(services, key)[0].started_at
    late = tasks.run_sync(at_time(services, started + timedelta(seconds=limit + 1)), key)
    assert late.outcome == "quarantined"
    assert "unknown status" in task_of(services, key).last_error
    assert observation_count(services) == 0


def test_a_job_answered_with_another_jobs_id_is_never_committed(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Cloud answers GET scraping-job/A with job B: nothing of B's export is stored as A's."""
    asked = _finished(cloud, _records(10))
    other = _finished(cloud, _records(20))
    body = json.dumps({"success": True, "data": cloud.job(other).as_api()})
    cloud.inject_fault(
        "status",
        path_contains=f"scraping-job/{asked}",
        times=None,
        status=200,
        body=body,
        content_type="application/json",
    )
    attempt = _synced(web, services, asked)
    assert attempt.outcome == "retry_wait"
    assert f"answered with scraping job {other}" in attempt.error
    assert observation_count(services) == 0


def test_a_custom_id_links_a_job_to_a_run_only_when_the_sitemap_matches(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A job of an unrelated sitemap that carries an existing run's id as custom_id is not
    attached to that run."""
    first = _finished(cloud, _records(10))
    _synced(web, services, first)
    with services.uow.begin() as session:
        (run_id,) = session.execute(select(Run.run_id)).scalars()
    other_sitemap = cloud.add_sitemap("unrelated", start_urls=["https://other.example/"])
    stranger = cloud.create_job(other_sitemap, custom_id=run_id)
    cloud.run_job(stranger, records=_records(5))
    attempt = _synced(web, services, stranger)
    assert attempt.outcome == "ignored"
    assert "feeds no dataset" in attempt.error
    with services.uow.begin() as session:
        sources = set(session.execute(select(Observation.source_job_id)).scalars())
    assert sources == {first}


def test_the_configured_limits_set_aside_long_lines_and_large_records(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """With SCRAPESYNC_MAX_RECORD_LINE_BYTES and SCRAPESYNC_MAX_RECORD_BYTES set low, a line
    over the first and a record over the second are counted invalid; the rest commit."""
    settings = replace(services.settings, max_record_line_bytes=4000, max_record_bytes=1500)
    limited = bootstrap.build(
        settings,
        uow=services.uow,
        datasets=services.datasets,
        redis=services.redis,
        transport=httpx.WSGITransport(app=create_simulator(cloud)),
    )
    bootstrap.use(limited)
    try:
        records = _records(10)
        records[2]["title"] = "t" * 5000
        records[6]["title"] = "u" * 2000
        job_id = _finished(cloud, records)
        attempt = _synced(web, limited, job_id)
    finally:
        bootstrap.use(services)
    assert attempt.outcome == "committed"
    assert _reasons(attempt) == {3: "line_too_long", 7: "record_too_large"}
    assert observation_count(services) == 8


# --- oversize lines and gzip bombs ----------------------------------------------------------------


class BombingCloud(httpx.BaseTransport):
    """Cloud as the simulator plays it, except that one job's export is a hand-made gzip body
    (a hostile or broken Cloud)."""

    def __init__(self, cloud: CloudState, job_id: int, body: bytes) -> None:
        self.inner = httpx.WSGITransport(app=create_simulator(cloud))
        self.path = f"/scraping-job/{job_id}/json"
        self.body = body
        self.served = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Serve the hand-made export, pass everything else to the simulator."""
        if request.url.path.endswith(self.path):
            self.served += 1
            return httpx.Response(
                200,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
                stream=httpx.ByteStream(self.body),
            )
        return self.inner.handle_request(request)


def _gzip_stream(parts: Iterator[bytes]) -> bytes:
    """Gzip pieces one by one, so a huge line is never built in memory here either."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return b"".join(compressor.compress(p) for p in parts) + compressor.flush()


def _bomb_export(records: list[dict[str, Any]], *, bomb_at: int, bomb_bytes: int) -> bytes:
    def parts() -> Iterator[bytes]:
        for i, record in enumerate(records):
            if i == bomb_at:
                yield b'{"sku": "'
                for _ in range(bomb_bytes // (1 << 20)):
                    yield b"A" * (1 << 20)
                yield b'"}\n'
            yield json.dumps(record).encode() + b"\n"

    return _gzip_stream(parts())


@pytest.fixture
def bombed(services: Services, cloud: CloudState) -> Iterator[tuple[Services, int, BombingCloud]]:
    """Services whose Cloud serves a 64 MiB line (about 64 KB of gzip) inside a job's export,
    with the record-line limit at its default."""
    records = _records(30)
    job_id = _finished(cloud, records)
    transport = BombingCloud(cloud, job_id, _bomb_export(records, bomb_at=7, bomb_bytes=64 << 20))
    built = bootstrap.build(
        services.settings,
        uow=services.uow,
        datasets=services.datasets,
        redis=services.redis,
        transport=transport,
    )
    bootstrap.use(built)
    yield built, job_id, transport
    bootstrap.use(services)


def test_a_gzip_bomb_line_is_streamed_past_and_counted_invalid(
    web: Flask, bombed: tuple[Services, int, BombingCloud]
) -> None:
    """A line that inflates far past the limit is never held: it is counted invalid as
    line_too_long at its line number, and every other record is stored."""
    services, job_id, transport = bombed
    attempt = _synced(web, services, job_id)
    assert transport.served == 1
    assert attempt.outcome == "committed"
    assert attempt.records_read == 31
    assert observation_count(services) == 30
    assert _reasons(attempt) == {8: "line_too_long"}
    assert (
        str(services.settings.max_record_line_bytes) in attempt.invalid_detail["lines"][0]["detail"]
    )


@pytest.mark.slow
def test_ten_thousand_records_with_three_poisoned_commit_with_three_counted_invalid(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """10,000 records with one NUL value, one 50 MB line and one overlong partition: 9,997
    stored, 3 counted invalid with their reasons, the job committed and its run accepted.
    (The worker's peak memory for this job is measured by bench/hostile_bench.py.)"""
    records = _records(10_000)
    records[100]["title"] = "nul\x00here"
    records[5_000]["title"] = "d" * 50_000_000
    records[9_000]["retailer"] = "p" * 250
    job_id = _finished(cloud, records)
    attempt = _synced(web, services, job_id)
    assert attempt.outcome == "committed"
    assert attempt.records_read == 10_000
    assert observation_count(services) == 9_997
    assert attempt.invalid_records == 3
    assert _reasons(attempt) == {
        101: "nul_character",
        5_001: "line_too_long",
        9_001: "partition_too_long",
    }
    with services.uow.begin() as session:
        run = session.execute(select(Run)).scalar_one()
        assert run.state in ("accepted", "published"), run.reasons
