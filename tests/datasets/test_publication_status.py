"""Status shows what each dataset's last publication changed: in ``scrapesync status``, its
JSON, the status page and ``GET /api/runs``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine

from config.datasets import Datasets
from scrapesync.cli import main
from sync.bootstrap import Services
from tests.datasets.published import (
    DATASETS_TOML,
    A,
    B,
    PublishedProducts,
    create_tables,
    drop_tables,
)
from tests.datasets.test_diff import feed
from tests.harness import datasets_from
from webhooks import create_app

pytestmark = pytest.mark.redis

STATUS_TOKEN = "status-token-5a4b3c"


@pytest.fixture
def datasets() -> Datasets:
    """Products with typed columns and watched price (1%) and title."""
    return datasets_from(DATASETS_TOML)


@pytest.fixture
def two(services: Services, engine: Engine, datasets: Datasets) -> Iterator[PublishedProducts]:
    """A published as the baseline, then B: 1 added, 1 removed, 2 changed."""
    tables = create_tables(engine, services.settings.data_schema)
    products = PublishedProducts(services.uow, tables)
    products.run(A, "2026-12-01")
    products.run(B, "2026-12-02")
    products.publication(A, feed(datasets, None, A), current=False)
    products.publication(B, feed(datasets, A, B), current=True)
    yield products
    drop_tables(engine, services.settings.data_schema)


def test_status_json_and_table_show_the_last_publications_change_counts(
    two: PublishedProducts,
) -> None:
    """--json: the dataset's last publication with its counts, and each published run's own;
    the table: one line per dataset saying what its publication changed."""
    result = CliRunner().invoke(main, ["status", "--json"])
    assert result.exit_code == 0, result.output
    values = json.loads(result.output)
    (products,) = values["publications"]
    assert (products["dataset"], products["run_id"], products["current"]) == ("products", B, True)
    assert products["changes"] == {
        "added": 1,
        "removed": 1,
        "changed": 2,
        "baseline": False,
        "previous_run_id": A,
    }
    runs = {run["run_id"]: run for run in values["runs"]}
    assert runs[A]["changes"] == {
        "added": 4,
        "removed": 0,
        "changed": 0,
        "baseline": True,
        "previous_run_id": None,
    }
    table = CliRunner().invoke(main, ["status"])
    assert table.exit_code == 0, table.output
    assert f"products: published {B} (1 added, 1 removed, 2 changed since {A})" in (
        table.output.splitlines()
    )


def test_status_of_one_run_says_whether_readers_get_it(two: PublishedProducts) -> None:
    """`status RUN`: the dataset's published run says so; a run a later one replaced reads
    "previously published", as in the status table."""
    current = CliRunner().invoke(main, ["status", B])
    replaced = CliRunner().invoke(main, ["status", A])
    assert current.exit_code == replaced.exit_code == 0, current.output + replaced.output
    assert "state: published (the dataset's published run), revision 1" in current.output
    assert "state: published (previously published), revision 1" in replaced.output


def test_a_baseline_and_a_withdrawal_read_as_such(
    services: Services, engine: Engine, datasets: Datasets
) -> None:
    """The first publication is a baseline with its size; a dataset whose last publication was
    withdrawn says so."""
    tables = create_tables(engine, services.settings.data_schema)
    try:
        products = PublishedProducts(services.uow, tables)
        products.run(A, "2026-12-01")
        products.publication(A, feed(datasets, None, A), current=False)
        table = CliRunner().invoke(main, ["status"])
    finally:
        drop_tables(engine, services.settings.data_schema)
    assert f"products: withdrawn {A} (first publication, a baseline of 4 entities)" in (
        table.output.splitlines()
    )


def test_a_run_published_again_counts_since_its_last_publication(
    services: Services, engine: Engine, datasets: Datasets
) -> None:
    """Cloud's "Continue" publishes the same run again: the table and the page say its counts
    are since its last publication, not since a run that reads like another one."""
    tables = create_tables(engine, services.settings.data_schema)
    try:
        products = PublishedProducts(services.uow, tables)
        products.run(A, "2026-12-01")
        products.publication(A, feed(datasets, None, A), current=False)
        again = dataclasses.replace(feed(datasets, B, A), previous_run_id=A)
        products.publication(A, again, current=True)
        table = CliRunner().invoke(main, ["status"])
        settings = dataclasses.replace(services.settings, status_token=STATUS_TOKEN)
        client = create_app(dataclasses.replace(services, settings=settings)).test_client()
        page = client.get("/status", headers={"Authorization": f"Bearer {STATUS_TOKEN}"})
    finally:
        drop_tables(engine, services.settings.data_schema)
    counts = f"{len(again.added)} added, {len(again.removed)} removed, {len(again.changed)} changed"
    assert f"products: published {A} ({counts} since its last publication)" in (
        table.output.splitlines()
    )
    row = page.get_data(as_text=True).split('<tr class="publication" data-dataset="products">')[1]
    cells = [c.split(">", 1)[1].split("<", 1)[0] for c in row.split("</tr>")[0].split("<td")[1:]]
    assert cells[-1] == "its last publication"


def test_the_status_page_and_api_runs_carry_the_counts(
    two: PublishedProducts, services: Services
) -> None:
    """/status has a row per published dataset with its counts; /api/runs the same values."""
    settings = dataclasses.replace(services.settings, status_token=STATUS_TOKEN)
    client = create_app(dataclasses.replace(services, settings=settings)).test_client()
    headers = {"Authorization": f"Bearer {STATUS_TOKEN}"}
    page = client.get("/status", headers=headers).get_data(as_text=True)
    row = page.split('<tr class="publication" data-dataset="products">')[1].split("</tr>")[0]
    cells = [c.split(">", 1)[1].split("<", 1)[0] for c in row.split("<td")[1:]]
    assert cells[3:] == ["1", "1", "2", A]
    assert B in row
    api = client.get("/api/runs", headers=headers).json
    assert api["publications"][0]["changes"]["changed"] == 2
