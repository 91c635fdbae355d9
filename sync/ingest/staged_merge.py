"""The staged records merged into observations after the download: the last record of a key
wins, and only what is new or changed is written (or even locked)."""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from typing import IO, Any

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.exc import IntegrityError

from sync.ingest.source import KEY_COLUMNS, STAGED_COLUMNS, WRITTEN_COLUMNS
from sync.models import UTCDateTime

_CHANGES = (
    "CREATE TEMP TABLE obs_changes (ord integer, observation_key text, payload_hash text, "
    "entity_key text, partition text, start_url text, payload text, line_digest bytea) "
    "ON COMMIT DROP"
)
# Every join of the staged records with observations is limited to the sync's run: a key names
# its dataset and window, so it is only ever stored in that run, and the run's rows are found
# through its index instead of by reading every window the table keeps. A key stored outside
# the run all the same would look new, and the INSERT's unique key sends it to the upsert.
_TO_WRITE = (
    "SELECT "  # noqa: S608 - constant SQL
    + ", ".join(f"c.{name}" for name in KEY_COLUMNS.split(", "))
    + ", o.observation_key IS NULL AS new, "
    "o.observation_key IS NULL OR o.payload_hash <> c.payload_hash AS write, o.line_digest"
    " FROM obs_staging c LEFT JOIN observations o ON o.observation_key = c.observation_key "
    "AND o.run_id = %(run_id)s "
    "WHERE o.observation_key IS NULL OR o.payload_hash <> c.payload_hash{also} ORDER BY c.ord"
)
# ... and the staged records whose key a stored row has that a known line may name
_KNOWN_KEY = " OR o.line_digest IS NOT NULL"
# whether any key was staged twice (the counts of what was are taken only then)
DUPLICATES = (
    "SELECT count(*) FROM (SELECT 1 FROM obs_staging GROUP BY observation_key "
    "HAVING count(*) > 1) AS d"
)


def drop_duplicates(conn: Connection) -> tuple[int, int]:
    """Count the records staged under a key staged before, and the keys whose records differ,
    then keep each key's last record alone: (duplicates, conflicting)."""
    dup = conn.execute(
        text(
            "SELECT count(*) AS keys, coalesce(sum(n), 0) AS n, "
            "count(*) FILTER (WHERE first_hash <> last_hash) AS conflicting "
            "FROM (SELECT count(*) AS n, min(payload_hash) AS first_hash, "
            "max(payload_hash) AS last_hash FROM obs_staging "
            "GROUP BY observation_key HAVING count(*) > 1) AS d"
        )
    ).one()
    duplicates, conflicting = int(dup.n) - int(dup.keys), int(dup.conflicting)
    if duplicates:
        conn.execute(
            text(
                "DELETE FROM obs_staging WHERE ord IN (SELECT s.ord FROM obs_staging s "
                "JOIN (SELECT observation_key, max(ord) AS last FROM obs_staging "
                "GROUP BY observation_key HAVING count(*) > 1) AS d "
                "ON d.observation_key = s.observation_key WHERE s.ord < d.last)"
            )
        )
    return duplicates, conflicting


def upsert_sql(table: str, *, postgres: bool) -> str:
    """The upsert of the new and changed rows of ``table`` (staged, one per key)."""
    # One join finds what is new or changed; only those rows are written (or even locked).
    # The conflict clause keeps a payload that another sync made the same from a rewrite.
    payload = "CAST(c.payload AS jsonb)" if postgres else "c.payload"
    return (
        f"INSERT INTO observations ({WRITTEN_COLUMNS}) "  # noqa: S608 - constant SQL
        "SELECT c.observation_key, :dataset, c.entity_key, :run_id, :window, "
        f"c.partition, c.start_url, {payload}, c.payload_hash, c.line_digest, :job_id, "
        f":attempt_id, :now, :now FROM {table} c "
        "LEFT JOIN observations o ON o.observation_key = c.observation_key "
        "AND o.run_id = :in_run "
        "WHERE o.observation_key IS NULL OR o.payload_hash <> c.payload_hash "
        "ON CONFLICT (observation_key) DO UPDATE SET "
        "payload = excluded.payload, payload_hash = excluded.payload_hash, "
        "line_digest = excluded.line_digest, partition = excluded.partition, "
        "start_url = excluded.start_url, "
        "entity_key = excluded.entity_key, source_job_id = excluded.source_job_id, "
        "source_attempt_id = excluded.source_attempt_id, shape = NULL, plain_for = NULL, "
        "last_changed_at = excluded.last_changed_at "
        "WHERE observations.payload_hash <> excluded.payload_hash"
    )


def write_on_sqlite(conn: Connection, upsert: str, params: dict[str, Any]) -> tuple[int, int]:
    """Write new and changed rows on SQLite, where one writer at a time makes what the join
    finds what the upsert writes; (inserted, updated)."""
    written = conn.execute(
        text(
            "SELECT count(*) AS written, "
            "count(*) FILTER (WHERE o.observation_key IS NULL) AS new "
            "FROM obs_staging c LEFT JOIN observations o "
            "ON o.observation_key = c.observation_key "
            "WHERE o.observation_key IS NULL OR o.payload_hash <> c.payload_hash"
        )
    ).one()
    if written.written:
        conn.execute(text(upsert).bindparams(bindparam("now", type_=UTCDateTime())), params)
    inserted = int(written.new)
    return inserted, int(written.written) - inserted


def send_payloads(
    conn: Connection,
    spool: IO[bytes],
    ends: array[int],
    run_id: str,
    *,
    batch_size: int,
    known_line: Callable[[bytes], int] | None,
) -> tuple[int, int] | None:
    """Keys first: the staged records that are new or changed come back from one join, and
    go to obs_changes with their spooled payloads (``ends``: where each payload ends); the
    merge reads those rows alone; how many were new and how many changed. Analysed at once: a
    temporary table has no statistics, and a planner that guesses its size picks joins that
    cost more than the whole merge. Only the key the writes join on is analysed (with the row
    count, which ANALYZE always takes): the payloads' statistics, which no plan uses, took
    most of its time.

    ``known_line`` (the order of the known line that named a stored digest, 0 when none did):
    the same join also brings the stored rows of the other staged keys, and None, with nothing
    sent, when one of them is the row of a known line (see
    :meth:`ObservationStager._stage_known_keys`)."""
    spool.flush()
    fd = spool.fileno()
    raw = conn.connection.driver_connection
    assert raw is not None
    conn.exec_driver_sql(_CHANGES)
    new = changed = 0
    collided = False
    with raw.cursor(name="obs_to_write") as wanted:
        wanted.execute(_TO_WRITE.format(also=_KNOWN_KEY if known_line else ""), {"run_id": run_id})
        while rows := wanted.fetchmany(batch_size):
            if known_line and any(stored and known_line(stored) for *_, stored in rows):
                collided = True
                break
            with (
                raw.cursor() as cursor,
                cursor.copy(f"COPY obs_changes ({STAGED_COLUMNS}) FROM STDIN") as copy,
            ):
                for row in rows:
                    number, key, entity, partition, start_url, payload_hash, line = row[:7]
                    is_new, write = row[7], row[8]
                    if not write:
                        continue
                    if is_new:
                        new += 1
                    else:
                        changed += 1
                    start = ends[number - 2] if number > 1 else 0
                    payload = os.pread(fd, ends[number - 1] - start, start).decode()
                    copy.write_row(
                        (number, key, entity, partition, start_url, payload, payload_hash, line)
                    )
    if collided:
        conn.exec_driver_sql("DROP TABLE obs_changes")
        return None
    conn.exec_driver_sql("ANALYZE obs_changes (observation_key)")
    return new, changed


def stage_known_keys(conn: Connection, run_id: str, known_line: Callable[[bytes], int]) -> int:
    """Stage the known lines whose key a parsed record has too (as the row they name, with
    the order of the last such line: ``known_line``, 0 when none named it); how many were."""
    found = conn.execute(
        text(
            "SELECT o.line_digest FROM obs_staging c JOIN observations o "
            "ON o.observation_key = c.observation_key AND o.run_id = :run_id "
            "WHERE o.line_digest IS NOT NULL"
        ),
        {"run_id": run_id},
    ).scalars()
    both: dict[bytes, int] = {}
    for digest in found:
        if order := known_line(digest):
            both[bytes(digest)] = order
    if both:
        conn.execute(
            text(
                f"INSERT INTO obs_staging ({KEY_COLUMNS}) "  # noqa: S608 - constant SQL
                "SELECT k.ord, o.observation_key, o.entity_key, o.partition, o.start_url, "
                "o.payload_hash, o.line_digest FROM observations o JOIN "
                "unnest(CAST(:ords AS integer[]), CAST(:digests AS bytea[])) AS k(ord, d) "
                "ON o.line_digest = k.d AND o.run_id = :run_id"
            ),
            {"ords": list(both.values()), "digests": list(both), "run_id": run_id},
        )
    return len(both)


def write_changes(
    conn: Connection,
    table: str,
    params: dict[str, Any],
    rows: int,
    todo: tuple[int, int] | None,
) -> tuple[int, int]:
    """Write new and changed rows of ``table`` on PostgreSQL (``rows`` staged, one per key);
    (inserted, updated).

    One join counts what is new and what changed (keys first: ``todo``, counted as the
    payloads were sent); a plain UPDATE of the changed keys and a plain INSERT of the new ones,
    each run only when needed, cost less than one INSERT ... ON CONFLICT. When every staged
    key was new (a run's first sync), the INSERT takes them all without looking each one up
    again. If another sync inserted one of the new keys meanwhile, the INSERT fails on the
    unique key: it is undone to its savepoint and the upsert, which takes such rows as they are
    by now, writes what is left.
    """
    now = bindparam("now", type_=UTCDateTime())
    if todo is None:
        found = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE o.observation_key IS NULL) AS new, "  # noqa: S608 - constant SQL
                "count(*) FILTER (WHERE o.payload_hash <> c.payload_hash) AS changed "
                f"FROM {table} c LEFT JOIN observations o "
                "ON o.observation_key = c.observation_key AND o.run_id = :in_run"
            ),
            params,
        ).one()
        todo = (int(found.new), int(found.changed))
    new, changed = todo
    updated = 0
    if changed:
        updated = conn.execute(
            text(
                "UPDATE observations o SET payload = CAST(c.payload AS jsonb), "  # noqa: S608 - constants only
                "payload_hash = c.payload_hash, line_digest = c.line_digest, "
                "partition = c.partition, "
                "start_url = c.start_url, entity_key = c.entity_key, source_job_id = :job_id, "
                "source_attempt_id = :attempt_id, shape = NULL, plain_for = NULL, "
                f"last_changed_at = :now FROM {table} c "
                "WHERE o.observation_key = c.observation_key AND o.run_id = :in_run "
                "AND o.payload_hash <> c.payload_hash"
            ).bindparams(now),
            params,
        ).rowcount
    if not new:
        return 0, int(updated)
    inserted, rewritten = _insert_new(conn, table, params, every_key_new=new == rows)
    return inserted, int(updated) + rewritten


def _insert_new(
    conn: Connection, table: str, params: dict[str, Any], *, every_key_new: bool
) -> tuple[int, int]:
    """Insert the new keys of ``table`` under a savepoint, or, when another sync inserted one
    of them meanwhile, upsert what is left; (inserted, updated by that upsert)."""
    now = bindparam("now", type_=UTCDateTime())
    upsert = upsert_sql(table, postgres=True)
    conn.exec_driver_sql("SAVEPOINT obs_insert")
    try:
        only_new = (
            ""
            if every_key_new
            else (
                " WHERE NOT EXISTS (SELECT 1 FROM observations o "
                "WHERE o.observation_key = c.observation_key AND o.run_id = :in_run)"
            )
        )
        inserted = conn.execute(
            text(upsert.partition(" LEFT JOIN ")[0] + only_new).bindparams(now),
            params,
        ).rowcount
        conn.exec_driver_sql("RELEASE SAVEPOINT obs_insert")
        return int(inserted), 0
    except IntegrityError:
        conn.exec_driver_sql("ROLLBACK TO SAVEPOINT obs_insert")
        written = conn.execute(
            text(
                f"WITH w AS ({upsert} RETURNING xmax = 0 AS is_new) "  # noqa: S608 - constant SQL
                "SELECT count(*) AS written, count(*) FILTER (WHERE is_new) AS new FROM w"
            ).bindparams(now),
            params,
        ).one()
        return int(written.new), int(written.written) - int(written.new)
