"""``scrapesync diff``: what changed between two published runs, from the stored change feed for
adjacent runs and from the history for any other pair, with clear refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, update

from config.columns import watch_by_column
from config.datasets import Datasets
from scrapesync.cli import main
from sync.bootstrap import Services
from sync.datasets import diff
from sync.datasets.changes import ChangeSet, compare
from sync.models import Publication
from sync.states import RunState
from tests.datasets.published import (
    DATASETS_TOML,
    VIEWS,
    A,
    B,
    C,
    PublishedProducts,
    create_tables,
    drop_tables,
    values,
)
from tests.harness import datasets_from

pytestmark = pytest.mark.redis


@pytest.fixture
def datasets() -> Datasets:
    """Products with typed columns and watched price (1%) and title."""
    return datasets_from(DATASETS_TOML)


@pytest.fixture
def products(services: Services, engine: Engine) -> Iterator[PublishedProducts]:
    """The dataset's tables, empty, on the test database."""
    tables = create_tables(engine, services.settings.data_schema)
    yield PublishedProducts(services.uow, tables)
    drop_tables(engine, services.settings.data_schema)


def feed(datasets: Datasets, before: str | None, after: str) -> ChangeSet:
    """The change set publication stores for ``after`` following ``before``."""
    view = {k: values(k, *v) for k, v in VIEWS[after].items()}
    if before is None:
        return compare("products", after, None, {}, view, {}, baseline=True)
    earlier = {k: values(k, *v) for k, v in VIEWS[before].items()}
    watch = watch_by_column(datasets.get("products").watch)
    return compare("products", after, before, earlier, view, watch)


@pytest.fixture
def three(products: PublishedProducts, datasets: Datasets) -> PublishedProducts:
    """Runs A, B and C published one after the other, with their history and change feeds."""
    for run_id in (A, B, C):
        products.run(run_id, run_id.removeprefix("products-"))
    products.publication(A, feed(datasets, None, A), current=False)
    products.publication(B, feed(datasets, A, B), current=False)
    products.publication(C, feed(datasets, B, C), current=True)
    products.history(VIEWS)
    return products


def invoke(*args: str) -> Any:
    """Run ``scrapesync diff`` with ``args``."""
    return CliRunner().invoke(main, ["diff", *args])


def test_the_default_is_the_last_publication_as_its_change_feed_stored_it(
    three: PublishedProducts,
) -> None:
    """No --from/--to: C against B, read from C's change feed; --json prints the change set."""
    result = invoke("products", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "dataset": "products",
        "run_id": C,
        "previous_run_id": B,
        "baseline": False,
        "counts": {"added": 1, "removed": 0, "changed": 1},
        "added": [
            {"entity_key": "s3", "values": {"sku": "s3", "title": "Three", "price": 30}},
        ],
        "removed": [],
        "changed": [
            {"entity_key": "s1", "columns": {"price": {"before": 10.05, "after": 10.5}}},
        ],
    }
    text = invoke("products")
    assert text.exit_code == 0, text.output
    assert text.output.splitlines()[:2] == [
        f"products: {B} → {C} (from the change feed of its publication, revision 1)",
        "1 added, 0 removed, 1 changed",
    ]


def test_runs_further_apart_are_compared_from_the_history(three: PublishedProducts) -> None:
    """A to C: s3 left and came back unchanged (no entry), s5 is new, and s1, s2, s4 changed
    beyond their tolerances over the two steps."""
    result = invoke("products", "--from", A, "--to", C, "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    assert got["counts"] == {"added": 1, "removed": 0, "changed": 3}
    assert [e["entity_key"] for e in got["added"]] == ["s5"]
    assert {e["entity_key"]: e["columns"] for e in got["changed"]} == {
        "s1": {"price": {"before": 10, "after": 10.5}},
        "s2": {"price": {"before": 20, "after": 25}},
        "s4": {"title": {"before": "Four", "after": "Four!"}},
    }
    backwards = json.loads(invoke("products", "--from", C, "--to", A, "--json").output)
    assert (backwards["counts"], backwards["run_id"]) == (
        {"added": 0, "removed": 1, "changed": 3},
        A,
    )


def test_adjacent_runs_computed_from_the_history_match_the_stored_feed(
    three: PublishedProducts, services: Services
) -> None:
    """The history's view of B against A's gives exactly what B's publication stored."""
    dataset = services.datasets.get("products")
    with services.uow.begin() as session:
        stored = diff.stored_changes(session, three.tables, B, 1, A)
        computed = diff.computed_changes(session, dataset, three.tables, A, B)
    assert computed.as_dict() == stored.as_dict()
    assert stored.counts() == {"added": 1, "removed": 1, "changed": 2}
    through_cli = json.loads(invoke("products", "--to", B, "--json").output)
    assert through_cli == stored.as_dict()


def test_the_readable_list_is_capped_with_how_many_more(three: PublishedProducts) -> None:
    """--limit 1: one entry of each kind, then "… and N more"."""
    result = invoke("products", "--from", A, "--to", C, "--limit", "1")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"products: {A} → {C} (computed from the history)",
        "1 added, 0 removed, 3 changed",
        "added:",
        "  + s5: sku=s5, title=Five, price=7",
        "changed:",
        "  ~ s1: price 10 → 10.5",
        "  … and 2 more",
    ]


def test_unknown_datasets_and_runs_are_refused_by_name(three: PublishedProducts) -> None:
    """An unknown dataset or run, or a run never published: one error line naming it."""
    three.run("products-2026-12-04", "2026-12-04", state=RunState.REJECTED)
    cases = {
        ("nope",): "unknown dataset 'nope' (known: products)",
        ("products", "--to", "products-1999-01-01"): "has no run 'products-1999-01-01'",
        ("products", "--from", "products-2026-12-04"): (
            "run 'products-2026-12-04' of dataset 'products' was never published (it is "
            "rejected): only published runs can be compared"
        ),
    }
    for args, message in cases.items():
        result = invoke(*args)
        assert result.exit_code != 0, args
        assert message in result.output, (args, result.output)


def test_one_publication_is_a_baseline_of_every_entity_added_and_none_is_nothing_to_compare(
    products: PublishedProducts, datasets: Datasets
) -> None:
    """No publication: said so. Only the baseline: every entity of its view, added, read from
    the history (so a receiver of its summary event can fetch all of it)."""
    nothing = invoke("products")
    assert nothing.exit_code != 0
    assert "dataset 'products' has no published run yet" in nothing.output
    products.run(A, "2026-12-01")
    products.publication(A, feed(datasets, None, A), current=True)
    products.history({A: VIEWS[A]})
    one = invoke("products", "--json")
    assert one.exit_code == 0, one.output
    baseline = json.loads(one.output)
    assert (baseline["run_id"], baseline["previous_run_id"]) == (A, None)
    assert baseline["counts"] == {"added": len(VIEWS[A]), "removed": 0, "changed": 0}
    assert [e["entity_key"] for e in baseline["added"]] == sorted(VIEWS[A])
    readable = invoke("products", "--to", A)
    assert readable.exit_code == 0, readable.output
    assert f"products: nothing → {A} (the dataset's first publication: every entity added)" in (
        readable.output
    )


def test_runs_published_before_the_history_was_kept_are_refused(
    three: PublishedProducts, services: Services
) -> None:
    """A publication without change counts predates the typed tables: its run has no history
    to compare, which the command says instead of reporting nothing changed."""
    with services.uow.begin() as session:
        session.execute(update(Publication).where(Publication.run_id == A).values(changes=None))
        session.commit()
    result = invoke("products", "--from", A, "--to", C)
    assert result.exit_code != 0
    assert (
        f"run '{A}' of dataset 'products' was published before its typed tables and history "
        "were kept: only runs published since can be compared"
    ) in result.output
    assert invoke("products", "--json").exit_code == 0  # B to C is still there
