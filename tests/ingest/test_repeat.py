"""A forced repeat of a byte-identical export repeats the last import's outcome without staging
a record, and only where a full import would have done exactly that."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select

from simulator import CloudState, generate_records
from sync.bootstrap import Services
from sync.ingest import repeat, tasks
from sync.models import Observation
from tests.harness import DATASETS_TOML, attempts_of, datasets_from, drain, notify, products_sitemap

pytestmark = pytest.mark.redis

COUNTS = (
    "records_read",
    "missing_key",
    "protected",
    "duplicate_keys",
    "conflicting_duplicates",
    "invalid_records",
    "invalid_detail",
)


def _records(n: int) -> list[dict[str, Any]]:
    return [dict(r) for r in generate_records(n, partitions=("alpha.example", "beta.example"))]


def _synced(
    web: Flask, services: Services, records: list[dict[str, Any]], cloud: CloudState
) -> int:
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, records=records)
    assert notify(web, job_id).status_code == 200
    drain(services)
    return job_id


def _forced(web: Flask, services: Services, job_id: int) -> SimpleNamespace:
    """Want the job's sync again and run it with its download forced."""
    assert notify(web, job_id).status_code == 200
    assert tasks.run_sync(services, f"job-{job_id}", force=True).outcome == "committed"
    return attempts_of(services, f"job-{job_id}")[-1]


def _rows(services: Services) -> dict[str, tuple[Any, ...]]:
    o = Observation.__table__.c
    with services.uow.begin() as session:
        rows = session.execute(
            select(o.observation_key, o.payload_hash, o.source_attempt_id, o.last_changed_at)
        ).all()
    return {r[0]: tuple(r[1:]) for r in rows}


def _downloads(cloud: CloudState, job_id: int) -> int:
    return cloud.requests.count(("GET", f"/api/v1/scraping-job/{job_id}/json"))


def test_a_forced_repeat_of_the_same_bytes_repeats_the_import_and_writes_nothing(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Invalid, keyless and duplicate records included: the repeat's attempt counts what a full
    import counts (everything unchanged), names the import it repeats and rewrites no row."""
    records = _records(30)
    records[3]["title"] = "before\x00after"  # set aside
    records[5]["sku"] = ""  # no entity key
    records[8] = {**records[7], "title": "another title"}  # one key twice, two payloads
    job_id = _synced(web, services, records, cloud)
    (first,) = attempts_of(services, f"job-{job_id}")
    assert (first.inserted, first.updated, first.unchanged) == (27, 0, 0)
    before = _rows(services)
    second = _forced(web, services, job_id)
    third = _forced(web, services, job_id)
    for again in (second, third):
        assert again.repeat_of == first.attempt_id
        assert again.export_digest == first.export_digest
        assert (again.inserted, again.updated, again.unchanged) == (0, 0, 27)
        assert [getattr(again, c) for c in COUNTS] == [getattr(first, c) for c in COUNTS]
    assert (first.records_read, first.invalid_records, first.missing_key) == (30, 1, 1)
    assert (first.duplicate_keys, first.conflicting_duplicates) == (1, 1)
    assert _rows(services) == before
    assert _downloads(cloud, job_id) == 3


def test_a_forced_repeat_after_another_sync_rewrote_a_row_imports_in_full(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Another job of the window changed one of the rows since: only a full import puts this
    job's payload back, so that is what the repeat does. On PostgreSQL that import found the
    other lines known, so it records no digest (elsewhere it parses every line, and records
    it); either way a forced sync after it imports in full too."""
    records = _records(20)
    job_id = _synced(web, services, records, cloud)
    (first,) = attempts_of(services, f"job-{job_id}")
    other = _synced(web, services, [{**records[0], "price": "1.00"}], cloud)
    assert attempts_of(services, f"job-{other}")[-1].updated == 1
    again = _forced(web, services, job_id)
    assert again.repeat_of is None
    assert (again.inserted, again.updated, again.unchanged) == (0, 1, 19)
    knew_lines = services.uow.dialect == "postgresql"
    assert again.export_prefix == first.export_prefix
    assert again.export_digest == (None if knew_lines else first.export_digest)
    assert {row[1] for row in _rows(services).values()} == {first.attempt_id, again.attempt_id}
    third = _forced(web, services, job_id)
    assert third.repeat_of is None
    assert (third.inserted, third.updated, third.unchanged) == (0, 0, 20)
    assert [getattr(third, c) for c in COUNTS] == [getattr(first, c) for c in COUNTS]


def test_a_forced_repeat_whose_rows_were_rewritten_imports_from_its_one_download(
    web: Flask, services: Services, cloud: CloudState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same bytes, longer than the first MiB, but another job rewrote a row since: the rows
    are asked about once the first MiB matches, and the import goes on in full from the lines
    read so far, in the one download."""
    monkeypatch.setattr(repeat, "PREFIX_BYTES", 300)
    records = _records(20)
    job_id = _synced(web, services, records, cloud)
    other = _synced(web, services, [{**records[-1], "price": "1.00"}], cloud)
    assert attempts_of(services, f"job-{other}")[-1].updated == 1
    again = _forced(web, services, job_id)
    assert again.repeat_of is None
    assert (again.records_read, again.inserted, again.updated, again.unchanged) == (20, 0, 1, 19)
    assert _downloads(cloud, job_id) == 2


def test_a_forced_repeat_after_an_import_that_found_rows_unchanged_imports_in_full(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """An import that wrote only some of its keys cannot vouch for the rest: the repeat after it
    imports in full, with the same counts."""
    records = _records(20)
    _synced(web, services, records[:5], cloud)
    job_id = _synced(web, services, records, cloud)
    (first,) = attempts_of(services, f"job-{job_id}")
    assert (first.inserted, first.unchanged) == (15, 5)
    again = _forced(web, services, job_id)
    assert again.repeat_of is None
    assert (again.inserted, again.updated, again.unchanged) == (0, 0, 20)


def test_a_forced_repeat_under_a_changed_datasets_file_imports_in_full(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """The same bytes read under another definition of the dataset may import otherwise."""
    job_id = _synced(web, services, _records(12), cloud)
    (first,) = attempts_of(services, f"job-{job_id}")
    changed = DATASETS_TOML.replace('required = ["sku", "price"]', 'required = ["sku"]')
    assert changed != DATASETS_TOML
    redefined = dataclasses.replace(services, datasets=datasets_from(changed))
    again = _forced(web, redefined, job_id)
    assert again.repeat_of is None
    assert again.export_digest not in (None, first.export_digest)  # no line known: all hashed
    assert (again.inserted, again.updated, again.unchanged) == (0, 0, 12)


def test_an_export_changed_in_its_first_mib_is_imported_from_one_download(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Cloud reports the job as it was but its first record changed: told at the first MiB, the
    lines read so far are imported with the rest, from the one download."""
    records = _records(15)
    job_id = _synced(web, services, records, cloud)
    records[0]["title"] = "changed"
    cloud.set_records(job_id, records)
    again = _forced(web, services, job_id)
    assert again.repeat_of is None
    assert (again.records_read, again.inserted, again.updated, again.unchanged) == (15, 0, 1, 14)
    assert _downloads(cloud, job_id) == 2


def test_an_export_changed_after_its_first_mib_is_downloaded_again_and_imported(
    web: Flask, services: Services, cloud: CloudState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same first MiB, a later record changed: the lines after the first MiB were hashed, not
    kept, so the export is downloaded again and imported in full."""
    monkeypatch.setattr(repeat, "PREFIX_BYTES", 300)
    records = _records(15)
    job_id = _synced(web, services, records, cloud)
    records[-1]["title"] = "changed"
    cloud.set_records(job_id, records)
    again = _forced(web, services, job_id)
    assert again.repeat_of is None
    assert (again.records_read, again.inserted, again.updated, again.unchanged) == (15, 0, 1, 14)
    assert _downloads(cloud, job_id) == 3


def test_the_export_digest_is_of_the_body_however_it_came_in_pieces() -> None:
    """The digest and the first MiB's digest depend on the rules and the body's bytes, not on
    where the download cut it into pieces; a skipped line's bytes count like any other."""
    body = b"".join(b'{"sku": "S%d", "title": "%s"}\n' % (i, b"t" * (i % 97)) for i in range(40000))
    assert len(body) > 2 * repeat.PREFIX_BYTES

    def digests(rules: str, data: bytes, piece: int) -> tuple[str, str]:
        hashed = repeat.ExportDigest(rules)
        for start in range(0, len(data), piece):
            hashed.feed(data[start : start + piece])
        return hashed.digest(), hashed.prefix()

    whole = digests("rules", body, len(body))
    assert whole == digests("rules", body, 7919) == digests("rules", body, 1 << 20)
    head = digests("rules", body[: repeat.PREFIX_BYTES], 4096)[0]
    assert whole[1] == head  # the first MiB's digest is that of the first MiB alone
    changed_late = body[:-2] + b"X\n"
    assert digests("rules", changed_late, 65536)[1] == whole[1]
    assert digests("rules", changed_late, 65536)[0] != whole[0]
    assert digests("other", body, 65536)[0] != whole[0]
    short = digests("rules", b"{}\n", 1)
    assert short[0] == short[1]  # shorter than a MiB: the prefix is the whole

    restarted = repeat.ExportDigest("rules")
    restarted.feed(b"a try that failed")
    restarted.restart()
    restarted.feed(body)
    assert (restarted.digest(), restarted.prefix()) == whole
    assert restarted.recorded() == whole[0]

    # an import that found a line known stops hashing: it records the first MiB's digest alone,
    # whether it stopped before the first MiB came or after
    starts = range(0, len(body), 3000)  # pieces that end on either side of the first MiB
    for stop_at in (0, 3000, repeat.PREFIX_BYTES - 1000, repeat.PREFIX_BYTES + 3000, starts[-1]):
        stopped = repeat.ExportDigest("rules")
        for start in starts:
            if start <= stop_at < start + 3000:
                stopped.stop()
            stopped.feed(body[start : start + 3000])
        assert stopped.stopped
        assert (stopped.recorded(), stopped.prefix()) == (None, whole[1]), stop_at
