"""Observations are kept for a dataset's last ``retain_windows`` windows, never those a reader,
a fallback, an undelivered event or an evaluation still needs."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, insert, select

from sync.bootstrap import Services
from sync.datasets.tables import DatasetTables
from sync.models import MaintenanceRun, OutboxEvent, PartitionVerdict, Run, SetAsideRecord
from sync.operations import maintenance, retention
from sync.operations.retention import WindowRun
from tests.operations.conftest import NOW, add_runs, observe, publish, window, windows_left

pytestmark = pytest.mark.redis

ENTITIES = 10_000


def _count(services: Services, table: object) -> int:
    with services.uow.begin() as session:
        return int(session.execute(select(func.count()).select_from(table)).scalar_one())  # type: ignore[arg-type]


@pytest.mark.slow
def test_thirty_windows_of_ten_thousand_entities_come_down_to_the_last_seven(
    kept: Services, pruned_tables: DatasetTables
) -> None:
    """30 windows of 10,000 observations with retain_windows = 7: each pass deletes at most its
    limit, and once the passes have caught up exactly the last seven windows are left; the runs,
    their verdicts and the dataset's history are as they were."""
    with kept.uow.begin() as session:
        run_ids = add_runs(session, "pruned", range(30))
        publish(session, "pruned", run_ids[-1])
        for run_id in run_ids:
            session.add(PartitionVerdict(run_id=run_id, partition="all", state="passed"))
        observe(session, "pruned", run_ids, ENTITIES)
        session.execute(
            insert(pruned_tables.closed),
            [
                {
                    "entity_key": f"SKU-{n:05d}",
                    "run_id": run_ids[0],
                    "valid_from": datetime(2026, 11, 1, tzinfo=UTC),
                    "valid_to": datetime(2026, 11, 2, tzinfo=UTC),
                    "closed_by_run_id": run_ids[1],
                    "payload_hash": "h" * 64,
                }
                for n in range(100)
            ],
        )
        session.commit()
    limit = retention.DEFAULT_LIMITS.per_pass
    first = maintenance.run_pass(kept)
    assert first.failed == []
    assert first.counts["observations_pruned"] == limit
    with kept.uow.begin() as session:
        summary = session.execute(select(MaintenanceRun.summary)).scalar_one()
    assert summary["observations_pruned"] == limit
    passes, pruned = 1, limit
    while (gone := maintenance.run_pass(kept).counts["observations_pruned"]) > 0:
        assert gone <= limit
        passes, pruned = passes + 1, pruned + gone
    assert pruned == 23 * ENTITIES
    assert passes == math.ceil(23 * ENTITIES / limit)
    with kept.uow.begin() as session:
        left = windows_left(session, "pruned")
    assert left == {window(day): ENTITIES for day in range(23, 30)}
    assert _count(kept, Run.__table__) == 30
    assert _count(kept, PartitionVerdict.__table__) == 30
    assert _count(kept, pruned_tables.closed) == 100


PROTECTIONS = ["published", "fallback", "undelivered_event", "in_current_table", "unjudged"]


@pytest.mark.parametrize("why", PROTECTIONS)
def test_a_run_still_needed_keeps_its_observations_however_old(
    kept: Services, pruned_tables: DatasetTables, why: str
) -> None:
    """Nine windows, seven kept: the oldest run's observations stay when it is published, is the
    pointer's fallback, has an undelivered event, still has rows in the current table, or has
    not been judged yet; a delivered event protects nothing."""
    with kept.uow.begin() as session:
        oldest, second, *rest = add_runs(session, "pruned", range(9), state="rejected")
        session.get(Run, rest[-1]).state = "published"  # type: ignore[union-attr]
        publish(session, "pruned", oldest if why == "published" else rest[-1])
        if why == "fallback":
            session.get(Run, oldest).state = "accepted"  # type: ignore[union-attr]
        if why == "unjudged":
            session.get(Run, oldest).state = "candidate"  # type: ignore[union-attr]
        for run_id, state in ((oldest, "failed"), (second, "delivered")):
            if why == "undelivered_event" or run_id == second:
                session.add(
                    OutboxEvent(
                        event_id=f"evt-{run_id}",
                        run_id=run_id,
                        dataset="pruned",
                        event_type="dataset.published",
                        payload={},
                        state=state,
                        delivered_at=NOW if state == "delivered" else None,
                    )
                )
        if why == "in_current_table":
            session.execute(
                insert(pruned_tables.current).values(
                    entity_key="SKU-00001",
                    partition="quarantined-retailer",
                    run_id=oldest,
                    collection_window=window(0),
                    first_seen_at=NOW,
                    last_changed_at=NOW,
                    payload_hash="h" * 64,
                    changed_by_run_id=oldest,
                )
            )
        observe(session, "pruned", [oldest, second, *rest], 3)
        session.commit()
    with kept.uow.begin() as session:
        assert (
            retention.protection(session, kept.datasets.get("pruned"), oldest, schema="datasets")
            == why
        )  # type: ignore[arg-type]
    assert retention.prune_observations(kept) == 3
    with kept.uow.begin() as session:
        left = windows_left(session, "pruned")
    assert left == {window(day): 3 for day in (0, *range(2, 9))}


def test_without_retain_windows_every_window_is_kept(kept: Services) -> None:
    """A dataset with no retain_windows keeps all its observations."""
    with kept.uow.begin() as session:
        run_ids = add_runs(session, "everything", range(12))
        publish(session, "everything", run_ids[-1])
        observe(session, "everything", run_ids, 2)
        session.commit()
    assert retention.prune_observations(kept) == 0
    with kept.uow.begin() as session:
        assert len(windows_left(session, "everything")) == 12


def test_a_pass_stops_at_its_limit_and_the_next_goes_on(kept: Services) -> None:
    """With batches of 4 rows and 2 batches a pass, 20 old observations of two runs take three
    passes of at most 8 rows each, the second going from one run on to the next."""
    limits = retention.Limits(batch_size=4, batches=2)
    with kept.uow.begin() as session:
        run_ids = add_runs(session, "pruned", range(9))
        publish(session, "pruned", run_ids[-1])
        observe(session, "pruned", run_ids, 10)
        session.commit()
    assert [retention.prune_observations(kept, limits) for _ in range(4)] == [8, 8, 4, 0]
    with kept.uow.begin() as session:
        assert set(windows_left(session, "pruned")) == {window(day) for day in range(2, 9)}


def test_a_run_pruned_in_part_no_longer_has_its_rows_counted_from_the_groups_kept(
    kept: Services,
) -> None:
    """The groups an import or an evaluation kept with a run (how many rows per partition and
    shape) describe its rows no more once a pass deletes some of them: they go too, and an
    evaluation of the run would pass over what is left."""
    from sync.runs import shapes

    limits = retention.Limits(batch_size=4, batches=1)
    with kept.uow.begin() as session:
        run_ids = add_runs(session, "pruned", range(9))
        publish(session, "pruned", run_ids[-1])
        observe(session, "pruned", run_ids, 10)
        for run in session.scalars(select(Run).where(Run.run_id.in_(run_ids))):
            run.row_groups = {"version": run.data_version, "groups": [[None, None, "a", 10]]}
        session.commit()
    assert retention.prune_observations(kept, limits) == 4
    with kept.uow.begin() as session:
        runs = {r.run_id: r for r in session.scalars(select(Run).where(Run.run_id.in_(run_ids)))}
        assert [r for r in run_ids if shapes.kept_groups(runs[r]) is None] == [run_ids[0]]


def _run(run_id: str, collection_window: str, day: int) -> WindowRun:
    return WindowRun(run_id, collection_window, datetime(2026, 1, day, tzinfo=UTC))


def test_windows_are_ordered_in_time_not_as_text() -> None:
    """Job windows sort by job number (job-9 before job-10), daily ones by date whatever order
    the runs come in, and after a change of window kind the older kind's windows go first."""
    jobs = [_run("r10", "job-10", 3), _run("r9", "job-9", 2), _run("r11", "job-11", 4)]
    assert retention.expired(jobs, 1) == ["r9", "r10"]
    days = [_run("b", "2026-01-02", 3), _run("a", "2026-01-01", 2), _run("c", "2026-01-03", 4)]
    assert retention.expired(days, 2) == ["a"]
    assert retention.expired(days, 5) == []
    changed = [_run("w", "2026-W01", 10), *days, _run("j", "job-1", 1)]
    assert retention.expired(changed, 2) == ["j", "a", "b"]


def test_a_runs_set_aside_records_go_with_its_last_observations(kept: Services) -> None:
    """The records a run set aside are kept while its observations are, and deleted with its
    last batch of them."""
    with kept.uow.begin() as session:
        run_ids = add_runs(session, "pruned", range(9))
        publish(session, "pruned", run_ids[-1])
        observe(session, "pruned", run_ids, 3)
        for run_id in (run_ids[0], run_ids[-1]):
            session.add(
                SetAsideRecord(
                    run_id=run_id,
                    dataset="pruned",
                    entity_key="SKU-X",
                    job_id=1,
                    reason="nul_character",
                    values=[{"field": "title", "reason": "nul_character"}],
                )
            )
        session.commit()
    retention.prune_observations(kept)
    with kept.uow.begin() as session:
        left = session.execute(select(SetAsideRecord.run_id)).scalars().all()
    assert left == [run_ids[-1]]
