"""A run's records tallied per partition, reading again only what no evaluation judged before.

Every observation keeps the shape of its record as the last evaluation of its run judged it, or
as the sync that wrote it found it when it copied the record straight in or merged it while the
export downloaded (:mod:`sync.ingest.records`): the fields it fills and those it leaves empty, in
name order, under the fingerprint of the record rules it was judged by (``observations.shape``).
A sync that merges the row after the download forgets it. The database counts the run's rows per
partition and shape in one statement; only the rows without a shape under the rules in force are
read and tallied in Python. Records with a defect keep no shape: they are read every time, so
that their samples are those of the run as it is.

The shapes found are written with the verdict (:func:`apply`). A first evaluation reads the
records with a defect (every record, where the sync merged them after the download); after a
"Continue" that rewrote a tenth of them, the next one reads those of that tenth with a defect.

The same statement counts the run's rows per partition by state (pending, valid, quarantined:
:mod:`sync.acceptance.row_states`). Of a run judged before, it also keeps the ids of the rows
written since (``pending``) in a temporary table: when the counts show that no other row changes
state under the new verdict, the publication looks at those rows alone, instead of a pass over
the whole run; and the counts tell it how many rows are valid, without counting them again.

A run whose only rows one first sync copied straight in needs no pass at all before its first
verdict: that import counted the rows it copied per partition and shape, and kept the counts
with the run (``runs.import_tally``) with the data version its commit made, when that commit
counted the version up by one from the version at which it found the run empty (no other import
committed in between). The evaluation counts those instead (:func:`import_groups`) while the run
holds that version and no verdict has judged it; the rows without a shape are still read
back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import Connection, Text, and_, case, cast, func, not_, or_, select, text
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync.acceptance import row_states
from sync.acceptance.facts import NO_PARTITION, PartitionTally, RecordRules
from sync.acceptance.records import add_shape, tally_record
from sync.models import Observation, Run
from sync.states import ValidationState

BATCH = 5000  # rows read, and shapes staged, at a time
STAGED = "obs_shapes"  # the shapes found by this evaluation, until its verdict writes them
PENDING = "obs_pending"  # the ids of the rows written since the last verdict, when kept


@dataclass
class RowStates:
    """The run's rows per partition (``(none)`` for none) by validation state, counted by the
    tally's statement in the evaluation's snapshot; ``ids_kept``: the pending rows' ids are in
    the temporary table ``obs_pending`` too (PostgreSQL, when asked)."""

    rows: Counter[str] = field(default_factory=Counter)
    by_state: dict[str, Counter[str]] = field(default_factory=dict)
    ids_kept: bool = False

    def count(self, partition: str | None, state: str, n: int) -> None:
        name = partition if partition is not None else NO_PARTITION
        self.by_state.setdefault(state, Counter())[name] += n

    def of(self, state: str, partition: str) -> int:
        return self.by_state.get(state, Counter())[partition]

    def only_pending_turn(self, verdicts: Mapping[str, str]) -> bool:
        """Whether ``verdicts`` (partition -> the state its rows take) turn none but the
        pending rows: every other row of a judged partition holds that state already."""
        return self.ids_kept and all(
            self.rows[p] - self.of(ValidationState.PENDING, p) == self.of(state, p)
            for p, state in verdicts.items()
        )

    @property
    def pending(self) -> int:
        """How many of the run's rows were written since the last verdict."""
        return sum(self.by_state.get(ValidationState.PENDING, Counter()).values())

    def valid_after(self, verdicts: Mapping[str, str]) -> int:
        """How many of the run's rows are valid once ``verdicts`` judge them: every
        row of a partition judged valid, and the valid rows of a partition not judged."""
        return sum(
            (n if verdicts[p] == ValidationState.VALID else 0)
            if p in verdicts
            else self.of(ValidationState.VALID, p)
            for p, n in self.rows.items()
        )


def tally(
    session: Session,
    run_id: str,
    dataset: Dataset,
    *,
    keep: bool = True,
    keep_pending: bool = False,
    imported: Sequence[tuple[str | None, str | None, int]] | None = None,
) -> tuple[dict[str, PartitionTally], RowStates]:
    """The run's records tallied per partition under the dataset's record rules, and its rows
    counted by validation state. With ``keep``, the shapes of the records read are staged for
    :func:`apply`; without, nothing is written (a read-only re-judgement). With
    ``keep_pending`` (PostgreSQL), the same pass over the run keeps the ids of the rows written
    since the last verdict, so that the verdict can mark them alone. ``imported``: the run's
    rows per partition and stored shape, all pending, as :func:`import_groups` gives them;
    they are counted instead of the run (not with ``keep_pending``, which needs the ids)."""
    rules = RecordRules.of(dataset)
    prefix = rules.fingerprint + "|"
    tallies: dict[str, PartitionTally] = {}
    states = RowStates()
    keep_pending = keep_pending and session.connection().dialect.name == "postgresql"
    if imported is not None and not keep_pending:
        # (partition, shape under the rules in force, rows, pending, valid, quarantined)
        groups: Sequence[Any] = [
            (p, s if s is not None and s.startswith(prefix) else None, n, n, 0, 0)
            for p, s, n in imported
        ]
    else:
        groups = _groups(session, run_id, prefix, keep_pending=keep_pending)
    states.ids_kept = keep_pending
    unjudged = 0
    for partition, found, records, pending, valid, quarantined in groups:
        states.rows[partition if partition is not None else NO_PARTITION] += int(records)
        for state, n in (
            (ValidationState.PENDING, pending),
            (ValidationState.VALID, valid),
            (ValidationState.QUARANTINED, quarantined),
        ):
            states.count(partition, state, int(n or 0))
        if found is None:
            unjudged += int(records)
        else:
            add_shape(_tally_of(tallies, partition), found[len(prefix) :], int(records))
    if not unjudged:
        return tallies, states
    o = Observation.__table__.c
    kept = o.shape.startswith(prefix, autoescape=True)
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
    return tallies, states


def import_groups(run: Run) -> list[tuple[str | None, str | None, int]] | None:
    """The run's rows per partition and stored shape as the import that wrote them counted
    them (``runs.import_tally``, see :func:`sync.ingest.run_rows.keep_import_tally`), when
    they are the run's rows as this evaluation reads the run: that import's commit made the
    data version the run holds in this snapshot (a later import counts it up again, and is
    counted in the run), and no verdict has judged the run since (one that did recorded the
    version it judged)."""
    kept = run.import_tally
    if not kept or run.evaluated_version is not None or kept.get("version") != run.data_version:
        return None
    return [(partition, shape, int(n)) for partition, shape, n in kept["groups"]]


def _states(session: Session, run_id: str) -> list[Any]:
    """How many rows pending, valid and quarantined (:mod:`sync.acceptance.row_states`)."""
    judged = row_states.judged(session, run_id)
    passed = row_states.passed(session, run_id)
    return [
        func.sum(case((judged, 0), else_=1)),
        func.sum(case((and_(judged, passed), 1), else_=0)),
        func.sum(case((and_(judged, not_(passed)), 1), else_=0)),
    ]


def _groups(session: Session, run_id: str, prefix: str, *, keep_pending: bool) -> Sequence[Any]:
    """Per partition and shape under the rules in force (NULL: none): how many rows, and how
    many of them pending, valid and quarantined; one pass over the run, which also keeps the
    pending rows' ids in ``obs_pending`` when asked."""
    o = Observation.__table__.c
    if not keep_pending:
        kept = o.shape.startswith(prefix, autoescape=True)
        return session.execute(
            select(o.partition, case((kept, o.shape)), func.count(), *_states(session, run_id))
            .where(o.run_id == run_id)
            .group_by(o.partition, case((kept, o.shape)))
        ).all()
    connection = session.connection()
    connection.execute(
        text(f"CREATE TEMP TABLE IF NOT EXISTS {PENDING} (id bigint) ON COMMIT DROP")
    )
    connection.execute(text(f"DELETE FROM {PENDING}"))  # noqa: S608 - a constant name
    groups = connection.execute(
        text(
            # the ids gathered per group, server-side (a scan kept for two readers would be
            # written aside whole)
            "WITH g AS (SELECT partition, "  # noqa: S608 - constants
            "CASE WHEN left(shape, :length) = :prefix THEN shape END AS found, count(*) AS n, "
            "count(*) FILTER (WHERE NOT judged) AS pending, "
            "count(*) FILTER (WHERE judged AND passed) AS valid, "
            "count(*) FILTER (WHERE judged AND NOT passed) AS quarantined, "
            "array_agg(id) FILTER (WHERE NOT judged) AS ids "
            "FROM (SELECT o.id, o.partition, o.shape, "
            f"{row_states.judged_sql()} AS judged, {row_states.passed_sql()} AS passed "
            # (OFFSET 0: each row's two tests once, not once per count that reads them)
            "FROM observations o WHERE o.run_id = :run_id OFFSET 0) AS r GROUP BY 1, 2), "
            f"kept AS (INSERT INTO {PENDING} (id) SELECT unnest(ids) FROM g) "
            "SELECT partition, found, n, pending, valid, quarantined FROM g"
        ),
        {
            "run_id": run_id,
            "length": len(prefix),
            "prefix": prefix,
        },
    ).all()
    connection.execute(text(f"ANALYZE {PENDING}"))
    return groups


def apply(session: Session) -> None:
    """Write the shapes this evaluation staged onto their rows. Rows a sync rewrote since the
    evaluation read them are refused by REPEATABLE READ (the evaluation tries again)."""
    if not session.info.pop(STAGED, False):
        return
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        sql = (
            f"UPDATE observations SET shape = s.shape FROM {STAGED} s "  # noqa: S608 - constants only
            "WHERE observations.id = s.id"
        )
    else:
        sql = (
            f"UPDATE observations SET shape = (SELECT s.shape FROM {STAGED} s "  # noqa: S608 - constants only
            f"WHERE s.id = observations.id) WHERE id IN (SELECT id FROM {STAGED})"
        )
    connection.execute(text(sql))
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
