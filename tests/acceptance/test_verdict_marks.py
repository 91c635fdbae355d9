"""A verdict marks the run's rows valid or quarantined. After a "Continue", the tally's pass over
the run counts its rows by state and keeps the ids of those the sync wrote: when no other row
changes state, the verdict marks those rows alone, each by its id; when a partition's verdict
changes, every row of the run is looked at, as before. Either way every row ends in its
partition's state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event, select, text

from simulator import CloudState
from sync.bootstrap import Services
from sync.models import Observation
from sync.queue import RecordingDispatcher
from sync.runs import evaluation
from tests.acceptance.flow import (
    RETAILERS,
    finished_job,
    product_records,
    run_id_of,
    sync_offline,
)

pytestmark = pytest.mark.postgres  # the ids are kept on PostgreSQL


def _published(services: Services, cloud: CloudState, records: list[dict[str, str]]) -> int:
    """A job of these records, synced, judged and published; its id."""
    job_id = finished_job(cloud, records)
    sync_offline(services, job_id)
    assert _evaluate(services, run_id_of(job_id)) == "published"
    return job_id


def _continued(services: Services, cloud: CloudState, job_id: int, records: list[Any]) -> None:
    """Cloud's "Continue" of the job, ending with these records, synced."""
    cloud.continue_job(job_id)
    cloud.run_job(job_id, records=records)
    sync_offline(services, job_id)


def _evaluate(services: Services, run_id: str) -> str:
    offline = replace(services, dispatcher=RecordingDispatcher())
    return evaluation.evaluate_run(offline, run_id).outcome


@contextmanager
def _marks(services: Services) -> Iterator[list[str]]:
    """The UPDATE statements on observations run meanwhile, as sent."""
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        flat = " ".join(statement.split())
        if flat.startswith("UPDATE observations"):
            seen.append(flat)

    event.listen(services.uow.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(services.uow.engine, "before_cursor_execute", note)


def _states(services: Services, run_id: str) -> Counter[tuple[str | None, str]]:
    o = Observation.__table__.c
    with services.uow.begin() as session:
        rows = session.execute(
            select(o.partition, o.validation_state).where(o.run_id == run_id)
        ).all()
    return Counter((partition, state) for partition, state in rows)


def test_a_continue_marks_only_the_rows_it_wrote_each_by_id(
    services: Services, cloud: CloudState
) -> None:
    records = product_records(40)
    job_id = _published(services, cloud, records)
    run_id = run_id_of(job_id)

    changed = [dict(r) for r in records]
    for i in (3, 7, 21):
        changed[i]["price"] = "99.99"
    changed += product_records(1, start=900)
    _continued(services, cloud, job_id, changed)
    with _marks(services) as marks:
        assert _evaluate(services, run_id) == "published"

    assert len(marks) == 1
    assert "FROM obs_pending" in marks[0]
    assert _states(services, run_id) == Counter(
        {(r, "valid"): sum(1 for c in changed if c["retailer"] == r) for r in RETAILERS}
    )
    with services.uow.begin() as session:
        prices = dict(session.execute(text("SELECT sku, price FROM datasets.products")).all())
    assert len(prices) == 41
    assert {prices[changed[i]["sku"]] for i in (3, 7, 21)} == {"99.99"}


def test_a_partition_whose_verdict_turns_has_every_row_marked_again(
    services: Services, cloud: CloudState
) -> None:
    """A "Continue" that brings a partition junk enough to quarantine it turns the rows it
    never rewrote too: the verdict looks at the whole run."""
    records = product_records(40)
    job_id = _published(services, cloud, records)
    run_id = run_id_of(job_id)

    junk = product_records(30, start=500, retailers=(RETAILERS[1],), garbage=RETAILERS[1])
    _continued(services, cloud, job_id, records + junk)
    with _marks(services) as marks:
        assert _evaluate(services, run_id) == "rejected"

    assert not any("FROM obs_pending" in m for m in marks)
    states = _states(services, run_id)
    held = {r: sum(1 for c in records if c["retailer"] == r) for r in RETAILERS}
    assert states == Counter(
        {
            **{(r, "valid"): n for r, n in held.items() if r != RETAILERS[1]},
            (RETAILERS[1], "quarantined"): held[RETAILERS[1]] + 30,
        }
    )
