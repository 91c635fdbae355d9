"""``scrapesync export``: the published dataset from the database, in a stable order, under a
versioned name, with a manifest whose hashes and counts match the file."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from flask import Flask
from sqlalchemy import Engine, inspect

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from tests.acceptance.flow import (
    DATASETS_TOML,
    finished_job,
    product_records,
    run_id_of,
    settle,
    use_datasets,
)
from tests.datasets.published import drop_tables
from tests.harness import notify

pytestmark = pytest.mark.redis


def accepted(web: Flask, services: Services, cloud: CloudState, n: int = 30) -> str:
    """Sync and publish a job of ``n`` records shuffled out of key order; its run id."""
    records = product_records(n)
    records.reverse()
    job_id = finished_job(cloud, records)
    notify(web, job_id)
    settle(services)
    return run_id_of(job_id)


def test_the_export_command_writes_jsonl_in_key_order_with_a_manifest(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """One line per observation ordered by entity key, a versioned name, and a manifest whose
    sha256, byte count and record count describe that file; exporting twice is identical."""
    run_id = accepted(web, services, cloud)
    result = CliRunner().invoke(main, ["export", "products", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    path = tmp_path / f"products.{run_id}.r1.jsonl"
    assert str(path) in result.output
    lines = path.read_bytes().splitlines()
    skus = [json.loads(line)["sku"] for line in lines]
    assert skus == sorted(skus)
    assert len(skus) == 30
    manifest = json.loads((tmp_path / f"products.{run_id}.r1.manifest.json").read_text())
    assert manifest["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["bytes"] == path.stat().st_size
    assert (manifest["records"], manifest["run_id"], manifest["format"]) == (30, run_id, "jsonl")
    assert sum(manifest["partitions"].values()) == 30
    assert manifest["generated_at"]
    assert manifest["published_at"]
    first = path.read_bytes()
    assert CliRunner().invoke(main, ["export", "products", "--out", str(tmp_path)]).exit_code == 0
    assert path.read_bytes() == first


def test_csv_exports_the_same_records_with_a_header(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """CSV's header is the typed columns (entity_key, then one text column per field for a
    dataset that names none), with the same records (same records hash) as JSON Lines."""
    accepted(web, services, cloud)
    target = tmp_path / "out.csv"
    result = CliRunner().invoke(
        main, ["export", "products", "--format", "csv", "--out", str(target)]
    )
    assert result.exit_code == 0, result.output
    with target.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["entity_key", "price", "retailer", "sku", "title", "url"]
    assert len(rows) == 30
    assert all(row["entity_key"] == row["sku"] for row in rows)
    assert rows[0] == {"entity_key": rows[0]["sku"], **product_records(30)[0]}
    csv_manifest = json.loads((tmp_path / "out.csv.manifest.json").read_text())
    assert csv_manifest["file"] == "out.csv"
    assert CliRunner().invoke(main, ["export", "products", "--out", str(tmp_path)]).exit_code == 0
    jsonl_manifest = next(
        json.loads(p.read_text()) for p in tmp_path.glob("products.*.r1.manifest.json")
    )
    assert csv_manifest["records_sha256"] == jsonl_manifest["records_sha256"]
    assert csv_manifest["sha256"] != jsonl_manifest["sha256"]


def test_both_formats_in_one_folder_keep_a_manifest_each(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """The CSV of a run written where its JSON Lines are (a file destination's folder) leaves
    their manifest as it was: each file keeps the manifest that names and hashes it."""
    accepted(web, services, cloud)
    for fmt in ("jsonl", "csv"):
        result = CliRunner().invoke(
            main, ["export", "products", "--format", fmt, "--out", str(tmp_path)]
        )
        assert result.exit_code == 0, result.output
    manifests = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.manifest.json")}
    assert len(manifests) == 2
    for manifest in manifests.values():
        data = (tmp_path / manifest["file"]).read_bytes()
        assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert sorted(m["format"] for m in manifests.values()) == ["csv", "jsonl"]


def test_nothing_published_or_a_rejected_run_is_refused_with_the_reason(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """No published run yet, an unknown run, or a rejected run: a clear error, no file."""
    nothing = CliRunner().invoke(main, ["export", "products", "--out", str(tmp_path)])
    assert nothing.exit_code != 0
    assert "has no published run yet" in nothing.output
    bad = finished_job(cloud, product_records(100), jobs_empty=50)
    notify(web, bad)
    settle(services)
    refused = CliRunner().invoke(
        main, ["export", "products", "--run", run_id_of(bad), "--out", str(tmp_path)]
    )
    assert refused.exit_code != 0
    assert "is rejected: only accepted runs are exported" in refused.output
    unknown = CliRunner().invoke(main, ["export", "products", "--run", "nope"])
    assert "has no run 'nope'" in unknown.output
    assert list(tmp_path.iterdir()) == []


TYPED = DATASETS_TOML.replace(
    '[datasets.products.quality]\nparsers = { price = "number" }\n',
    """[datasets.products.columns]
sku = "text"
title = "text"
price = "numeric"
shop = { field = "retailer", type = "text" }
""",
)


def test_exports_carry_the_typed_columns_with_cast_values(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """A dataset with columns: CSV header and JSON keys are entity_key and the columns in the
    file's order, numerics cast ("$1,299.00" -> 1299.00), a failed cast empty or null and
    counted per column in the manifest."""
    services = use_datasets(services, TYPED)
    records = product_records(100)
    records[0]["price"] = "$1,299.00"
    records[1]["price"] = "n/a"
    notify(web, finished_job(cloud, records))
    settle(services)
    result = CliRunner().invoke(
        main, ["export", "products", "--format", "csv", "--out", str(tmp_path / "p.csv")]
    )
    assert result.exit_code == 0, result.output
    with (tmp_path / "p.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["entity_key", "sku", "title", "price", "shop"]
    by_key = {row[0]: row for row in rows[1:]}
    first, second = records[0], records[1]
    assert by_key[first["sku"]] == [
        first["sku"],
        first["sku"],
        first["title"],
        "1299.00",
        first["retailer"],
    ]
    assert by_key[second["sku"]][3] == ""
    manifest = json.loads((tmp_path / "p.csv.manifest.json").read_text())
    assert manifest["cast_failures"] == {"price": 1}
    assert [c["name"] for c in manifest["columns"]] == ["sku", "title", "price", "shop"]
    assert manifest["columns"][3] == {"name": "shop", "field": "retailer", "type": "text"}

    jsonl = CliRunner().invoke(main, ["export", "products", "--out", str(tmp_path / "p.jsonl")])
    assert jsonl.exit_code == 0, jsonl.output
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    typed = {line["entity_key"]: line for line in lines}
    assert list(typed[first["sku"]]) == ["entity_key", "sku", "title", "price", "shop"]
    assert typed[first["sku"]]["price"] == 1299
    assert typed[second["sku"]]["price"] is None
    third = records[2]
    assert typed[third["sku"]]["price"] == float(third["price"])
    assert typed[third["sku"]]["shop"] == third["retailer"]


def test_an_export_has_the_columns_the_datasets_tables_hold(
    web: Flask, services: Services, cloud: CloudState, engine: Engine, tmp_path: Path
) -> None:
    """The header is the columns of datasets.products as publication built them, also once the
    datasets file names a column that ``db upgrade`` has not added to the tables yet."""
    services = use_datasets(services, TYPED)
    accepted(web, services, cloud)
    held = [c["name"] for c in inspect(engine).get_columns(*_current_table(engine, services))]
    services = use_datasets(
        services, TYPED.replace('price = "numeric"\n', 'price = "numeric"\nurl = "text"\n')
    )
    target = tmp_path / "registered.csv"
    result = CliRunner().invoke(
        main, ["export", "products", "--format", "csv", "--out", str(target)]
    )
    assert result.exit_code == 0, result.output
    with target.open(newline="") as handle:
        header = next(csv.reader(handle))
    assert header == ["entity_key", "sku", "title", "price", "shop"]
    assert header == held[: len(header)]


def _current_table(engine: Engine, services: Services) -> tuple[str, str | None]:
    """The name and schema of datasets.products on this database."""
    if engine.dialect.name == "postgresql":
        return "products", services.settings.data_schema
    return "datasets_products", None


@pytest.fixture(autouse=True)
def _forget_the_tables(services: Services, engine: Engine) -> Iterator[None]:
    """Tests here change the dataset's columns: leave it without tables or registered columns,
    for the next test to build its own."""
    yield
    drop_tables(engine, services.settings.data_schema)
