"""The typed-table tests' shared vocabulary: the products dataset with typed columns and a
watch list, and helpers that read its tables back as plain values."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from sync.bootstrap import Services
from sync.datasets import schema
from sync.datasets.tables import DatasetTables
from tests.acceptance.flow import DATASETS_TOML

TYPED = """
[datasets.products.columns]
sku = "text"
title = "text"
price = "numeric"
retailer = "text"

[datasets.products.watch]
price = { percent = 1 }
title = true
"""


def typed_datasets(*, policy: str = "reject", quality: str = "", columns: str = TYPED) -> str:
    """The acceptance tests' products dataset (one run per job, a signed HTTP destination) with
    typed columns and a watch list; no parser on price, so only its cast judges it."""
    text = DATASETS_TOML.replace('policy = "reject"', f'policy = "{policy}"')
    text = text.replace('parsers = { price = "number" }', f"use_cloud_quality = false\n{quality}")
    head, _, destinations = text.partition("[[datasets.products.destinations]]")
    return f"{head}{columns}\n[[datasets.products.destinations]]{destinations}"


def tables(services: Services, dataset: str = "products") -> DatasetTables:
    """The dataset's tables as the registry has them now."""
    with services.uow.begin() as session:
        return schema.tables_in(session, dataset, services.settings.data_schema)


def current_rows(services: Services, dataset: str = "products") -> dict[str, dict[str, Any]]:
    """The dataset's table, entity key -> row."""
    found = tables(services, dataset)
    with services.uow.begin() as session:
        rows = session.execute(select(found.current)).mappings()
        return {r["entity_key"]: dict(r) for r in rows}


def history_rows(services: Services, dataset: str = "products") -> list[dict[str, Any]]:
    """The dataset's history, by entity and start."""
    found = tables(services, dataset)
    h = found.history.c
    with services.uow.begin() as session:
        query = select(found.history).order_by(h.entity_key, h.valid_from)
        return [dict(r) for r in session.execute(query).mappings()]


def change_rows(services: Services, dataset: str = "products") -> list[dict[str, Any]]:
    """The dataset's change feed, oldest first."""
    found = tables(services, dataset)
    with services.uow.begin() as session:
        query = select(found.changes).order_by(found.changes.c.id)
        return [dict(r) for r in session.execute(query).mappings()]


def assert_rows_are_open_stretches(services: Services, dataset: str = "products") -> None:
    """The invariant: the table's rows are exactly the history's open stretches, value for
    value."""
    found = tables(services, dataset)
    names = [c.name for c in found.columns]
    rows = current_rows(services, dataset)
    open_stretches = {
        h["entity_key"]: h for h in history_rows(services, dataset) if h["valid_to"] is None
    }
    assert set(rows) == set(open_stretches)
    for key, row in rows.items():
        assert {n: row[n] for n in names} == {n: open_stretches[key][n] for n in names}, key
