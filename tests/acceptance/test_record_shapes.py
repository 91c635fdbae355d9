"""An evaluation reads again only what changed: the shapes of the clean records it judged are
kept by payload hash, and a later evaluation of the run counts them in the database. The tallies
must be exactly those of reading every record, with defects, after a "Continue" that rewrote some
records, and after the record rules changed."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Text, cast, select, text, update

from simulator import CloudState
from sync.acceptance.facts import PartitionTally, RecordRules
from sync.acceptance.records import tally_records
from sync.bootstrap import Services
from sync.ingest.early_merge import RowsWritten
from sync.models import Observation, Run, RunImport
from sync.queue import RecordingDispatcher
from sync.runs import evaluation, shapes
from tests.acceptance.flow import (
    DATASETS_TOML,
    finished_job,
    product_records,
    run_id_of,
    sync_offline,
    use_datasets,
)

CONSENT, UNPARSABLE, MISSING, SHELL = 0, 1, 2, 3  # the first records' defects


def _records() -> list[dict[str, Any]]:
    records = product_records(40)
    records[CONSENT]["title"] = "Before you continue to the shop"
    records[UNPARSABLE]["price"] = "call for price"
    records[MISSING]["price"] = ""
    records[SHELL] = {"sku": records[SHELL]["sku"], "retailer": records[SHELL]["retailer"],
                      "title": " ", "price": ""}  # fmt: skip
    return records


def _evaluate(services: Services, run_id: str) -> str:
    offline = replace(services, dispatcher=RecordingDispatcher())
    return evaluation.evaluate_run(offline, run_id, force=True).outcome


def _as_read(services: Services, run_id: str) -> dict[str, PartitionTally]:
    """The run's tallies from every record read as it is stored: what the kept shapes replace."""
    with services.uow.begin() as session:
        rows = session.execute(
            select(Observation.partition, cast(Observation.payload, Text)).where(
                Observation.run_id == run_id
            )
        ).all()
    import orjson

    rules = RecordRules.of(services.datasets.get("products"))
    return tally_records(((p, orjson.loads(payload)) for p, payload in rows), rules)


def _comparable(tallies: dict[str, PartitionTally]) -> dict[str, Any]:
    return {
        name: (
            t.records,
            t.missing,
            t.unparsable,
            t.consent_pages,
            t.empty_shells,
            t.filled,
            {key: sorted(found) for key, found in t.samples.items()},
        )
        for name, t in tallies.items()
    }


def _continue(services: Services, cloud: CloudState, job_id: int, records: Any) -> None:
    """Cloud's "Continue" of the job, ending with these records, synced."""
    cloud.continue_job(job_id)
    cloud.run_job(job_id, records=records)
    sync_offline(services, job_id)


def _grouped(session: Any, run_id: str) -> Run:
    """The run, whose rows per group are kept at the data version it holds."""
    run = session.get(Run, run_id)
    assert run is not None
    assert run.row_groups is not None
    assert run.row_groups["version"] == run.data_version
    return run


@pytest.fixture
def read_back(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The records an evaluation tallies in Python (read back from the database)."""
    seen: list[dict[str, Any]] = []
    real = shapes.tally_record

    def counting(tally: PartitionTally, record: dict[str, Any], rules: RecordRules) -> Any:
        seen.append(record)
        return real(tally, record, rules)

    monkeypatch.setattr(shapes, "tally_record", counting)
    return seen


def test_a_later_evaluation_reads_only_the_changed_records_and_the_defective_ones(
    services: Services, cloud: CloudState, read_back: list[dict[str, Any]]
) -> None:
    """The first evaluation reads the records the import did not shape: on PostgreSQL, whose
    first sync copies records straight in with their shapes, the 4 with a defect; on SQLite all
    40. After a "Continue" that rewrote 5 records and added one, the next reads the 3 unchanged
    ones with a defect (kept for their samples) and, of the 6 written, those the sync could not
    shape: on PostgreSQL, which merges them with their shapes, the new consent page; on SQLite
    all 6. Every tally is what reading the whole run gives."""
    records = _records()
    job_id = finished_job(cloud, records)
    run_id = run_id_of(job_id)
    sync_offline(services, job_id)
    with services.uow.begin() as session:
        at_import, _ = shapes.tally(session, run_id, services.datasets.get("products"), keep=False)
    assert _comparable(at_import) == _comparable(_as_read(services, run_id))
    read_back.clear()
    assert _evaluate(services, run_id) == "rejected"  # a consent page, a shell...
    defective = sorted(records[i]["sku"] for i in (CONSENT, UNPARSABLE, MISSING, SHELL))
    if services.uow.engine.dialect.name == "postgresql":
        assert sorted(r["sku"] for r in read_back) == defective
    else:
        assert len(read_back) == 40

    changed = [dict(r) for r in records]
    changed[UNPARSABLE]["price"] = "12.50"  # repaired
    for i in (5, 6, 7):
        changed[i]["price"] = "99.99"
    changed[8]["title"] = "Are you a robot?"  # a new consent page
    changed += product_records(1, start=900)  # and one more record: Cloud's counters move
    _continue(services, cloud, job_id, changed)
    read_back.clear()
    _evaluate(services, run_id)
    still_defective = {changed[i]["sku"] for i in (CONSENT, MISSING, SHELL)}
    if services.uow.engine.dialect.name == "postgresql":  # merged with their shapes
        rewritten = {changed[8]["sku"]}  # of the rewritten, only the new defect is read
    else:
        rewritten = {changed[i]["sku"] for i in (UNPARSABLE, 5, 6, 7, 8, 40)}
    assert sorted(r["sku"] for r in read_back) == sorted(rewritten | still_defective)

    with services.uow.begin() as session:
        kept, _ = shapes.tally(session, run_id, services.datasets.get("products"), keep=False)
    assert _comparable(kept) == _comparable(_as_read(services, run_id))
    assert kept["alpha.example"].consent_pages + kept["alpha.example"].empty_shells >= 1


def test_changed_record_rules_judge_every_record_again(
    services: Services, cloud: CloudState, read_back: list[dict[str, Any]]
) -> None:
    """Shapes are kept under the rules they were judged by: a datasets file that makes every
    title a number to parse reads all 40 records again (in ``check`` too, which keeps nothing),
    finds them unparsable and rejects the run; the shapes of the old rules count no more."""
    job_id = finished_job(cloud, product_records(40))
    run_id = run_id_of(job_id)
    sync_offline(services, job_id)
    assert _evaluate(services, run_id) == "published"
    read_back.clear()
    assert _evaluate(services, run_id) == "unchanged"
    assert read_back == []  # every record's shape was kept

    stricter = DATASETS_TOML.replace(
        'parsers = { price = "number" }', 'parsers = { price = "number", title = "number" }'
    )
    services = use_datasets(services, stricter)
    with services.uow.begin() as session:  # a read-only re-judgement (check) reads them all too
        judged, _ = shapes.tally(session, run_id, services.datasets.get("products"), keep=False)
    assert _comparable(judged) == _comparable(_as_read(services, run_id))
    read_back.clear()
    assert _evaluate(services, run_id) == "rejected"
    assert len(read_back) == 40
    with services.uow.begin() as session:
        kept_shapes = set(session.execute(select(Observation.shape).distinct()).scalars())
        kept, _ = shapes.tally(session, run_id, services.datasets.get("products"), keep=False)
    fingerprint = RecordRules.of(services.datasets.get("products")).fingerprint
    # no record is clean under the rules in force: none has a shape under them
    assert not [found for found in kept_shapes if found and found.startswith(fingerprint)]
    assert len(kept_shapes) == 1  # the old rules' shape, which no tally counts any more
    assert _comparable(kept) == _comparable(_as_read(services, run_id))
    assert sum(t.unparsable.get("title", 0) for t in kept.values()) == 40


@pytest.mark.postgres
def test_a_first_sync_shapes_the_records_the_database_gives_back_alike(
    services: Services, cloud: CloudState, read_back: list[dict[str, Any]]
) -> None:
    """A run's first sync stores each clean record's shape as it copies it in, so the first
    evaluation reads none of them back, except a record holding a number that PostgreSQL
    gives back in another form (a float written with an exponent comes back as a whole number):
    that one is left to the evaluation, and the tallies are what reading the whole run gives."""
    records: list[dict[str, Any]] = list(product_records(12))
    records[0]["price"] = 1e16  # stored as 10000000000000000, read back as an int
    records[1]["price"] = 1e-7
    records[2]["price"] = 12.5  # plain: read back as it was written
    records[3]["price"] = 3
    job_id = finished_job(cloud, records)
    run_id = run_id_of(job_id)
    sync_offline(services, job_id)
    with services.uow.begin() as session:
        shaped = dict(
            session.execute(
                select(Observation.entity_key, Observation.shape).where(
                    Observation.run_id == run_id
                )
            ).all()
        )
    assert {key for key, found in shaped.items() if found is None} == {
        records[0]["sku"],
        records[1]["sku"],
    }
    read_back.clear()
    assert _evaluate(services, run_id) == "published"
    assert sorted(r["sku"] for r in read_back) == sorted([records[0]["sku"], records[1]["sku"]])
    with services.uow.begin() as session:
        kept, _ = shapes.tally(session, run_id, services.datasets.get("products"), keep=False)
    assert _comparable(kept) == _comparable(_as_read(services, run_id))


def test_a_number_the_database_would_give_back_otherwise_leaves_the_record_unshaped() -> None:
    """An infinity is stored as null and a float with an exponent as a plain number: a record
    holding one is left to its evaluation; a plain float or int keeps its shape."""
    from sync.ingest.records import _shape

    rules = RecordRules(required=("sku",))
    for value in (float("inf"), float("-inf"), float("nan"), 1e16, 1e-7, 2**70):
        assert _shape({"sku": "a", "price": value}, rules)[0] is None, value
    for value in (12.5, 3.0, 3, 0.001):
        assert _shape({"sku": "a", "price": value}, rules)[0] is not None, value


@pytest.fixture
def tallied(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, dict[str, PartitionTally]]]:
    """Each tally an evaluation makes: whether it counted the groups kept instead of the run
    (``kept`` given), and what it found."""
    made: list[tuple[bool, dict[str, PartitionTally]]] = []
    real = shapes.tally

    def recording(*args: Any, **kwargs: Any) -> Any:
        tallies, states = real(*args, **kwargs)
        made.append((kwargs.get("kept") is not None, tallies))
        return tallies, states

    monkeypatch.setattr(shapes, "tally", recording)
    return made


def _groups_of_run(statements: list[str]) -> list[str]:
    """The statements that count the run's rows per partition and shape."""
    return [s for s in statements if "FROM observations" in s and "GROUP BY" in s]


@pytest.fixture
def statements(services: Services) -> Any:
    """Every statement the database is sent meanwhile."""
    from sqlalchemy import event

    sent: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(services.uow.engine, "before_cursor_execute", note)
    yield sent
    event.remove(services.uow.engine, "before_cursor_execute", note)


@pytest.mark.postgres
def test_a_first_evaluation_counts_the_rows_its_import_copied_instead_of_the_run(
    services: Services,
    cloud: CloudState,
    read_back: list[dict[str, Any]],
    tallied: list[tuple[bool, dict[str, PartitionTally]]],
    statements: list[str],
) -> None:
    """A run's first sync copied straight in keeps how many rows it wrote per partition and
    shape, with the data version its commit made. The run's first evaluation counts those
    instead of passing over the run, reads back only the records with a defect, and finds the
    tallies and the verdict that reading the whole run gives."""
    records = _records()
    job_id = finished_job(cloud, records)
    run_id = run_id_of(job_id)
    sync_offline(services, job_id)
    with services.uow.begin() as session:
        run = _grouped(session, run_id)
        assert sum(n for *_, n in run.row_groups["groups"]) == len(records)
    statements.clear()
    assert _evaluate(services, run_id) == "rejected"  # a consent page, a shell...
    assert [imported for imported, _ in tallied] == [True]
    assert _groups_of_run(statements) == []
    defective = sorted(records[i]["sku"] for i in (CONSENT, UNPARSABLE, MISSING, SHELL))
    assert sorted(r["sku"] for r in read_back) == defective
    assert _comparable(tallied[0][1]) == _comparable(_as_read(services, run_id))


@pytest.mark.postgres
def test_a_continue_synced_before_the_first_evaluation_carries_the_groups_over(
    services: Services,
    cloud: CloudState,
    tallied: list[tuple[bool, dict[str, PartitionTally]]],
    statements: list[str],
) -> None:
    """A "Continue" synced before the run was first judged merges its records while the export
    downloads and counts what its writes replaced and wrote: the groups the first import kept
    move to the version its commit made, and the evaluation counts them, both imports' rows,
    as reading the run whole does, without a pass over the run; a forced evaluation after the
    verdict counts them again."""
    records = product_records(20)
    job_id = finished_job(cloud, records)
    run_id = run_id_of(job_id)
    sync_offline(services, job_id)
    changed = [dict(r) for r in records]
    changed[3]["title"] = "Are you a robot?"  # a consent page the first import did not hold
    changed[4]["price"] = "77.70"
    changed += product_records(2, start=900)
    _continue(services, cloud, job_id, changed)
    with services.uow.begin() as session:
        run = _grouped(session, run_id)
        assert sum(n for *_, n in run.row_groups["groups"]) == 22
    statements.clear()
    assert _evaluate(services, run_id) == "rejected"  # the consent page
    assert _evaluate(services, run_id) == "unchanged"
    assert [kept for kept, _ in tallied] == [True, True]
    assert _groups_of_run(statements) == []
    whole = _as_read(services, run_id)
    assert sum(t.records for t in whole.values()) == 22
    assert _comparable(tallied[0][1]) == _comparable(whole)
    assert _comparable(tallied[1][1]) == _comparable(whole)


@pytest.mark.postgres
def test_an_import_that_found_the_run_empty_keeps_no_groups_when_another_committed_first(
    services: Services,
) -> None:
    """Two first syncs of one run at once (two jobs of a window) both find it empty, at the
    same data version. The one that commits first keeps the run's groups for the version it
    made; the other's commit counts the version up by more than one (the other committed in
    between), so it knows its rows are not the run's only rows and keeps none: the groups kept
    stay at a version the run has moved past, which no evaluation trusts."""
    from collections import Counter

    from sync.ingest import run_rows, staging
    from sync.ingest.job_export import Staged

    run_id = "products-two-jobs"
    with services.uow.begin() as session:
        session.add(Run(run_id=run_id, dataset="products", collection_window="two-jobs"))
        session.commit()
    counted = Counter({("alpha.example", "shape"): 3})

    class Copied:
        keys_first = False
        copied_groups = counted

    def commit(session: Any, start: int | None, attempt: str) -> None:
        version = run_rows.count_import(session, run_id)
        change = Staged(Copied(), None, None, None, start).groups_change(version)  # type: ignore[arg-type]
        run_rows.keep_row_groups(session, run_id, attempt, version, change)
        session.commit()

    first, second = services.uow.begin(), services.uow.begin()
    with first as one, second as other:
        found_one = staging.run_version(one, run_id)
        found_other = staging.run_version(other, run_id)
        assert found_one[:2] == found_other[:2] == (False, 1)
        commit(other, found_other[1], "other")
        commit(one, found_one[1], "one")
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        assert run.data_version == 3
        assert run.row_groups == {"version": 2, "groups": [["alpha.example", "shape", "other", 3]]}
        assert shapes.kept_groups(run) is None


def _both_ways(services: Services, run_id: str) -> tuple[Any, Any]:
    """The run tallied and counted by state from the groups kept, and by a pass over it, in one
    snapshot (nothing written): each with the pending rows' ids it kept."""
    dataset = services.datasets.get("products")
    ways = []
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        for kept in (shapes.kept_groups(run), None):
            tallies, states = shapes.tally(
                session, run_id, dataset, keep=False, keep_pending=True, kept=kept
            )
            pending = text(f"SELECT id FROM {shapes.PENDING}")  # noqa: S608 - a constant name
            ids = set(session.execute(pending).scalars())
            ways.append((_comparable(tallies), states.rows, states.by_state, ids))
    return ways[0], ways[1]


@pytest.mark.postgres
def test_a_continue_after_a_verdict_is_judged_from_what_its_import_changed(
    services: Services,
    cloud: CloudState,
    tallied: list[tuple[bool, dict[str, PartitionTally]]],
    statements: list[str],
) -> None:
    """Each "Continue" merged while its export downloads records what its writes replaced and
    wrote, and the ids of the rows it wrote. The run's next evaluation counts the groups kept
    at the run's version and takes its pending rows from the imports since the verdict, two
    of them here, with no pass over the run: it finds the tallies, the states and the pending
    rows a pass finds, and publishes the rewritten records."""
    records = product_records(30)
    job_id = finished_job(cloud, records)
    run_id = run_id_of(job_id)
    sync_offline(services, job_id)
    assert _evaluate(services, run_id) == "published"
    changed = [dict(r) for r in records]
    for step, rewrite in enumerate(((2, 5, 11), (5, 12))):  # the 5th twice, both pending
        for i in rewrite:
            changed[i]["price"] = f"{50 + step}.25"
        changed += product_records(1, start=900 + step)  # a new record each time
        _continue(services, cloud, job_id, changed)
    with services.uow.begin() as session:
        _grouped(session, run_id)
        written = session.execute(
            select(RunImport.written).where(RunImport.run_id == run_id, RunImport.version > 2)
        ).scalars()
        assert sorted(len(ids) for ids in written) == [3, 4]  # rewritten and new, per import
    kept, passed = _both_ways(services, run_id)
    assert kept == passed
    assert len(kept[3]) == 6  # rows 2, 5, 11, 12 and the two new ones
    tallied.clear()
    statements.clear()
    assert _evaluate(services, run_id) == "published"
    assert [was_kept for was_kept, _ in tallied] == [True]
    assert _groups_of_run(statements) == []
    assert _comparable(tallied[0][1]) == _comparable(_as_read(services, run_id))
    with services.uow.begin() as session:
        prices = dict(session.execute(text("SELECT sku, price FROM datasets.products")).all())
    assert len(prices) == 32
    assert {prices[changed[i]["sku"]] for i in (2, 5, 11, 12)} == {"50.25", "51.25"}


@pytest.mark.postgres
def test_a_continue_merged_after_its_download_has_the_next_evaluation_pass_over_the_run(
    services: Services,
    cloud: CloudState,
    tallied: list[tuple[bool, dict[str, PartitionTally]]],
) -> None:
    """A "Continue" whose export holds a record twice is merged after its download (the early
    merge is undone): it cannot say what it replaced, so the groups stay at the version before
    its commit, and the next evaluation passes over the run, finding what it must."""
    records = product_records(20)
    job_id = finished_job(cloud, records)
    run_id = run_id_of(job_id)
    sync_offline(services, job_id)
    assert _evaluate(services, run_id) == "published"
    changed = [dict(r) for r in records]
    changed[1]["price"] = "61.00"
    changed.append(dict(changed[1]))  # the same record twice
    _continue(services, cloud, job_id, changed)
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        assert shapes.kept_groups(run) is None
    tallied.clear()
    assert _evaluate(services, run_id) == "published"
    assert [was_kept for was_kept, _ in tallied] == [False]
    assert _comparable(tallied[0][1]) == _comparable(_as_read(services, run_id))
    kept, passed = _both_ways(services, run_id)  # the pass kept the groups again
    assert kept == passed
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        assert shapes.kept_groups(run) is not None


_CHANGES = ("price", "retailer", "consent", "new", "twice")


@pytest.mark.postgres
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(
        st.tuples(
            st.sets(st.integers(0, 15), max_size=5), st.sampled_from(_CHANGES), st.booleans()
        ),
        min_size=1,
        max_size=4,
    )
)
def test_the_groups_kept_count_a_run_as_a_pass_over_it_does(
    services: Services, cloud: CloudState, steps: list[tuple[set[int], str, bool]]
) -> None:
    """Whatever "Continue"s rewrite (prices, a record moved to another partition, a consent
    page, new records, a record twice, which has the merge wait for the download), with or
    without an evaluation after each: the groups kept, and the pending rows the imports
    recorded, count the run as a pass over it does."""
    records = product_records(16)
    job_id = finished_job(cloud, records)
    run_id = run_id_of(job_id)
    sync_offline(services, job_id)
    current = [dict(r) for r in records]
    exported = len(current)
    for step, (picked, change, judge) in enumerate(steps):
        for i in picked:
            if change == "price":
                current[i]["price"] = f"{10 + step}.50"
            elif change == "retailer":
                current[i]["retailer"] = "zeta.example"
            elif change == "consent":
                current[i]["title"] = "Are you a robot?"
        # more records each time: Cloud's counters move, so the Continue is downloaded
        current += product_records(2 if change == "new" else 1, start=1000 + 10 * step)
        while len(current) <= exported:
            current += product_records(1, start=1000 + 10 * step + len(current))
        export = current + ([dict(current[0])] if change == "twice" else [])
        exported = len(export)
        _continue(services, cloud, job_id, export)
        kept, passed = _both_ways(services, run_id)
        assert kept == passed
        if judge:
            _evaluate(services, run_id)


@pytest.mark.postgres
def test_an_import_keeps_no_groups_when_an_evaluation_gave_rows_shapes_meanwhile(
    services: Services,
) -> None:
    """An import reads the rows it replaces as they stand when it begins. An evaluation that
    gives rows their shapes while it downloads (a run with rows no shape was kept for) keeps the
    groups as those shapes leave them: what the import says it replaced may be the rows before
    their shapes, so it keeps no groups, and the next evaluation passes over the run. An import
    that replaced nothing (it only added rows) still carries the groups over."""
    from sync.ingest import run_rows, staging
    from sync.ingest.job_export import Staged

    run_id = "products-shaped-meanwhile"
    before = {"version": 1, "groups": [["alpha.example", None, "first", 3]]}
    # two of the three given their shapes, one left without (a defect)
    shaped = {
        "version": 1,
        "groups": [["alpha.example", None, "first", 1], ["alpha.example", "f|shape", "first", 2]],
    }
    with services.uow.begin() as session:
        session.add(
            Run(run_id=run_id, dataset="products", collection_window="w", row_groups=before)
        )
        session.commit()

    class Merged:
        keys_first = True

        def __init__(self, replaced: dict[Any, int]) -> None:
            self.written = RowsWritten(replaced=Counter(replaced))
            self.written.wrote[("alpha.example", "f|new")] += 1

    for replaced, kept_after in (
        ({("alpha.example", None, "first"): 1}, shaped),  # read before the shapes: not kept
        ({}, None),  # only added: carried over from the groups the evaluation kept
    ):
        with services.uow.begin() as session:
            session.execute(update(Run).where(Run.run_id == run_id).values(row_groups=before))
            session.commit()
        with services.uow.begin() as importing:
            found = staging.run_version(importing, run_id)
            with services.uow.begin() as evaluating:  # gives the rows shapes, and commits
                evaluating.execute(
                    update(Run).where(Run.run_id == run_id).values(row_groups=shaped)
                )
                evaluating.commit()
            version = run_rows.count_import(importing, run_id)
            staged = Staged(Merged(replaced), None, None, None, found.version, found.groups)  # type: ignore[arg-type]
            change = staged.groups_change(version)
            run_rows.keep_row_groups(importing, run_id, "second", version, change)
            importing.commit()
        with services.uow.begin() as session:
            run = session.get(Run, run_id)
            assert run is not None
            if kept_after is not None:
                assert run.row_groups == kept_after
                assert shapes.kept_groups(run) is None
            else:
                assert run.row_groups is not None
                assert run.row_groups["version"] == run.data_version
                assert sorted(map(repr, run.row_groups["groups"])) == sorted(
                    map(
                        repr,
                        [
                            ["alpha.example", None, "first", 1],
                            ["alpha.example", "f|shape", "first", 2],
                            ["alpha.example", "f|new", "second", 1],
                        ],
                    )
                )
            session.execute(update(Run).where(Run.run_id == run_id).values(data_version=1))
            session.commit()
