"""Exports and signing secrets handle hostile text: no CSV cell or header runs as a formula,
JSON Lines keep every byte, and a failed export is one error line."""

from __future__ import annotations

import base64
import csv
import json
import os
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from flask import Flask

from config.columns import column_name_for
from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from sync.delivery import destinations
from tests.acceptance.flow import finished_job, product_records, run_id_of, settle
from tests.fakes import verify_signature
from tests.harness import notify

pytestmark = pytest.mark.redis

HOSTILE = {
    "title": '=HYPERLINK("http://evil.example","click")',
    "note": "+1+cmd|' /C calc'!A0",
    "dash": "-2+3",
    "at": "@SUM(A1:A9)",
    "tab": "\t=1+1",
    "cr": "\r=1+1",
    "=HEADER()": "header cell",
    "discount": "-12.5",
}


def _publish_hostile(web: Flask, services: Services, cloud: CloudState) -> str:
    records = product_records(12)
    for record in records:  # in every record, so Cloud's column checks pass
        record.update(HOSTILE)
    job_id = finished_job(cloud, records)
    notify(web, job_id)
    settle(services)
    return run_id_of(job_id)


def test_csv_cells_and_headers_that_start_a_formula_are_neutralised(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """Text starting with = + - @ TAB or CR gets a leading quote in every cell; a plain
    negative number stays a number. The header is the dataset's column names, which a hostile
    field name cannot make a formula of (the field "=HEADER()" is the column "header")."""
    run_id = _publish_hostile(web, services, cloud)
    result = CliRunner().invoke(
        main, ["export", "products", "--format", "csv", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    with (tmp_path / f"products.{run_id}.r1.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    header, body = rows[0], rows[1:]
    assert "header" in header
    assert all(name[:1] not in ("=", "+", "-", "@", "\t", "\r", "'") for name in header)
    assert len(body) == 12
    for hostile in (dict(zip(header, row, strict=True)) for row in body):
        for name, value in HOSTILE.items():
            expected = value if name in ("discount", "=HEADER()") else "'" + value
            assert hostile[column_name_for(name)] == expected, name
    for row in body:
        for cell in row:
            assert cell[:1] not in ("=", "+", "@", "\t", "\r"), cell


def test_json_lines_keep_hostile_text_byte_for_byte(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """JSON Lines are not a spreadsheet: every text value is exported exactly as scraped,
    under its column's name, in the dataset's column order."""
    run_id = _publish_hostile(web, services, cloud)
    result = CliRunner().invoke(main, ["export", "products", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / f"products.{run_id}.r1.jsonl").read_bytes().splitlines()
    assert len(lines) == 12
    for line in lines:
        record = json.loads(line)
        assert {name: record[column_name_for(name)] for name in HOSTILE} == HOSTILE
        assert next(iter(record)) == "entity_key"
        compact = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        assert compact.encode() == line


@pytest.mark.parametrize("where", ["inside-a-file", "unwritable"])
def test_an_export_that_cannot_be_written_is_one_error_line(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path, where: str
) -> None:
    """--out below a regular file, or in a folder nobody may write: one ``error:`` line naming
    the place, no traceback, a non-zero exit."""
    _publish_hostile(web, services, cloud)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    if where == "inside-a-file":
        out = blocker / "exports"
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        writable = os.access(locked, os.W_OK)  # root may write anywhere but in /proc
        out = Path("/proc/scrapesync-exports") if writable else locked / "exports"
    result = CliRunner().invoke(main, ["export", "products", "--out", str(out)])
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.output.startswith("error: cannot write the export")
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_a_whsec_secret_without_base64_padding_signs_like_its_padded_spelling() -> None:
    """``whsec_`` secrets are accepted without their ``=`` padding, as the official libraries
    accept them; the key is the same as the padded spelling's."""
    key = b"twenty-byte-key-0123"
    padded = "whsec_" + base64.b64encode(key).decode()
    assert padded.endswith("=")
    unpadded = padded.rstrip("=")
    assert destinations.signing_key(unpadded) == key
    body = b'{"id":"evt_1"}'
    headers = httpx.Headers(destinations.signed_headers(unpadded, "evt_1", 1_800_000_000, body))
    assert verify_signature(padded, headers, body)
