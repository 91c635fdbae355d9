"""A run's records tallied per partition, reading again only what no evaluation judged before.

Every observation keeps the shape of its record as the last evaluation of its run judged it, or
as the sync that wrote it found it when it copied the record straight in or merged it while the
export downloaded (:mod:`sync.ingest.records`): the fields it fills and those it leaves empty, in
name order, under the fingerprint of the record rules it was judged by (``observations.shape``).
A sync that merges the row after the download forgets it. The database counts the run's rows per
partition and shape in one statement; only the rows without a shape under the rules in force are
read and tallied in Python. Records with a defect keep no shape: they are read every time, so
that their samples are those of the run as it is.

The shapes found are written with the verdict, in the statement that marks those rows valid or
quarantined (:func:`apply`), so no row is written twice. A first evaluation reads the records
with a defect (every record, where the sync merged them after the download); after a
"Continue" that rewrote a tenth of them, the next one reads those of that tenth with a defect."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from sqlalchemy import Connection, Text, case, cast, func, or_, select, text
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync.acceptance.facts import NO_PARTITION, PartitionTally, RecordRules
from sync.acceptance.records import add_shape, tally_record
from sync.models import Observation
from sync.states import ValidationState

BATCH = 5000  # rows read, and shapes staged, at a time
STAGED = "obs_shapes"  # the shapes found by this evaluation, until its verdict writes them


def tally(
    session: Session, run_id: str, dataset: Dataset, *, keep: bool = True
) -> tuple[dict[str, PartitionTally], int]:
    """The run's records tallied per partition under the dataset's record rules, and how many
    of its rows were written since the last verdict. With ``keep``, the shapes of the records
    read are staged for :func:`apply`; without, nothing is written (a read-only re-judgement)."""
    rules = RecordRules.of(dataset)
    prefix = rules.fingerprint + "|"
    o = Observation.__table__.c
    kept = o.shape.startswith(prefix, autoescape=True)
    tallies: dict[str, PartitionTally] = {}
    pending = 0
    pending_rows = func.sum(case((o.validation_state == ValidationState.PENDING, 1), else_=0))
    groups = session.execute(
        select(o.partition, case((kept, o.shape)), func.count(), pending_rows)
        .where(o.run_id == run_id)
        .group_by(o.partition, case((kept, o.shape)))
    ).all()
    unjudged = 0
    for partition, found, records, rewritten in groups:
        pending += int(rewritten or 0)
        if found is None:
            unjudged += int(records)
        else:
            add_shape(_tally_of(tallies, partition), found[len(prefix) :], int(records))
    if not unjudged:
        return tallies, pending
    stage = _Stage(session.connection(), prefix) if keep else None
    # the payload as text, parsed by orjson: half the time of the driver's JSON decoding
    rows = session.execute(
        select(o.id, o.partition, cast(o.payload, Text))
        .where(o.run_id == run_id, or_(o.shape.is_(None), ~kept))
        .execution_options(yield_per=BATCH)
    )
    for row_id, partition, payload in rows:
        found = tally_record(_tally_of(tallies, partition), orjson.loads(payload), rules)
        if found is not None and stage is not None:
            stage.add(row_id, found)
    if stage is not None:
        stage.flush(final=True)
        session.info[STAGED] = True
    return tallies, pending


def apply(session: Session, quarantined: Sequence[str]) -> None:
    """Write the shapes this evaluation staged onto their rows, and mark those rows valid (or
    quarantined, in the partitions named) in the same statement. Rows a sync rewrote since the
    evaluation read them are refused by REPEATABLE READ, as every write of a verdict is."""
    if not session.info.pop(STAGED, False):
        return
    connection = session.connection()
    params: dict[str, object] = {"none": NO_PARTITION, "quarantined": list(quarantined)}
    if connection.dialect.name == "postgresql":
        sql = (
            "UPDATE observations SET shape = s.shape, validation_state = CASE WHEN "  # noqa: S608 - constants only
            "COALESCE(observations.partition, :none) = ANY(:quarantined) "
            f"THEN '{ValidationState.QUARANTINED}' ELSE '{ValidationState.VALID}' END "
            f"FROM {STAGED} s WHERE observations.id = s.id"
        )
    else:
        sql = (
            f"UPDATE observations SET shape = (SELECT s.shape FROM {STAGED} s "  # noqa: S608 - constants only
            "WHERE s.id = observations.id), validation_state = CASE WHEN "
            "COALESCE(partition, :none) IN (SELECT value FROM json_each(:quarantined)) "
            f"THEN '{ValidationState.QUARANTINED}' ELSE '{ValidationState.VALID}' END "
            f"WHERE id IN (SELECT id FROM {STAGED})"
        )
        params["quarantined"] = orjson.dumps(list(quarantined)).decode()
    connection.execute(text(sql), params)
    connection.execute(text(f"DELETE FROM {STAGED}"))  # noqa: S608 - a constant name


def _tally_of(tallies: dict[str, PartitionTally], partition: str | None) -> PartitionTally:
    name = partition if partition is not None else NO_PARTITION
    found = tallies.get(name)
    if found is None:
        found = tallies[name] = PartitionTally(name)
    return found


class _Stage:
    """The shapes of clean records read by this evaluation, staged in a temporary table a batch
    at a time (PostgreSQL: by COPY while the rows stream in; SQLite, once every row is read)."""

    def __init__(self, connection: Connection, prefix: str) -> None:
        self.connection = connection
        self.postgres = connection.dialect.name == "postgresql"
        self.prefix = prefix
        self.batch: list[tuple[int, str]] = []
        if self.postgres:
            connection.execute(
                text(
                    f"CREATE TEMP TABLE IF NOT EXISTS {STAGED} (id bigint, shape text) "
                    "ON COMMIT DROP"
                )
            )
        else:
            connection.execute(
                text(f"CREATE TEMP TABLE IF NOT EXISTS {STAGED} (id integer, shape text)")
            )
        connection.execute(text(f"DELETE FROM {STAGED}"))  # noqa: S608 - a constant name

    def add(self, row_id: int, found: str) -> None:
        self.batch.append((row_id, self.prefix + found))
        if self.postgres and len(self.batch) >= BATCH:
            self.flush()

    def flush(self, *, final: bool = False) -> None:
        if not self.batch or not (self.postgres or final):
            return
        rows, self.batch = self.batch, []
        if self.postgres:
            raw = self.connection.connection.driver_connection
            assert raw is not None
            with (
                raw.cursor() as cursor,
                cursor.copy(f"COPY {STAGED} (id, shape) FROM STDIN") as copy,
            ):
                for row in rows:
                    copy.write_row(row)
        else:
            self.connection.execute(
                text(f"INSERT INTO {STAGED} (id, shape) VALUES (:id, :shape)"),  # noqa: S608
                [{"id": i, "shape": s} for i, s in rows],
            )
