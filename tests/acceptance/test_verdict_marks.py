"""A verdict gives the run's rows their partition's state without writing any of them: a row the
verdict's snapshot held takes its partition's verdict, a row a sync wrote since is pending
(:mod:`sync.acceptance.row_states`). After a "Continue", the tally's pass over the run counts its
rows by state and keeps the ids of those the sync wrote: when no other row changes state, the
publication of a run published already searches those rows alone for changes; when a
partition's verdict changes, every row of the run is looked at. Either way every row ends in its
partition's state, and the dataset's table holds the run's valid rows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event, func, select, text

from simulator import CloudState
from sync.acceptance import row_states
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
    use_datasets,
    with_policy,
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
def _marks(
    services: Services, start: str | Callable[[str], bool] = "UPDATE observations"
) -> Iterator[list[str]]:
    """The statements run meanwhile that begin so (by default: the UPDATEs of observations),
    or that ``start`` holds true of, as sent."""
    seen: list[str] = []
    chosen = start if callable(start) else lambda flat: flat.startswith(start)

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        flat = " ".join(statement.split())
        if chosen(flat):
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
            select(o.partition, row_states.state(session, run_id)).where(o.run_id == run_id)
        ).all()
    return Counter((partition, state) for partition, state in rows)


def test_a_continue_is_judged_without_writing_a_row(services: Services, cloud: CloudState) -> None:
    """The rows a "Continue" rewrote and added turn valid with the verdict, and no row of the
    run is written to say so."""
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

    assert marks == []
    assert _states(services, run_id) == Counter(
        {(r, "valid"): sum(1 for c in changed if c["retailer"] == r) for r in RETAILERS}
    )
    with services.uow.begin() as session:
        prices = dict(session.execute(text("SELECT sku, price FROM datasets.products")).all())
    assert len(prices) == 41
    assert {prices[changed[i]["sku"]] for i in (3, 7, 21)} == {"99.99"}


def test_a_partition_whose_verdict_turns_turns_every_row_of_it(
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

    # no row is marked: the only rows written are those whose shapes the evaluation found
    assert all(m.startswith("UPDATE observations SET shape = s.shape FROM") for m in marks)
    states = _states(services, run_id)
    held = {r: sum(1 for c in records if c["retailer"] == r) for r in RETAILERS}
    assert states == Counter(
        {
            **{(r, "valid"): n for r, n in held.items() if r != RETAILERS[1]},
            (RETAILERS[1], "quarantined"): held[RETAILERS[1]] + 30,
        }
    )


def _is_search(flat: str) -> bool:
    """Whether a statement is the search for the run's new and changed entities: over the whole
    run, or over the rows written since the last verdict (``obs_pending``)."""
    return flat.startswith("CREATE TEMP TABLE pub_") and (
        "FROM observations o" in flat or "FROM obs_pending" in flat
    )


def _table(services: Services) -> dict[str, str]:
    with services.uow.begin() as session:
        return dict(session.execute(text("SELECT sku, price FROM datasets.products")).all())


def _fed(services: Services, run_id: str) -> Counter[str]:
    """The change feed of the run's latest publication, by kind."""
    with services.uow.begin() as session:
        rows = session.execute(
            text(
                "SELECT kind, count(DISTINCT entity_key) FROM datasets.products_changes "
                "WHERE run_id = :run AND revision = (SELECT revision FROM runs "
                "WHERE run_id = :run) GROUP BY kind"
            ),
            {"run": run_id},
        ).all()
    return Counter(dict(rows))


def test_a_continue_of_a_published_run_searches_only_the_rows_it_wrote_for_changes(
    services: Services, cloud: CloudState
) -> None:
    records = product_records(40)
    job_id = _published(services, cloud, records)
    run_id = run_id_of(job_id)

    changed = [dict(r) for r in records]
    for i in (2, 11, 30):
        changed[i]["price"] = "123.45"
    changed[5]["title"] = "A new title"  # a change the price does not show
    changed += product_records(2, start=700)
    _continued(services, cloud, job_id, changed)
    moves = "UPDATE datasets.products SET run_id"  # rows of other runs moved to this one
    with _marks(services, _is_search) as searches, _marks(services, moves) as moved:
        assert _evaluate(services, run_id) == "published"

    assert len(searches) == 1
    assert "FROM obs_pending pd CROSS JOIN LATERAL" in searches[0]
    assert moved == []  # the table holds no row of another run: no pass over the run to move any
    assert _table(services) == {r["sku"]: r["price"] for r in changed}
    assert _fed(services, run_id) == Counter({"changed": 4, "added": 2})


def test_a_continue_leaves_to_python_only_the_rows_whose_values_the_database_cannot_read(
    services: Services, cloud: CloudState
) -> None:
    """Of the rows a "Continue" wrote, those holding a value the database does not read as the
    casts do (a title of symbols alone) are published through Python, the others by the
    statements: the table and the change feed hold both, each once."""
    records = product_records(40)
    job_id = _published(services, cloud, records)
    run_id = run_id_of(job_id)

    changed = [dict(r) for r in records]
    changed[4]["title"] = "\u2605 \u2605 \u2605"  # no ASCII letter or digit: not plain
    changed[9]["title"] = "Plain and new"
    changed[17]["price"] = "4.20"
    changed[17]["title"] = "\u2014"
    changed += [{**product_records(1, start=800)[0], "title": "\u2606"}]
    _continued(services, cloud, job_id, changed)
    with _marks(services, _is_search) as searches:
        assert _evaluate(services, run_id) == "published"

    assert len(searches) == 1
    assert "FROM obs_pending pd CROSS JOIN LATERAL" in searches[0]
    with services.uow.begin() as session:
        titles = dict(session.execute(text("SELECT sku, title FROM datasets.products")).all())
        fed = session.execute(
            text(
                "SELECT entity_key, kind, column_name, after FROM datasets.products_changes "
                "WHERE run_id = :run AND revision = (SELECT revision FROM runs "
                "WHERE run_id = :run) ORDER BY id"
            ),
            {"run": run_id},
        ).all()
    assert titles == {r["sku"]: r["title"] for r in changed}
    assert _table(services) == {r["sku"]: r["price"] for r in changed}
    new_sku = changed[-1]["sku"]
    assert sorted((key, kind, column) for key, kind, column, _ in fed if kind == "changed") == [
        (changed[4]["sku"], "changed", "title"),
        (changed[9]["sku"], "changed", "title"),
        (changed[17]["sku"], "changed", "price"),
        (changed[17]["sku"], "changed", "title"),
    ]
    assert [(key, kind) for key, kind, _, _ in fed if kind == "added"] == [(new_sku, "added")]
    after = {(key, column): value for key, _, column, value in fed}
    assert after[(changed[4]["sku"], "title")] == changed[4]["title"]
    assert after[(new_sku, None)]["title"] == "\u2606"


def test_a_partition_that_passes_again_is_published_whole(
    services: Services, cloud: CloudState
) -> None:
    """A quarantined partition whose junk a "Continue" mends passes: its rows that the sync
    did not rewrite enter the dataset's table too, so the whole run is searched."""
    services = use_datasets(services, with_policy("publish_passing"))
    records = product_records(40)
    junk = product_records(30, start=500, retailers=(RETAILERS[1],), garbage=RETAILERS[1])
    job_id = _published(services, cloud, records + junk)
    run_id = run_id_of(job_id)
    assert RETAILERS[1] not in {r["retailer"] for r in _retailers(services)}

    # the junk rescraped, and one page more (a "Continue" reads more records)
    mended = product_records(30, start=500, retailers=(RETAILERS[1],))
    mended += product_records(1, start=900, retailers=(RETAILERS[0],))
    _continued(services, cloud, job_id, records + mended)
    with _marks(services, _is_search) as searches:
        assert _evaluate(services, run_id) == "published"

    assert _table(services) == {r["sku"]: r["price"] for r in records + mended}
    held = sum(1 for r in records if r["retailer"] == RETAILERS[1])
    assert held > 0  # rows of the partition that the "Continue" left as they were
    assert _fed(services, run_id) == Counter({"added": held + 31})
    assert len(searches) == 1
    assert "obs_pending" not in searches[0]


def _retailers(services: Services) -> list[dict[str, str]]:
    with services.uow.begin() as session:
        rows = session.execute(text("SELECT sku, retailer FROM datasets.products")).all()
    return [{"sku": sku, "retailer": retailer} for sku, retailer in rows]


def test_a_run_that_takes_the_pointer_after_a_continue_is_published_whole(
    services: Services, cloud: CloudState
) -> None:
    """A later job's run rejected for its size, all its partitions passing, then completed by
    a "Continue": only the rows the sync wrote turn, but the dataset's table holds the earlier
    run, so the whole run is searched."""
    services = use_datasets(services, with_policy("reject", quality="min_records = 50"))
    _published(services, cloud, product_records(60))
    records = product_records(40)
    for record in records:
        record["price"] = "7.50"
    job_id = finished_job(cloud, records)
    sync_offline(services, job_id)
    run_id = run_id_of(job_id)
    assert _evaluate(services, run_id) == "rejected"
    assert _states(services, run_id) == Counter(
        {(r, "valid"): sum(1 for c in records if c["retailer"] == r) for r in RETAILERS}
    )

    more = records + product_records(20, start=600)
    _continued(services, cloud, job_id, more)
    with _marks(services) as marks, _marks(services, _is_search) as searches:
        assert _evaluate(services, run_id) == "published"

    assert _table(services) == {r["sku"]: r["price"] for r in more}
    assert marks == []  # the verdict wrote no row
    assert len(searches) == 1
    assert "obs_pending" not in searches[0]


def test_a_first_verdict_leaves_every_row_of_the_run_as_the_sync_wrote_it(
    services: Services, cloud: CloudState
) -> None:
    """Judging and publishing a first sync writes no observation: each row keeps the version
    the sync's commit wrote (PostgreSQL's xmin), and every row is valid all the same."""
    job_id = finished_job(cloud, product_records(120))
    sync_offline(services, job_id)
    run_id = run_id_of(job_id)

    def versions() -> dict[int, str]:
        with services.uow.begin() as session:
            return dict(
                session.execute(
                    text("SELECT id, xmin::text FROM observations WHERE run_id = :run"),
                    {"run": run_id},
                ).all()
            )

    written = versions()
    assert len(written) == 120
    assert _states(services, run_id) == Counter({(r, "pending"): 30 for r in RETAILERS})
    assert _evaluate(services, run_id) == "published"
    assert versions() == written
    assert _states(services, run_id) == Counter({(r, "valid"): 30 for r in RETAILERS})
    assert len(_table(services)) == 120


def test_a_run_of_many_imports_is_read_once_to_find_its_valid_rows(
    services: Services, cloud: CloudState
) -> None:
    """The valid rows of a run that several imports wrote (a job and two "Continue"s) are
    found in one pass over the run: the judged imports and passed partitions are gathered
    once, never joined with the run (which would read it once per import)."""
    records = product_records(40)
    job_id = _published(services, cloud, records)
    run_id = run_id_of(job_id)
    for more, price in enumerate(("1.25", "2.50")):
        records = [dict(r, price=price) if i % 4 == 0 else r for i, r in enumerate(records)]
        records += product_records(1, start=800 + more)  # a "Continue" reads more records
        _continued(services, cloud, job_id, records)
        assert _evaluate(services, run_id) == "published"
    with services.uow.begin() as session:
        imports = session.execute(
            text("SELECT count(*) FROM run_imports WHERE run_id = :run"), {"run": run_id}
        ).scalar_one()
        query = (
            select(func.count()).select_from(Observation).where(row_states.valid(session, run_id))
        )
        sql = query.compile(session.get_bind(), compile_kwargs={"literal_binds": True})
        plan = "\n".join(session.execute(text(f"EXPLAIN ANALYZE {sql}")).scalars())
        valid = session.execute(query).scalar_one()
    assert (imports, valid) == (3, 42)
    # the imports and the partitions read once each, beside the run: never joined with it
    assert "Join" not in plan, plan
    assert "Nested Loop" not in plan, plan
    scans = [line for line in plan.splitlines() if " on observations" in line]
    assert scans, plan
    assert all("loops=1)" in line for line in scans), plan


def _plain_marks(services: Services, run_id: str) -> dict[str, bool]:
    """Each row of the run by key: whether it is marked as holding only plain values."""
    o = Observation.__table__.c
    with services.uow.begin() as session:
        rows = session.execute(
            select(o.entity_key, o.plain_for.is_not(None)).where(o.run_id == run_id)
        ).all()
    return {key: bool(marked) for key, marked in rows}


def test_a_first_sync_marks_its_plain_rows_and_a_merge_forgets_the_mark(
    services: Services, cloud: CloudState
) -> None:
    """A run's first sync marks each record whose values are all plain as it copies it in, so
    that its first publication casts the row unchecked; a "Continue" that rewrites a row
    forgets its mark, and the publication then reads every row as the casts do, marked or
    not. A dataset published before has its runs' rows left unmarked."""
    records = product_records(40)
    records[3]["title"] = " "  # blank: the casts make it NULL, so not plain
    records[5]["title"] = "  \u2605"  # not blank: plain, and kept as it is
    job_id = finished_job(cloud, records)
    sync_offline(services, job_id)
    run_id = run_id_of(job_id)
    skus = [r["sku"] for r in records]
    assert _plain_marks(services, run_id) == {sku: sku != skus[3] for sku in skus}

    changed = [dict(r) for r in records]
    changed[7]["title"] = "\u00a0"  # rewritten blank: its mark must go
    changed[9]["price"] = "4.20"  # rewritten, plain: a merge marks nothing
    changed += product_records(1, start=800)  # a "Continue" reads more records
    _continued(services, cloud, job_id, changed)
    marks = _plain_marks(services, run_id)
    unmarked = [skus[3], skus[7], skus[9], changed[-1]["sku"]]
    assert [r["sku"] for r in changed if not marks[r["sku"]]] == unmarked
    assert _evaluate(services, run_id) == "published"

    with services.uow.begin() as session:
        titles = dict(session.execute(text("SELECT sku, title FROM datasets.products")).all())
    assert titles == {r["sku"]: r["title"] if r["title"].strip() else None for r in changed}
    assert titles[skus[5]] == "  \u2605"
    assert _table(services) == {r["sku"]: r["price"] for r in changed}

    # the next job's run is published by its changes, never by a first copy: no marks
    next_job = finished_job(cloud, records)
    sync_offline(services, next_job)
    assert set(_plain_marks(services, run_id_of(next_job)).values()) == {False}
