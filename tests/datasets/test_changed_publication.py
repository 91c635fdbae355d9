"""A later publication written by set-based statements (PostgreSQL) leaves the dataset's table,
its history, its change feed and its event exactly as the Python path does: random windows of
plain and awkward values, published, published again (whole, or from the rows written since, as
after a "Continue") and withdrawn, each sequence played both ways into two datasets and compared
row for row."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from config.columns import Column
from config.datasets import Dataset
from sync.bootstrap import Services
from sync.datasets import materialise
from sync.models import OutboxEvent as Outbox
from sync.models import Publication
from tests.datasets.flow import (
    assert_rows_are_open_stretches,
    change_rows,
    current_rows,
    history_rows,
)
from tests.datasets.test_materialise import publish, withdraw

pytestmark = [pytest.mark.postgres, pytest.mark.slow]  # random sequences, each played twice

COLUMNS = (
    Column("title", "title", "text"),
    Column("price", "price", "numeric"),
    Column("stock", "stock", "integer"),
    Column("active", "active", "boolean"),
    Column("seen", "seen", "timestamp"),
    Column("tags", "tags", "json"),
)
KEYS = [f"S{i}" for i in range(6)]
# plain values (the statements' share) beside values only Python casts, failures included
VALUES: dict[str, list[Any]] = {
    "title": ["Kettle", "kettle", "", None, "—", "Kettle 2"],
    "price": ["10.00", "10.0", "10", 10, "11.5", "0.30", "$12", "0.10000000000000000001", "", None],
    "stock": ["3", 3, "4", "1,200", "x", None],
    "active": [True, False, "yes", None],
    "seen": [None, "2026-11-02T10:00:00+01:00", "2026-11-02T10:00:00.250000Z"],
    "tags": [None, ["a"], {"k": 1}],
}
_names = itertools.count()


def _record() -> st.SearchStrategy[dict[str, Any]]:
    fields = {name: st.sampled_from(choices) for name, choices in VALUES.items()}
    return st.fixed_dictionaries({}, optional=fields)


_window = st.dictionaries(st.sampled_from(KEYS), _record(), max_size=len(KEYS))
# the next window, the same window published again (whole, or as after a "Continue": from the
# ids of the rows written since), or the last published run withdrawn
_step = st.tuples(st.sampled_from(["next", "next", "again", "continue", "withdraw"]), _window)


def _play(
    services: Services,
    dataset: Dataset,
    steps: list[tuple[str, dict[str, Any]]],
    *,
    marked: bool = False,
) -> None:
    """Publish each step's window; ``marked``: the first window's rows marked plain where
    they are, as a first sync's copy marks them."""
    published: list[str] = []
    day = -1
    for kind, found in steps:
        if kind == "withdraw":
            if published:
                withdraw(services, dataset, published.pop())
            continue
        day = day + 1 if kind == "next" or day < 0 else day
        records = {key: {"sku": key, **values} for key, values in found.items()}
        run_id = publish(
            services,
            dataset,
            day,
            records,
            pending=kind == "continue",
            marked=marked and not published,
        )
        if run_id not in published:
            published.append(run_id)


def _by_key(row: dict[str, Any]) -> str:
    return str(row["entity_key"])


def _state(services: Services, dataset: Dataset) -> dict[str, Any]:
    """Everything a reader gets of the dataset, its name taken out."""

    def strip(value: Any) -> Any:
        return value.replace(dataset.name, "D") if isinstance(value, str) else value

    def plain(rows: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        return [{k: strip(v) for k, v in r.items() if k not in drop} for r in rows]

    with services.uow.begin() as session:
        events = session.execute(
            select(Outbox.event_type, Outbox.payload)
            .where(Outbox.dataset == dataset.name)
            .order_by(Outbox.id)
        ).all()
        publications = (
            session.execute(
                select(Publication.changes)
                .where(Publication.dataset == dataset.name)
                .order_by(Publication.id)
            )
            .scalars()
            .all()
        )
    changes = plain(change_rows(services, dataset.name), ("id", "created_at"))
    return {
        "rows": plain(sorted(current_rows(services, dataset.name).values(), key=_by_key)),
        "history": plain(history_rows(services, dataset.name)),
        # the order of a publication's change rows is not part of the feed's promise
        "changes": sorted(changes, key=lambda c: repr(sorted(c.items()))),
        # an event as its receiver reads it, but for when it was written
        "events": [
            (t, strip(repr({k: v for k, v in p.items() if k != "published_at"}))) for t, p in events
        ],
        "publications": [repr(p).replace(dataset.name, "D") for p in publications],
    }


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@example(  # the same values written otherwise: the stretch stays open, no change row
    first={"S0": {"price": "10.00", "title": "Kettle"}},
    then=[("next", {"S0": {"price": 10, "title": "Kettle"}})],
)
@example(  # a change the next day closes the stretch; a scale change is no change
    first={"S0": {"price": "0.30", "stock": "3"}, "S1": {"price": "2"}},
    then=[("next", {"S0": {"price": "0.3", "stock": 4}, "S1": {"price": "2.5"}})],
)
@example(  # published again: its own stretches undone; gone and back: first seen kept
    first={"S0": {"price": "1"}, "S1": {"price": "1"}},
    then=[
        ("next", {"S0": {"price": "2"}}),
        ("again", {"S0": {"price": "3"}, "S1": {"price": "1"}}),
        ("next", {"S1": {"price": "1.5", "active": True}, "S2": {"title": "new"}}),
        ("withdraw", {}),
        ("next", {"S1": {"price": "1.5", "seen": "2026-11-02T10:00:00.250000Z"}}),
    ],
)
@example(  # a "Continue": plain and awkward values, from the rows written since
    first={"S0": {"price": "1", "title": "Kettle"}, "S1": {"price": "2"}},
    then=[("continue", {"S0": {"price": "$3", "title": "—"}, "S2": {"price": "4", "stock": 3}})],
)
@given(first=_window, then=st.lists(_step, min_size=1, max_size=5))
def test_the_set_based_publication_writes_what_the_python_path_writes(
    services: Services,
    first: dict[str, Any],
    then: list[tuple[str, dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps = [("next", first), *then]
    base = replace(services.datasets.get("products"), window="daily", columns=COLUMNS, watch=())
    n = next(_names)
    by_python = replace(base, name=f"py{n}")
    by_sql = replace(base, name=f"sq{n}")
    with monkeypatch.context() as patched:
        patched.setattr(materialise, "SET_BASED", False)
        _play(services, by_python, steps)
    _play(services, by_sql, steps, marked=True)
    assert _state(services, by_sql) == _state(services, by_python)
    assert_rows_are_open_stretches(services, by_sql.name)


def test_an_added_entity_of_many_columns_carries_every_value(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sixty columns: an added entity's values are built in parts (a SQL function takes at most
    a hundred arguments) and still read as the Python path writes them."""
    columns = tuple(Column(f"f{i:02d}", f"f{i:02d}", "text") for i in range(60))
    base = replace(services.datasets.get("products"), window="daily", columns=columns, watch=())
    record = {f"f{i:02d}": f"v{i}" for i in range(60)}
    steps = [("next", {"S0": record}), ("next", {"S0": record, "S1": {**record, "f59": "w"}})]
    by_python, by_sql = replace(base, name="wide_py"), replace(base, name="wide_sq")
    with monkeypatch.context() as patched:
        patched.setattr(materialise, "SET_BASED", False)
        _play(services, by_python, steps)
    _play(services, by_sql, steps)
    state = _state(services, by_sql)
    assert state == _state(services, by_python)
    added = [c for c in state["changes"] if c["kind"] == "added"]
    assert [len(c["after"]) for c in added] == [60]
