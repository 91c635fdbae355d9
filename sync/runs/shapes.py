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

Most evaluations need no pass over the run at all. The run keeps its rows per group (partition,
stored shape, attempt that last wrote them) at a data version (``runs.row_groups``): a first sync
copied straight into the run it found empty counts the rows it copies; a later sync merged while
its export downloads counts what its writes replaced and what they wrote, and moves the groups
kept at the version it began at to the one its commit makes; a pass over the run keeps what it
counted (and :func:`apply`, what the shapes it writes change). Either import keeps them only when
its commit counts the run's version up by one from the version it began at (no other import
committed meanwhile) and, if it replaced rows, the groups are those it found as it began (no
evaluation gave rows their shapes meanwhile): what it read was the run as it stood. An
evaluation trusts the groups while the run holds their version (:func:`kept_groups`): each
group's rows are judged when their attempt made the judged version or an earlier one (as
:mod:`sync.acceptance.row_states` says), and valid when their partition passed too. The ids of
the pending rows come from the imports since the verdict, which keep those of the rows they
wrote (``run_imports.written``); an import that could not (a merge after the download, too many
rows) has the evaluation pass over the run instead. The rows without a shape are still read
back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import (
    Connection,
    Text,
    and_,
    case,
    cast,
    func,
    not_,
    or_,
    select,
    text,
)
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync.acceptance import row_states
from sync.acceptance.facts import NO_PARTITION, PartitionTally, RecordRules
from sync.acceptance.records import add_shape, tally_record
from sync.ingest import run_rows
from sync.models import Observation, PartitionVerdict, Run, RunImport
from sync.states import PartitionState, ValidationState

BATCH = 5000  # rows read, and shapes staged, at a time
STAGED = "obs_shapes"  # the shapes found by this evaluation, until its verdict writes them
PENDING = "obs_pending"  # the ids of the rows written since the last verdict, when kept
# (partition, stored shape, attempt that last wrote the rows, rows)
Group = tuple[str | None, str | None, str, int]


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
    kept: Sequence[Group] | None = None,
    version: int | None = None,
) -> tuple[dict[str, PartitionTally], RowStates]:
    """The run's records tallied per partition under the dataset's record rules, and its rows
    counted by validation state. With ``keep``, the shapes of the records read are staged for
    :func:`apply`, and the run's groups are kept with it at ``version`` (the data version of
    this snapshot) as a pass over the run found them and as :func:`apply` leaves them;
    without, nothing is written (a read-only re-judgement). With ``keep_pending``
    (PostgreSQL), the ids of the rows written since the last verdict are kept too, so that the
    publication can look at them alone. ``kept``: the run's groups at this snapshot's version,
    as :func:`kept_groups` gives them; they are counted instead of the run, and the pending
    rows' ids are taken from the imports that wrote them, unless one of those imports did not
    keep them."""
    rules = RecordRules.of(dataset)
    prefix = rules.fingerprint + "|"
    keep_pending = keep_pending and session.connection().dialect.name == "postgresql"
    groups: Sequence[Any]
    if kept is not None and (not keep_pending or _pending_from_imports(session, run_id)):
        groups = _states_of(session, run_id, kept)
    else:
        groups = _groups(session, run_id, keep_pending=keep_pending)
        if keep and version is not None:
            run_rows.store_row_groups(session, run_id, version, [g[:4] for g in groups])
    tallies: dict[str, PartitionTally] = {}
    states = RowStates(ids_kept=keep_pending)
    unjudged = 0
    for partition, shape, _, records, pending, valid, quarantined in groups:
        states.rows[partition if partition is not None else NO_PARTITION] += int(records)
        for state, n in (
            (ValidationState.PENDING, pending),
            (ValidationState.VALID, valid),
            (ValidationState.QUARANTINED, quarantined),
        ):
            states.count(partition, state, int(n or 0))
        if shape is None or not shape.startswith(prefix):
            unjudged += int(records)
        else:
            add_shape(_tally_of(tallies, partition), shape[len(prefix) :], int(records))
    if unjudged:
        _read_unjudged(session, run_id, rules, tallies, groups, keep=keep, version=version)
    return tallies, states


def _read_unjudged(
    session: Session,
    run_id: str,
    rules: RecordRules,
    tallies: dict[str, PartitionTally],
    groups: Sequence[Any],
    *,
    keep: bool,
    version: int | None,
) -> None:
    """Read and tally the run's rows without a shape under the rules in force; with ``keep``,
    stage the shapes found for :func:`apply`, with the run's groups as it leaves them."""
    prefix = rules.fingerprint + "|"
    o = Observation.__table__.c
    stage = _Stage(session.connection(), prefix) if keep else None
    after: Counter[tuple[str | None, str | None, str]] = Counter(
        {(p, s, a): int(n) for p, s, a, n, *_ in groups}
    )
    # the payload as text, parsed by orjson: half the time of the driver's JSON decoding
    rows = session.execute(
        select(o.id, o.partition, cast(o.payload, Text), o.shape, o.source_attempt_id)
        .where(
            o.run_id == run_id, or_(o.shape.is_(None), ~o.shape.startswith(prefix, autoescape=True))
        )
        .execution_options(yield_per=BATCH)
    )
    for row_id, partition, payload, shape, attempt in rows:
        found = tally_record(_tally_of(tallies, partition), orjson.loads(payload), rules)
        if found is not None and stage is not None:
            stage.add(row_id, found)
            after[partition, shape, attempt] -= 1
            after[partition, prefix + found, attempt] += 1
    if stage is not None and stage.staged:
        stage.flush(final=True)
        kept = [[p, s, a, n] for (p, s, a), n in after.items() if n]
        session.info[STAGED] = (run_id, version, kept)


def kept_groups(run: Run) -> list[Group] | None:
    """The run's rows per group as its imports and evaluations kept them (``runs.row_groups``,
    see :func:`sync.ingest.run_rows.keep_row_groups`), when they describe the run as this
    evaluation reads it: kept at the data version the run holds in this snapshot (every import
    counts it up as it commits)."""
    kept = run.row_groups
    if not kept or kept.get("version") != run.data_version:
        return None
    return [(p, s, a, int(n)) for p, s, a, n in kept["groups"]]


def _states_of(session: Session, run_id: str, kept: Sequence[Group]) -> list[Any]:
    """The kept groups with their rows counted by state, as :mod:`sync.acceptance.row_states`
    tells it: judged when the attempt that wrote them made the judged version or an earlier
    one, valid when their partition passed too."""
    i, v = RunImport.__table__.c, PartitionVerdict.__table__.c
    judged_version = select(Run.judged_version).where(Run.run_id == run_id).scalar_subquery()
    judged = set(
        session.execute(
            select(i.attempt_id).where(i.run_id == run_id, i.version <= judged_version)
        ).scalars()
    )
    passed = set(
        session.execute(
            select(v.partition).where(v.run_id == run_id, v.state == PartitionState.PASSED)
        ).scalars()
    )
    groups = []
    for partition, shape, attempt, n in kept:
        ok = (partition if partition is not None else NO_PARTITION) in passed
        is_judged = attempt in judged
        groups.append(
            (
                partition,
                shape,
                attempt,
                n,
                0 if is_judged else n,
                n if is_judged and ok else 0,
                n if is_judged and not ok else 0,
            )
        )
    return groups


def _pending_from_imports(session: Session, run_id: str) -> bool:
    """Keep in ``obs_pending`` the ids of the rows written since the run's last verdict, as
    the imports after it recorded them; False (nothing kept) when one of them did not."""
    connection = session.connection()
    params = {"run_id": run_id}
    # the run's imports after its judged version (all of them, before its first verdict)
    after = (
        "i.run_id = :run_id AND i.version > "
        "COALESCE((SELECT r.judged_version FROM runs r WHERE r.run_id = :run_id), -1)"
    )
    unkept = (
        f"SELECT EXISTS (SELECT 1 FROM run_imports i WHERE {after} "  # noqa: S608 - constants
        "AND (i.written IS NULL OR jsonb_typeof(i.written) <> 'array'))"
    )
    if connection.execute(text(unkept), params).scalar_one():
        return False
    _pending_table(connection)
    connection.execute(
        text(
            f"INSERT INTO {PENDING} (id) SELECT DISTINCT CAST(w.id AS bigint) "  # noqa: S608 - constants
            "FROM run_imports i CROSS JOIN LATERAL jsonb_array_elements_text(i.written) AS w(id) "
            f"WHERE {after}"
        ),
        params,
    )
    connection.execute(text(f"ANALYZE {PENDING}"))
    return True


def _pending_table(connection: Connection) -> None:
    connection.execute(
        text(f"CREATE TEMP TABLE IF NOT EXISTS {PENDING} (id bigint) ON COMMIT DROP")
    )
    connection.execute(text(f"DELETE FROM {PENDING}"))  # noqa: S608 - a constant name


def _states(session: Session, run_id: str) -> list[Any]:
    """How many rows pending, valid and quarantined (:mod:`sync.acceptance.row_states`)."""
    judged = row_states.judged(session, run_id)
    passed = row_states.passed(session, run_id)
    return [
        func.sum(case((judged, 0), else_=1)),
        func.sum(case((and_(judged, passed), 1), else_=0)),
        func.sum(case((and_(judged, not_(passed)), 1), else_=0)),
    ]


def _groups(session: Session, run_id: str, *, keep_pending: bool) -> Sequence[Any]:
    """Per partition, stored shape and attempt that wrote the rows: how many rows, and how
    many of them pending, valid and quarantined; one pass over the run, which also keeps the
    pending rows' ids in ``obs_pending`` when asked."""
    o = Observation.__table__.c
    if not keep_pending:
        return session.execute(
            select(
                o.partition, o.shape, o.source_attempt_id, func.count(), *_states(session, run_id)
            )
            .where(o.run_id == run_id)
            .group_by(o.partition, o.shape, o.source_attempt_id)
        ).all()
    connection = session.connection()
    _pending_table(connection)
    groups = connection.execute(
        text(
            # the ids gathered per group, server-side (a scan kept for two readers would be
            # written aside whole)
            "WITH g AS (SELECT partition, shape, source_attempt_id, count(*) AS n, "  # noqa: S608 - constants
            "count(*) FILTER (WHERE NOT judged) AS pending, "
            "count(*) FILTER (WHERE judged AND passed) AS valid, "
            "count(*) FILTER (WHERE judged AND NOT passed) AS quarantined, "
            "array_agg(id) FILTER (WHERE NOT judged) AS ids "
            "FROM (SELECT o.id, o.partition, o.shape, o.source_attempt_id, "
            f"{row_states.judged_sql()} AS judged, {row_states.passed_sql()} AS passed "
            # (OFFSET 0: each row's two tests once, not once per count that reads them)
            "FROM observations o WHERE o.run_id = :run_id OFFSET 0) AS r GROUP BY 1, 2, 3), "
            f"kept AS (INSERT INTO {PENDING} (id) SELECT unnest(ids) FROM g) "
            "SELECT partition, shape, source_attempt_id, n, pending, valid, quarantined FROM g"
        ),
        {"run_id": run_id},
    ).all()
    connection.execute(text(f"ANALYZE {PENDING}"))
    return groups


def apply(session: Session) -> None:
    """Write the shapes this evaluation staged onto their rows. Rows a sync rewrote since the
    evaluation read them are refused by REPEATABLE READ (the evaluation tries again)."""
    staged = session.info.pop(STAGED, None)
    if staged is None:
        return
    run_id, version, groups = staged
    connection = session.connection()
    # the groups as the shapes leave them
    run_rows.store_row_groups(session, run_id, version, groups)
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
        self.staged = 0  # shapes staged in all
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
        self.staged += 1
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
