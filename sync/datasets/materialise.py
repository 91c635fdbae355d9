"""Bringing a dataset's table ``X`` to its published run, inside the transaction that moves the
published pointer, so a reader holding one snapshot sees the old run or the new one whole.

The published view of run R: R's valid observations (its passed partitions), plus the rows
``X`` already holds of the partitions R quarantined (kept as they are, with the run id they came
from; never reported removed), plus the rows of the entities whose record R set aside at import
(a NUL, an overlong value: :mod:`sync.ingest.set_aside`), kept with their last values, flagged
``stale`` and with the values at fault in ``set_aside``; never reported removed either. Every
other entity leaves ``X``. Rejected runs and quarantined partitions never appear.

Only what changed is read into Python: the database itself finds R's observations whose entity is
new to ``X`` or whose payload hash differs from the row's, and the rows of ``X`` that R no longer
has; those are cast and compared (:func:`sync.datasets.changes.compare`), written in bulk, and
recorded in the history (:mod:`sync.datasets.history`) and the change feed
(:mod:`sync.datasets.change_feed`). The rows R left as they were only take R's run id and window, in
one UPDATE.

Withdrawal: when a published run is rejected later, its publication is undone in the history (the
stretches it opened are deleted, those it closed reopened) and ``X`` is brought to the run the
pointer falls back to; with none to fall back on, ``X`` is emptied and every entity is reported
removed (:mod:`sync.datasets.withdrawal`).

On PostgreSQL, the new and changed entities whose values are plain are written by set-based
statements (:mod:`sync.datasets.changed_publication`) before the rest pass through Python.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import (
    RowMapping,
    Select,
    Text,
    bindparam,
    cast,
    exists,
    func,
    null,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from config.columns import watch_by_column
from config.datasets import Dataset
from sync.acceptance import row_states
from sync.acceptance.facts import NO_PARTITION
from sync.casts import cast_record
from sync.datasets import change_feed, changed_publication, first_publication
from sync.datasets import history as dataset_history
from sync.datasets import schema as dataset_schema
from sync.datasets.changes import ADDED, ChangeSet, Values, compare
from sync.datasets.history import Row
from sync.datasets.rows import delete_keys, insert_rows
from sync.datasets.tables import DatasetTables
from sync.db import planner_method_off
from sync.models import Observation, PartitionVerdict, Publication, Run, SetAsideRecord
from sync.states import PartitionState

BATCH = 2000  # entities cast, compared and written at a time: a publication holds one batch
SET_BASED = True  # PostgreSQL writes plain entities by set-based statements (tests turn it off)


@dataclass(frozen=True)
class _Seen:
    """An observation of the run that ``X`` does not hold as it is."""

    entity_key: str
    partition: str | None
    payload: dict[str, Any]
    payload_hash: str
    before: Values | None  # the row X holds now, if any


@dataclass(frozen=True)
class Materialised:
    """What a publication did to the dataset's tables: the change set and its events."""

    changes: ChangeSet
    events: tuple[str, ...]


@dataclass(frozen=True)
class _Publishing:
    """One publication in progress: where it writes and what it compares against."""

    session: Session
    dataset: Dataset
    run: Run
    feed: change_feed.Feed
    start: datetime
    undo: frozenset[str]
    fresh: bool  # the history held nothing: each row opens its entity's first stretch
    counted_only: bool  # a baseline into an empty table: counted, never listed


def apply_publication(
    session: Session,
    dataset: Dataset,
    run: Run,
    *,
    schema: str,
    now: datetime,
    previous_run_id: str | None = None,
    replacing: str | None = None,
    fields: Collection[str] | None = None,
    valid_rows: int | None = None,
    pending_ids: str | None = None,
) -> Materialised:
    """Bring the dataset's table to ``run``'s published view, with its history and change feed;
    ``replacing`` is a published run being withdrawn in its favour; ``fields``, every field of
    the run's published records, when the caller knows them (a dataset without ``[columns]``
    gets a text column for each new one; else the database finds those of the rows to write);
    ``valid_rows``, how many valid observations the run holds, when the caller counted them in
    this transaction (else the database counts them); ``pending_ids``, a temporary table of the
    ids of the rows written since the run's last verdict, when the table holds the run's other
    valid rows as its last publication wrote them (only those rows are then searched for changes).
    The run's rows pass through Python a batch at a time, so memory does not grow with the run."""
    if valid_rows is None:
        valid_rows = _valid_count(session, run.run_id)
    tables = dataset_schema.tables_in(session, dataset.name, schema)
    # the history held nothing before this publication (a first copy fills the table below)
    fresh = dataset_history.is_empty(session, tables)
    had_rows = _has_rows(session, tables)
    if not dataset.columns:  # a text column for each field first seen, before any row is cast
        seen = _new_fields(session, tables, run) if fields is None else set(fields)
        added = dataset_schema.new_columns(tables.columns, seen)
        tables = dataset_schema.add_columns(session, tables, added, schema)
    copied = _copy_plain_first(session, dataset, tables, run) if fresh else 0
    # a first publication that copied every row leaves nothing for Python to cast or compare
    complete = copied > 0 and copied == valid_rows
    baseline = not _published_before(session, dataset.name)
    feed = change_feed.Feed(
        session, tables, dataset, run.run_id, previous_run_id, run.revision, now, baseline
    )
    # a run published again corrects what it wrote before; a fallback undoes the withdrawn run
    publishing = _Publishing(
        session,
        dataset,
        run,
        feed,
        start=dataset_history.window_start(run),
        undo=frozenset({replacing} if replacing else {run.run_id}),
        fresh=fresh,
        counted_only=baseline and not had_rows,
    )
    if not complete:
        among = SET_BASED and changed_publication.publish_changes(
            session,
            tables,
            dataset,
            feed,
            run=run,
            start=publishing.start,
            undo=publishing.undo,
            fresh=fresh,
            pending_ids=pending_ids,
        )
        for batch in _new_and_changed(session, tables, run.run_id, among=among):
            _publish_batch(publishing, tables, batch)
    others = had_rows  # whether the table may hold rows of other runs
    if not copied:  # after a first copy the table holds only rows of this run
        held, others = _rows_held(session, tables, run.run_id)
        quarantined = _quarantined(session, run.run_id)
        kept = _set_aside(session, run.run_id)
        for gone in _missing(session, tables, run.run_id, valid_rows, held):
            _remove_batch(publishing, tables, gone, quarantined, kept)
    if copied:  # a baseline, counted only: the rows the database copied are added too
        feed.counts[ADDED] += copied
    if had_rows and others:  # rows of other runs may have been observed unchanged
        _take_unchanged(session, tables, run)
    return Materialised(feed.change_set(), tuple(feed.announce()))


def _publish_batch(publishing: _Publishing, tables: DatasetTables, seen: list[_Seen]) -> None:
    """Cast, compare, record in the history and write one batch of new and changed entities."""
    session, run = publishing.session, publishing.run
    rows: dict[str, Row | None] = {}
    failures: dict[str, list[dict[str, Any]] | None] = {}
    before: dict[str, Values] = {}
    after: dict[str, Values] = {}
    for s in seen:
        values, failed = cast_record(tables.columns, s.payload)
        rows[s.entity_key] = Row(values, s.partition, s.payload_hash)
        failures[s.entity_key] = [f.as_dict() for f in failed] or None
        after[s.entity_key] = values
        if s.before is not None:
            before[s.entity_key] = s.before
    publishing.feed.add(_compare(publishing, before, after))
    if publishing.fresh:  # nothing to reconcile: each row opens its entity's first stretch
        start = publishing.start
        dates = {key: dataset_history.Dates(start, start, run.run_id) for key in after}
    else:
        dates = dataset_history.record(
            session, tables, rows, run_id=run.run_id, start=publishing.start, undo=publishing.undo
        )
    delete_keys(session, tables.current, "entity_key", list(before))
    insert_rows(
        session,
        tables.current,
        [
            {
                "entity_key": s.entity_key,
                **after[s.entity_key],
                "partition": s.partition,
                "run_id": run.run_id,
                "collection_window": run.collection_window,
                "first_seen_at": dates[s.entity_key].first_seen_at,
                "last_changed_at": dates[s.entity_key].last_changed_at,
                "changed_by_run_id": dates[s.entity_key].changed_by_run_id,
                "cast_failures": failures[s.entity_key],
                "payload_hash": s.payload_hash,
            }
            for s in seen
        ],
    )


def _remove_batch(
    publishing: _Publishing,
    tables: DatasetTables,
    missing: dict[str, tuple[str | None, Values]],
    quarantined: set[str],
    kept: Mapping[str, list[dict[str, Any]]],
) -> None:
    """Take one batch of entities the run no longer has out of ``X``, closing their history
    (those of partitions the run quarantined keep their rows, and those whose record the run
    set aside keep theirs, flagged stale)."""
    stale = {key: kept[key] for key in missing if key in kept}
    if stale:
        _mark_stale(publishing.session, tables, stale)
    gone = {
        key: values
        for key, (partition, values) in missing.items()
        if (partition if partition is not None else NO_PARTITION) not in quarantined
        and key not in stale
    }
    if not gone:
        return
    publishing.feed.add(_compare(publishing, gone, {}))
    dataset_history.record(
        publishing.session,
        tables,
        dict.fromkeys(gone),
        run_id=publishing.run.run_id,
        start=publishing.start,
        undo=publishing.undo,
    )
    delete_keys(publishing.session, tables.current, "entity_key", list(gone))


def _set_aside(session: Session, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """The run's records set aside at import whose entity is known: entity key -> the values
    at fault, each with the run and export line it came from."""
    found: dict[str, list[dict[str, Any]]] = {}
    rows = session.execute(
        select(
            SetAsideRecord.entity_key,
            SetAsideRecord.values,
            SetAsideRecord.job_id,
            SetAsideRecord.line,
        ).where(SetAsideRecord.run_id == run_id)
    )
    for key, values, job_id, line in rows:
        found[key] = [{**v, "run_id": run_id, "job_id": job_id, "line": line} for v in values or []]
    return found


def _mark_stale(
    session: Session, tables: DatasetTables, stale: Mapping[str, list[dict[str, Any]]]
) -> None:
    """Keep these entities' rows as they are, flagged stale with the values set aside."""
    x = tables.current.c
    session.execute(
        update(tables.current)
        .where(x.entity_key == bindparam("_key"))
        .values(stale=True, set_aside=bindparam("_values", type_=x.set_aside.type))
        .execution_options(synchronize_session=False),
        [{"_key": key, "_values": values} for key, values in stale.items()],
    )


def _compare(
    publishing: _Publishing, before: Mapping[str, Values], after: Mapping[str, Values]
) -> ChangeSet:
    feed = publishing.feed
    return compare(
        publishing.dataset.name,
        publishing.run.run_id,
        feed.previous_run_id,
        before,
        after,
        watch_by_column(publishing.dataset.watch),
        baseline=publishing.counted_only,
    )


def _copy_plain_first(session: Session, dataset: Dataset, tables: DatasetTables, run: Run) -> int:
    """On PostgreSQL, a dataset's first publication into empty tables (the caller checked them)
    has the database cast and copy the rows whose values are all plain
    (:mod:`sync.datasets.first_publication`); returns how many."""
    if dataset_schema.dialect_of(session) != "postgresql" or _published_before(
        session, dataset.name
    ):
        return 0
    return first_publication.copy_plain_rows(
        session,
        tables,
        run_id=run.run_id,
        window=run.collection_window,
        start=dataset_history.window_start(run),
    )


def _seen_query(
    session: Session, tables: DatasetTables, run_id: str, *, among: bool = False
) -> Select[Any]:
    """The run's valid observations whose entity ``X`` lacks or holds with another payload hash,
    with the row ``X`` holds of it (``among``: of the observations in ``pub_seen``)."""
    o = Observation.__table__.c
    x = tables.current.c
    names = [c.name for c in tables.columns]
    observations: Any = Observation.__table__
    if among:  # from the few ids up: each row by its key
        seen = changed_publication.SEEN_IDS
        observations = seen.join(Observation.__table__, o.id == seen.c.id)
    return (
        select(
            o.entity_key,
            o.partition,
            cast(o.payload, Text).label("_payload"),
            o.payload_hash,
            x.entity_key.label("_known"),
            *(x[n].label(f"_x_{n}") for n in names),
        )
        .select_from(observations.outerjoin(tables.current, x.entity_key == o.entity_key))
        .where(
            # pub_seen holds only the run's valid observations, and its ids lead the plan: a
            # filter on the run would be planned from statistics that predate the run
            true() if among else row_states.valid(session, run_id),
            x.entity_key.is_(None) | (x.payload_hash != o.payload_hash),
        )
    )


def _new_and_changed(
    session: Session, tables: DatasetTables, run_id: str, *, among: bool = False
) -> Iterator[list[_Seen]]:
    """:func:`_seen_query`'s rows in batches, read as the caller writes them (``among``: only
    from the observations set-based statements left, ``pub_seen``). A batch's rows of ``X`` are
    replaced by rows of the run, which the query no longer finds, and no other observation of
    the run has their entity, so writing while reading changes no later batch."""
    names = [c.name for c in tables.columns]
    if among:  # a few rows, found by their ids
        parts = _batches(session, _seen_query(session, tables, run_id, among=True))
    else:
        # Planned for a fast start (a cursor) on statistics taken before the run was
        # published, the join became a nested loop scanning X once per observation while the
        # batches grow X: quadratic. A hash join reads X once, when the cursor opens.
        with whole_set_joins(session):
            parts = _batches(session, _seen_query(session, tables, run_id))
    for part in parts:
        yield [
            _Seen(
                entity_key=r["entity_key"],
                partition=r["partition"],
                payload=orjson.loads(r["_payload"]),
                payload_hash=r["payload_hash"],
                before={n: r[f"_x_{n}"] for n in names} if r["_known"] is not None else None,
            )
            for r in part
        ]


def _batches(session: Session, query: Select[Any]) -> Iterator[Sequence[RowMapping]]:
    """The query's rows a batch at a time, the query run now. PostgreSQL streams them from a
    server-side cursor, which never sees what the transaction writes after it opened; SQLite,
    whose reads may see such writes, reads them all first (its deployments are the small ones)."""
    if dataset_schema.dialect_of(session) == "postgresql":
        streamed = session.execute(query.execution_options(yield_per=BATCH)).mappings()
        return iter(streamed.partitions())
    rows = session.execute(query).mappings().all()
    return iter([rows[start : start + BATCH] for start in range(0, len(rows), BATCH)])


def _new_fields(session: Session, tables: DatasetTables, run: Run) -> set[str]:
    """The fields of the run's new and changed records, found by the database (a dataset
    without a ``[columns]`` table gets a text column for each)."""
    seen = _seen_query(session, tables, run.run_id).subquery()
    if dataset_schema.dialect_of(session) == "postgresql":
        keys = select(func.jsonb_object_keys(cast(seen.c._payload, JSONB))).distinct()
    else:
        each = func.json_each(seen.c._payload).table_valued("key")
        keys = select(each.c.key).select_from(seen).join(each, true()).distinct()
    return set(session.execute(keys).scalars())


def missing_query(session: Session, tables: DatasetTables, run_id: str) -> Select[Any]:
    """The rows of ``X`` whose entity has no valid observation in the run."""
    o = Observation.__table__.c
    x = tables.current.c
    names = [c.name for c in tables.columns]
    if dataset_schema.dialect_of(session) == "postgresql":  # a hash anti-join
        absent = ~exists().where(row_states.valid(session, run_id), o.entity_key == x.entity_key)
    else:  # SQLite makes the list an ephemeral index, where NOT EXISTS scans per row
        absent = x.entity_key.not_in(select(o.entity_key).where(row_states.valid(session, run_id)))
    return select(x.entity_key, x.partition, *(x[n] for n in names)).where(absent)


def whole_set_joins(session: Session) -> AbstractContextManager[None]:
    """Joins of a whole run with a whole table by hash or merge, never a nested loop.

    Observations have no index on ``entity_key``, and the statistics PostgreSQL plans with
    predate the run being published (its rows were written, then judged, moments ago):
    planned from them, a run looks like one row, and the anti-join becomes a nested loop that
    scans the run once per row of ``X`` (seconds at 20,000 rows, hours at a million)."""
    return planner_method_off(session, "enable_nestloop")


def _rows_held(session: Session, tables: DatasetTables, run_id: str) -> tuple[int, bool]:
    """How many rows ``X`` holds, and whether any comes from another run, in one pass."""
    x = tables.current.c
    held, others = session.execute(
        select(func.count(), func.count().filter(x.run_id != run_id)).select_from(tables.current)
    ).one()
    return int(held), bool(others)


def _missing(
    session: Session, tables: DatasetTables, run_id: str, valid_rows: int, held: int
) -> Iterator[dict[str, tuple[str | None, Values]]]:
    """The rows of ``X`` whose entity has no valid observation in the run, in batches: entity
    key -> (partition, values). Only rows already read are deleted while reading. None when
    ``X`` holds (``held``) as many rows as the run has valid observations (``valid_rows``):
    each has its row by now, so two counts spare the anti-join of the run with the table."""
    if held == valid_rows:
        return
    names = [c.name for c in tables.columns]
    with whole_set_joins(session):
        parts = _batches(session, missing_query(session, tables, run_id))
    for part in parts:
        yield {r["entity_key"]: (r["partition"], {n: r[n] for n in names}) for r in part}


def _valid_count(session: Session, run_id: str) -> int:
    """How many valid observations the run holds."""
    valid = select(func.count()).where(row_states.valid(session, run_id))
    return int(session.execute(valid).scalar_one())


def _has_rows(session: Session, tables: DatasetTables) -> bool:
    return bool(session.execute(select(exists().select_from(tables.current))).scalar_one())


def _quarantined(session: Session, run_id: str) -> set[str]:
    """The partitions the run quarantined (``(none)`` for records of no partition)."""
    return set(
        session.execute(
            select(PartitionVerdict.partition).where(
                PartitionVerdict.run_id == run_id,
                PartitionVerdict.state == PartitionState.QUARANTINED,
            )
        ).scalars()
    )


def _published_before(session: Session, dataset: str) -> bool:
    """Whether the dataset had a publication before the one being made."""
    count = session.execute(select(func.count()).where(Publication.dataset == dataset)).scalar_one()
    return int(count) > 1


def _take_unchanged(session: Session, tables: DatasetTables, run: Run) -> None:
    """The rows the run observed unchanged now come from it (when the table holds rows of
    other runs: a "Continue" published over its own has none, and is spared the pass)."""
    o = Observation.__table__.c
    x = tables.current.c
    with whole_set_joins(session):  # the whole run against the whole table, as in _missing
        session.execute(
            update(tables.current)
            .where(
                x.run_id != run.run_id,
                x.entity_key.in_(select(o.entity_key).where(row_states.valid(session, run.run_id))),
            )
            .values(
                run_id=run.run_id,
                collection_window=run.collection_window,
                stale=False,
                set_aside=null(),
            )
            .execution_options(synchronize_session=False)
        )
