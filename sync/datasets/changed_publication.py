"""A later publication on PostgreSQL, by set-based statements: the run's new and changed
entities whose values are all plain (:mod:`sync.datasets.first_publication`'s rule) and whose
history needs no undoing are cast, compared, recorded in the history and the change feed, and
written by the database. The rest go through Python (:mod:`sync.datasets.materialise`), as does
every publication on SQLite, of a dataset with a ``watch`` table, and a baseline.

The statements do for these entities what :func:`sync.datasets.history.record`,
:func:`sync.datasets.changes.compare` and :func:`sync.datasets.change_feed.change_rows` do, which
stay the rule (a test holds the two ways to the same tables):

- an entity new to the table opens a stretch from the window's start (first seen at its
  earliest closed stretch, if it had one);
- an entity whose open stretch a run being undone opened, and that has no closed stretch,
  opens a stretch from the window's start;
- any other changed entity keeps its open stretch when its typed values are the same, has it
  corrected in place when it began at the window's start or later, and otherwise has it closed
  at the window's start and a new one opened.

An entity with a stretch closed by a run being undone goes through Python. Typed values are
compared as JSON carries them (the history's rule) and as values (the change feed's); a numeric
whose two readings could disagree (values that differ beyond a float's precision, or past 1e300)
sends its entity to Python too.
"""

# ruff: noqa: S608 - the statements name quoted identifiers and constants only; values are bound

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, column, table, text
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import TableClause

from config.columns import Column
from config.datasets import Dataset
from sync.acceptance import row_states
from sync.datasets.change_feed import Feed
from sync.datasets.changes import ADDED, CHANGED, EntityChange, compare
from sync.datasets.first_publication import PlainCasts, plain_casts
from sync.datasets.rows import target_name
from sync.datasets.tables import DatasetTables
from sync.db import local_setting, planner_method_off
from sync.models import Observation, Run

SEEN = "pub_seen"  # the ids of the observations X lacks or holds otherwise (then: left to Python)
ROWS = "pub_rows"  # of them, those written here: new and old values, dates, mode
SEEN_IDS: TableClause = table(SEEN, column("id"))
# the SQL type of each column type's values (a value that is not plain there is NULL)
_SQL_TYPES = {
    "text": "text",
    "integer": "bigint",
    "numeric": "numeric",
    "boolean": "boolean",
    "timestamp": "timestamptz",
    "json": "jsonb",
}
_PAIRS = 50  # name-value pairs per jsonb_build_object (a function takes at most 100 arguments)
# the memory of each sort and hash of these statements: a change set's rows sorted into the
# feed's order, and the run hashed against the table, stay off disk up to a few 100k entities
WORK_MEM = "64MB"
# an observation whose entity the dataset's table (``x``) lacks or holds with another payload
_LACKING = "(x.entity_key IS NULL OR x.payload_hash <> o.payload_hash)"


@dataclass(frozen=True)
class Written:
    """How many entities the statements added and changed."""

    added: int
    changed: int


def publish_changes(
    session: Session,
    tables: DatasetTables,
    dataset: Dataset,
    feed: Feed,
    *,
    run: Run,
    start: datetime,
    undo: Collection[str],
    fresh: bool,
    pending_ids: str | None = None,
) -> bool:
    """Write the run's plain new and changed entities by set-based statements, into ``feed``
    too, where they apply: on PostgreSQL, into a table with a history and columns, for a
    dataset with no ``watch`` tolerances, and not as a baseline (counted, never listed). True
    when they did: the rest are then to be read from among those found (``pub_seen``).
    ``pending_ids``: a temporary table of the ids of the rows written since the run's last
    verdict, when the table holds every other valid row of the run as the run's last
    publication wrote it: those rows alone are then looked at (see :func:`_source`)."""
    if fresh or dataset.watch or feed.baseline or not tables.columns:
        return False
    if session.get_bind().dialect.name != "postgresql":
        return False
    # no JIT compilation: it costs more than it saves on statements over one change set
    with planner_method_off(session, "jit"), local_setting(session, "work_mem", WORK_MEM):
        if pending_ids is None:
            find_seen(session, tables, run.run_id)
        written = publish_plain(
            session,
            tables,
            pending_ids=pending_ids,
            run_id=run.run_id,
            window=run.collection_window,
            start=start,
            undo=undo,
            revision=feed.revision,
            previous_run_id=feed.previous_run_id,
            now=feed.now,
        )
    feed.add_written(
        written.added,
        written.changed,
        lambda: entries(
            session,
            tables,
            dataset=dataset.name,
            run_id=run.run_id,
            previous_run_id=feed.previous_run_id,
        ),
    )
    return True


def find_seen(session: Session, tables: DatasetTables, run_id: str) -> None:
    """Keep in ``pub_seen`` (a temporary table, for this transaction) the ids of the run's
    valid observations whose entity the dataset's table lacks or holds with another payload
    hash, by a hash join of the whole run with the whole table (as
    :func:`sync.datasets.materialise.whole_set_joins` says why)."""
    session.execute(text(f"DROP TABLE IF EXISTS pg_temp.{SEEN}"))
    x = target_name(session, tables.current)
    with planner_method_off(session, "enable_nestloop"):
        session.execute(
            text(
                f"CREATE TEMP TABLE {SEEN} ON COMMIT DROP AS SELECT o.id "
                f"FROM {Observation.__tablename__} o "
                f"LEFT JOIN {x} x ON x.entity_key = o.entity_key WHERE {row_states.valid_sql()} "
                f"AND {_LACKING}"
            ),
            {"run_id": run_id},
        )
    session.execute(text(f"ANALYZE {SEEN}"))


def _source(session: Session, tables: DatasetTables, pending_ids: str | None) -> tuple[str, str]:
    """The ``FROM`` and the condition of the observations to look at (``o``), with the rows the
    table holds of them (``x``): those of ``pub_seen``, or, with ``pending_ids``, the valid ones
    among the rows whose ids it holds that the table lacks or holds otherwise, each looked up
    once, by its key.

    The caller names ``pending_ids`` (the rows written since the run's last verdict) when the
    dataset's current publication is this run's and the verdict turned no row but those: each
    other valid row was valid when that publication wrote the run's valid rows into the table,
    in its verdict's transaction, and no sync has rewritten it since (a rewritten row is
    pending again)."""
    x = target_name(session, tables.current)
    observations = Observation.__tablename__
    if pending_ids is None:
        return (
            f"FROM {SEEN} s JOIN {observations} o ON o.id = s.id "
            f"LEFT JOIN {x} x ON x.entity_key = o.entity_key",
            "true",
        )
    # each id looked up by its key, whatever the statistics say: taken before the run was
    # written, they can make the run look like two rows, and a join planned on that would scan
    # the run once per id (OFFSET 0 keeps the planner from flattening the LATERAL)
    return (
        f"FROM {pending_ids} pd CROSS JOIN LATERAL (SELECT o.* FROM {observations} o "
        f"WHERE o.id = pd.id AND {row_states.valid_sql()} OFFSET 0) AS o "
        f"LEFT JOIN {x} x ON x.entity_key = o.entity_key",
        _LACKING,
    )


def _json(column: Column, v: str) -> str:
    """SQL giving ``v`` as :func:`sync.casts.to_json` carries it (NULL stays NULL)."""
    if column.type == "numeric":
        whole = f"to_jsonb(trunc({v}))"
        return f"CASE WHEN {v} = trunc({v}) THEN {whole} ELSE to_jsonb({v}::float8) END"
    if column.type == "timestamp":
        utc = f"({v} AT TIME ZONE 'UTC')"
        micro = f"to_char({utc}, 'US')"
        return (
            f"to_jsonb(to_char({utc}, 'YYYY-MM-DD\"T\"HH24:MI:SS') || "
            f"CASE WHEN {micro} = '000000' THEN '' ELSE '.' || {micro} END || '+00:00')"
        )
    if column.type == "json":
        return v
    return f"to_jsonb({v})"


def _ambiguous(column: Column, b: str, n: str) -> str:
    """SQL: the old and new numeric could compare otherwise as JSON than as values."""
    if column.type != "numeric":
        return "false"
    return (
        f"CASE WHEN {b} IS NULL OR {n} IS NULL THEN false WHEN abs({b}) >= 1e300 THEN true "
        f"WHEN {b} = {n} THEN false ELSE {b}::float8 = {n}::float8 END"
    )


def publish_plain(
    session: Session,
    tables: DatasetTables,
    *,
    run_id: str,
    window: str,
    start: datetime,
    undo: Collection[str],
    revision: int,
    previous_run_id: str | None,
    now: datetime,
    pending_ids: str | None = None,
) -> Written:
    """Write the plain entities of ``pub_seen``, or of the rows ``pending_ids`` holds (see
    :func:`_source`), as the module says: the dataset's table, its closed stretches and its
    change rows. What they were is left in ``pub_rows`` for :func:`entries`, and the rest in
    ``pub_seen``."""
    quote = session.get_bind().dialect.identifier_preparer.quote
    casts = plain_casts(tables)
    columns = tables.columns
    names = [quote(c.name) for c in columns]
    x, closed = target_name(session, tables.current), target_name(session, tables.closed)
    params: dict[str, Any] = {
        **casts.params,
        "undo": list(undo),
        "start": start,
        "run_id": run_id,
        "window": window,
        "revision": revision,
        "previous": previous_run_id,
        "now": now,
    }
    session.execute(text(f"DROP TABLE IF EXISTS pg_temp.{ROWS}"))
    # no cache of each payload's fields: every payload is read once, and a cache keyed on it
    # hashes the whole payload once per field
    with _by_key(session), planner_method_off(session, "enable_memoize"):
        _make_rows(session, tables, casts, names, params, _source(session, tables, pending_ids))
    _leave_the_rest(session, found=pending_ids is not None)
    listed = ", ".join(names)
    olds = ", ".join(f"p.b{i}" for i in range(len(columns)))
    values = _written_values(names)
    # the open stretches that close at the window's start
    session.execute(
        text(
            f"INSERT INTO {closed} (entity_key, {listed}, partition, run_id, valid_from, "
            "valid_to, closed_by_run_id, payload_hash) "
            f"SELECT p.entity_key, {olds}, p.x_partition, p.x_by, p.x_last, "
            "CAST(:start AS timestamptz), CAST(:run_id AS text), p.x_hash "
            f"FROM {ROWS} p WHERE p.mode = 'close' ORDER BY p.entity_key"
        ),
        params,
    )
    with _by_key(session):  # each row of the table by its key, never a pass over the table
        session.execute(
            text(
                f"UPDATE {x} t SET "
                + ", ".join(f"{name} = {value}" for name, value in values)
                + f" FROM {ROWS} p WHERE t.entity_key = p.entity_key AND p.known"
            ),
            params,
        )
    for statement in (
        f"INSERT INTO {x} (entity_key, {', '.join(name for name, _ in values)}) "
        f"SELECT p.entity_key, {', '.join(value for _, value in values)} "
        f"FROM {ROWS} p WHERE NOT p.known ORDER BY p.entity_key",
        _change_rows(session, tables),
    ):
        session.execute(text(statement), params)
    added, changed = session.execute(
        text(
            f"SELECT count(*) FILTER (WHERE NOT known), count(*) FILTER (WHERE differs) FROM {ROWS}"
        )
    ).one()
    return Written(int(added), int(changed))


def _leave_the_rest(session: Session, *, found: bool) -> None:
    """Leave to Python (in ``pub_seen``) the observations of ``pub_rows`` these statements do
    not write, and keep in ``pub_rows`` those they do. ``found``: ``pub_rows`` holds every
    observation to look at (else ``pub_seen`` does)."""
    if found:
        session.execute(text(f"DROP TABLE IF EXISTS pg_temp.{SEEN}"))
        left = cast(
            CursorResult[Any],
            session.execute(
                text(
                    f"CREATE TEMP TABLE {SEEN} ON COMMIT DROP AS "
                    f"SELECT obs_id AS id FROM {ROWS} WHERE NOT written"
                )
            ),
        ).rowcount
        session.execute(text(f"ANALYZE {SEEN}"))
        if not left:  # most often: every row is written, and pub_rows need not be read again
            return
    else:
        session.execute(
            text(f"DELETE FROM {SEEN} s USING {ROWS} p WHERE s.id = p.obs_id AND p.written")
        )
    session.execute(text(f"DELETE FROM {ROWS} WHERE NOT written"))


def _written_values(names: Sequence[str]) -> list[tuple[str, str]]:
    """Each column of ``X`` a written row sets, with its value from ``pub_rows`` (an entity
    ``X`` holds is updated in place: its page keeps half free, so the new version stays there
    and the key is not touched; the others are inserted)."""
    return [
        *((name, f"p.n{i}") for i, name in enumerate(names)),
        ("partition", "p.partition"),
        ("run_id", "CAST(:run_id AS text)"),
        ("collection_window", "CAST(:window AS text)"),
        (
            "first_seen_at",
            "CASE p.mode WHEN 'new' THEN LEAST(COALESCE(p.closed_from, "
            "CAST(:start AS timestamptz)), CAST(:start AS timestamptz)) "
            "WHEN 'reopen' THEN CAST(:start AS timestamptz) "
            "ELSE LEAST(COALESCE(p.closed_from, p.x_last), p.x_last) END",
        ),
        (
            "last_changed_at",
            "CASE WHEN p.mode IN ('keep', 'correct') THEN p.x_last "
            "ELSE CAST(:start AS timestamptz) END",
        ),
        ("cast_failures", "NULL"),
        ("payload_hash", "p.payload_hash"),
        (
            "changed_by_run_id",
            "CASE WHEN p.mode = 'keep' THEN p.x_by ELSE CAST(:run_id AS text) END",
        ),
        ("stale", "false"),
        ("set_aside", "NULL"),
    ]


@contextmanager
def _by_key(session: Session) -> Iterator[None]:
    """The rows found are few next to the tables: each is looked up by its key (a nested loop
    over indexes), never by hashing a whole table, whatever the statistics (taken before the
    run's rows were written) say."""
    with (
        planner_method_off(session, "enable_hashjoin"),
        planner_method_off(session, "enable_mergejoin"),
    ):
        yield


def _make_rows(
    session: Session,
    tables: DatasetTables,
    casts: PlainCasts,
    names: Sequence[str],
    params: dict[str, Any],
    source: tuple[str, str],
) -> None:
    """Fill ``pub_rows``: each observation of ``source`` (see :func:`_source`) with its new
    values (``n0``…, when they are all plain), the row the table holds (``b0``…, ``x_…``), its
    history's facts, its ``mode``, and whether these statements write it (``written``)."""
    columns = tables.columns
    closed = target_name(session, tables.closed)
    same = " AND ".join(f"q.b{i} IS NOT DISTINCT FROM q.n{i}" for i in range(len(columns)))
    differs = " OR ".join(f"q.b{i} IS DISTINCT FROM q.n{i}" for i in range(len(columns)))
    ambiguous = " OR ".join(_ambiguous(c, f"q.b{i}", f"q.n{i}") for i, c in enumerate(columns))
    undone = "q.x_by = ANY(CAST(:undo AS text[]))"
    found, condition = source
    session.execute(
        text(
            f"CREATE TEMP TABLE {ROWS} ON COMMIT DROP AS SELECT q.*, "
            f"CASE WHEN NOT q.known THEN 'new' WHEN {undone} THEN 'reopen' "
            f"WHEN {same or 'true'} THEN 'keep' "
            "WHEN q.x_last >= CAST(:start AS timestamptz) THEN 'correct' ELSE 'close' END AS mode, "
            f"q.known AND ({differs or 'false'}) AS differs, "
            "q.plain AND NOT q.undone "
            f"AND NOT (q.known AND {undone} AND q.closed_from IS NOT NULL) "
            f"AND NOT ({ambiguous or 'false'}) AS written "
            "FROM (SELECT o.id AS obs_id, o.entity_key, o.partition, o.payload_hash, e.plain, "
            + "".join(
                f"CASE WHEN e.plain THEN CAST({v} AS {_SQL_TYPES[c.type]}) END AS n{i}, "
                for i, (c, v) in enumerate(zip(columns, casts.values, strict=True))
            )
            + "x.entity_key IS NOT NULL AS known, "
            + "".join(f"x.{name} AS b{i}, " for i, name in enumerate(names))
            + "x.partition AS x_partition, x.payload_hash AS x_hash, "
            "x.last_changed_at AS x_last, x.changed_by_run_id AS x_by, "
            f"(SELECT min(c.valid_from) FROM {closed} c "
            "WHERE c.entity_key = o.entity_key) AS closed_from, "
            f"EXISTS (SELECT 1 FROM {closed} c WHERE c.entity_key = o.entity_key "
            "AND c.closed_by_run_id = ANY(CAST(:undo AS text[]))) AS undone "
            f"{found} "
            # each field's type and text taken once, and whether every value is plain told once
            # (OFFSET 0 keeps the planner from inlining either into each expression reading it)
            "CROSS JOIN LATERAL (SELECT e.*, "
            + " AND ".join(casts.conditions or ("true",))
            + f" AS plain FROM (SELECT {casts.extracted} OFFSET 0) AS e OFFSET 0) AS e "
            # each row's values, casts and history facts made once (OFFSET 0: else the planner
            # inlines them into every comparison below that reads them)
            f"WHERE {condition} OFFSET 0) q"
        ),
        params,
    )


def _change_rows(session: Session, tables: DatasetTables) -> str:
    """The ``X_changes`` rows of ``pub_rows``: one per added entity (its values), one per
    changed column of a changed entity (before and after). They are stored in no particular
    order (readers order them: ``scrapesync diff`` by key, ``/api/changes`` by row id): sorting
    the wide rows first was about two fifths of the statement."""
    columns = tables.columns
    objects = [
        "jsonb_build_object("
        + ", ".join(
            f"'{c.name.replace(chr(39), chr(39) * 2)}', {_json(c, f'p.n{i}')}"
            for i, c in list(enumerate(columns))[start : start + _PAIRS]
        )
        + ")"
        for start in range(0, len(columns), _PAIRS)
    ] or ["'{}'::jsonb"]
    common = "CAST(:run_id AS text), CAST(:revision AS integer), CAST(:previous AS text)"
    added = (
        f"SELECT {common}, p.entity_key, '{ADDED}' AS kind, NULL AS column_name, "
        f"NULL::jsonb AS before, {' || '.join(objects)} AS after "
        f"FROM {ROWS} p WHERE NOT p.known"
    )
    # one statement per column, each naming only its changed values, so that JSON is made of
    # the values that changed alone
    rows = [added] + [
        f"SELECT {common}, p.entity_key, '{CHANGED}', "
        f"'{c.name.replace(chr(39), chr(39) * 2)}', {_json(c, f'p.b{i}')}, "
        f"{_json(c, f'p.n{i}')} "
        f"FROM {ROWS} p WHERE p.differs AND p.b{i} IS DISTINCT FROM p.n{i}"
        for i, c in enumerate(columns)
    ]
    return (
        f"INSERT INTO {target_name(session, tables.changes)} (run_id, revision, "
        "previous_run_id, entity_key, kind, column_name, before, after, created_at) "
        "SELECT a.*, CAST(:now AS timestamptz) FROM ("
        + " UNION ALL ".join(f"SELECT * FROM ({r}) AS u{k}" for k, r in enumerate(rows))
        + ") AS a"
    )


def entries(
    session: Session,
    tables: DatasetTables,
    *,
    dataset: str,
    run_id: str,
    previous_run_id: str | None,
) -> Sequence[EntityChange]:
    """The change entries of what :func:`publish_plain` wrote, as :func:`compare` makes them
    (read only when they travel inline, so they are few)."""
    n = len(tables.columns)
    names = [c.name for c in tables.columns]
    olds = ", ".join(f"b{i}" for i in range(n))
    news = ", ".join(f"n{i}" for i in range(n))
    rows = session.execute(
        text(
            f"SELECT entity_key, known, {olds}{', ' if n else ''}{news} FROM {ROWS} "
            "WHERE NOT known OR differs"
        )
    ).all()
    before: dict[str, dict[str, Any]] = {}
    after: dict[str, dict[str, Any]] = {}
    for row in rows:
        key, known = row[0], row[1]
        after[key] = dict(zip(names, row[2 + n : 2 + 2 * n], strict=True))
        if known:
            before[key] = dict(zip(names, row[2 : 2 + n], strict=True))
    return compare(dataset, run_id, previous_run_id, before, after, {}).entries
