"""A run's records tallied per partition, reading again only what the last evaluation did not
judge: the shape of every record without defects is kept by its payload hash
(:class:`sync.models.RecordProfile`), and the database counts the run's rows per partition and
kept shape in one statement.

A first evaluation reads every record once and keeps the shapes; after a "Continue" that changed
a tenth of the records, the next reads that tenth. Records with a defect keep no shape: they are
read every time, so that their samples are those of the run as it is. The shapes are kept under
the record rules' fingerprint; a changed datasets file judges every record again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
from sqlalchemy import Text, case, cast, delete, exists, func, insert, select
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync.acceptance.facts import NO_PARTITION, PartitionTally, RecordRules
from sync.acceptance.records import add_shape, tally_record
from sync.db import planner_method_off
from sync.models import Observation, RecordProfile
from sync.states import ValidationState

BATCH = 5000  # rows read, and shapes written, at a time


def tally(
    session: Session, run_id: str, dataset: Dataset, *, keep: bool = True
) -> tuple[dict[str, PartitionTally], int]:
    """The run's records tallied per partition under the dataset's record rules, and how many
    of its rows were written since the last verdict; ``keep`` false writes nothing (a
    read-only re-judgement keeps no shapes)."""
    rules = RecordRules.of(dataset)
    fingerprint = rules.fingerprint
    p = RecordProfile.__table__.c
    if keep:  # shapes kept under rules no longer in force
        session.execute(delete(RecordProfile).where(p.run_id == run_id, p.rules != fingerprint))
    tallies: dict[str, PartitionTally] = {}
    pending = 0
    known = session.execute(
        select(exists().where(p.run_id == run_id, p.rules == fingerprint))
    ).scalar_one()
    if known:
        pending = _count_known(session, run_id, fingerprint, tallies)
    keeper = _Keeper(session, run_id, fingerprint) if keep else None
    for partition, payload, payload_hash, state in _unjudged(session, run_id, fingerprint, known):
        if state == ValidationState.PENDING:
            pending += 1
        record = orjson.loads(payload)
        found = tally_record(_tally_of(tallies, partition), record, rules)
        if found is not None and keeper is not None:
            keeper.add(payload_hash, found)
    if keeper is not None:
        keeper.flush(final=True)
    return tallies, pending


def _tally_of(tallies: dict[str, PartitionTally], partition: str | None) -> PartitionTally:
    name = partition if partition is not None else NO_PARTITION
    found = tallies.get(name)
    if found is None:
        found = tallies[name] = PartitionTally(name)
    return found


def _shapes(run_id: str, fingerprint: str) -> Any:
    p = RecordProfile.__table__.c
    return (
        select(p.payload_hash, p.shape)
        .where(p.run_id == run_id, p.rules == fingerprint)
        .distinct()
        .subquery("shapes")
    )


def _count_known(
    session: Session, run_id: str, fingerprint: str, tallies: dict[str, PartitionTally]
) -> int:
    """Count the run's rows whose shape is kept into ``tallies``; return the rows written since
    the last verdict (of all the run's rows, kept shape or not)."""
    o = Observation.__table__.c
    shapes = _shapes(run_id, fingerprint)
    pending = func.sum(case((o.validation_state == ValidationState.PENDING, 1), else_=0))
    query = (
        select(o.partition, shapes.c.shape, func.count(), pending)
        .select_from(
            Observation.__table__.outerjoin(shapes, shapes.c.payload_hash == o.payload_hash)
        )
        .where(o.run_id == run_id)
        .group_by(o.partition, shapes.c.shape)
    )
    with planner_method_off(session, "enable_nestloop"):  # the whole run against its shapes
        groups = session.execute(query).all()
    written = 0
    for partition, found, records, rewritten in groups:
        written += int(rewritten or 0)
        if found is not None:
            add_shape(_tally_of(tallies, partition), found, int(records))
    return written


def _unjudged(session: Session, run_id: str, fingerprint: str, known: bool) -> Iterator[Any]:
    """(partition, payload as text, payload hash, validation state) of the run's rows whose
    shape is not kept (all of them when ``known`` is false), a batch at a time."""
    o = Observation.__table__.c
    # the payload as text, parsed by orjson: half the time of the driver's JSON decoding
    columns = (o.partition, cast(o.payload, Text), o.payload_hash, o.validation_state)
    if not known:
        query = select(*columns).where(o.run_id == run_id)
    else:
        shapes = _shapes(run_id, fingerprint)
        query = (
            select(*columns)
            .select_from(
                Observation.__table__.outerjoin(shapes, shapes.c.payload_hash == o.payload_hash)
            )
            .where(o.run_id == run_id, shapes.c.payload_hash.is_(None))
        )
    with planner_method_off(session, "enable_nestloop"):
        rows = session.execute(query.execution_options(yield_per=BATCH))
    return iter(rows)


class _Keeper:
    """The shapes of clean records, written a batch at a time (PostgreSQL: by COPY while the
    rows stream in; SQLite, whose reads could see them, once every row is read)."""

    def __init__(self, session: Session, run_id: str, fingerprint: str) -> None:
        self.connection = session.connection()
        self.postgres = self.connection.dialect.name == "postgresql"
        self.run_id, self.fingerprint = run_id, fingerprint
        self.batch: dict[str, str] = {}

    def add(self, payload_hash: str, found: str) -> None:
        self.batch[payload_hash] = found
        if self.postgres and len(self.batch) >= BATCH:
            self.flush()

    def flush(self, *, final: bool = False) -> None:
        if not self.batch or not (self.postgres or final):
            return
        rows = [(self.run_id, h, self.fingerprint, s) for h, s in self.batch.items()]
        self.batch = {}
        if self.postgres:
            raw = self.connection.connection.driver_connection
            assert raw is not None
            with (
                raw.cursor() as cursor,
                cursor.copy(
                    "COPY record_profiles (run_id, payload_hash, rules, shape) FROM STDIN"
                ) as copy,
            ):
                for row in rows:
                    copy.write_row(row)
        else:
            self.connection.execute(
                insert(RecordProfile),
                [{"run_id": r, "payload_hash": h, "rules": f, "shape": s} for r, h, f, s in rows],
            )
