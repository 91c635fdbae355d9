"""A later sync's records merged into observations while the export downloads (keys first)."""

from __future__ import annotations

import contextlib
import tempfile
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import orjson
import psycopg
from orjson import Fragment
from sqlalchemy import Connection

from sync import logs
from sync.ingest.source import KEY_COLUMNS, WRITTEN_COLUMNS, Source

MERGE_BATCH = 1000  # parsed records merged per statement while the export downloads (keys first)
log = logs.get("staging")

# One statement per batch of parsed records, sent while the export downloads (see EarlyMerge):
# their stored rows looked up once (by key, in the run); their keys staged for the duplicate
# check; the stored digests of their keys returned for the known-line check; changed rows
# updated (the hash compared again on the row as it is when locked), new keys inserted. A key
# stored outside the run looks new, and the insert's unique key undoes the early merge.
_EARLY = (
    "WITH k AS (SELECT (e->>0)::integer AS ord, e->>1 AS observation_key, "  # noqa: S608 - constant SQL
    "e->>2 AS entity_key, e->>3 AS partition, e->>4 AS start_url, e->5 AS payload, "
    "e->>6 AS payload_hash, decode(e->>7, 'hex') AS line_digest, e->>8 AS shape "
    "FROM jsonb_array_elements(convert_from(%(batch)b, 'UTF8')::jsonb) AS e), "
    "s AS MATERIALIZED (SELECT k.*, o.id AS stored_id, o.payload_hash AS stored_hash, "
    "o.line_digest AS stored_digest, o.partition AS stored_partition, "
    "o.shape AS stored_shape, o.source_attempt_id AS stored_attempt "
    "FROM k LEFT JOIN observations o "
    "ON o.observation_key = k.observation_key AND o.run_id = %(run_id)s), "
    f"staged AS (INSERT INTO obs_staging ({KEY_COLUMNS}) SELECT {KEY_COLUMNS} FROM k), "
    "changed AS (UPDATE observations o SET payload = s.payload, "
    "payload_hash = s.payload_hash, line_digest = s.line_digest, partition = s.partition, "
    "start_url = s.start_url, entity_key = s.entity_key, source_job_id = %(job_id)s, "
    "source_attempt_id = %(attempt_id)s, shape = s.shape, plain_for = NULL, "
    "last_changed_at = %(now)s FROM s "
    "WHERE o.id = s.stored_id AND s.stored_hash <> s.payload_hash "
    "AND o.payload_hash <> s.payload_hash "
    "RETURNING o.id, o.partition, o.shape, s.stored_partition, s.stored_shape, s.stored_attempt), "
    f"new AS (INSERT INTO observations ({WRITTEN_COLUMNS}, shape) "
    "SELECT s.observation_key, %(dataset)s, s.entity_key, %(run_id)s, %(window)s, s.partition, "
    "s.start_url, s.payload, s.payload_hash, s.line_digest, %(job_id)s, "
    "%(attempt_id)s, %(now)s, %(now)s, s.shape FROM s "
    "WHERE s.stored_id IS NULL RETURNING id, partition, shape) "
    "SELECT (SELECT count(*) FROM changed), (SELECT count(*) FROM new), "
    "ARRAY(SELECT stored_digest FROM s WHERE stored_digest IS NOT NULL), "
    # what the batch replaced and wrote, per group of rows (see sync.runs.shapes), and the ids
    "(SELECT json_agg(json_build_array(stored_partition, stored_shape, stored_attempt, n)) "
    "FROM (SELECT stored_partition, stored_shape, stored_attempt, count(*) AS n FROM changed "
    "GROUP BY 1, 2, 3) AS g), "
    "(SELECT json_agg(json_build_array(partition, shape, n)) FROM (SELECT partition, shape, "
    "count(*) AS n FROM (SELECT partition, shape FROM changed UNION ALL "
    "SELECT partition, shape FROM new) AS w GROUP BY 1, 2) AS g), "
    "ARRAY(SELECT id FROM changed UNION ALL SELECT id FROM new)"
)


# the most row ids an import keeps for its run's next evaluation (8 bytes each; a sync that
# wrote more has that evaluation pass over the run instead, see sync.runs.shapes)
MAX_WRITTEN_IDS = 250_000


@dataclass
class RowsWritten:
    """What an early merge wrote, per group of rows (see :mod:`sync.runs.shapes`): the rows it
    replaced by (partition, stored shape, attempt that wrote them), the rows it wrote by
    (partition, shape), and their ids while they are few enough to keep."""

    replaced: Counter[tuple[str | None, str | None, str]] = field(default_factory=Counter)
    wrote: Counter[tuple[str | None, str | None]] = field(default_factory=Counter)
    ids: array[int] | None = field(default_factory=lambda: array("q"))

    def add(self, replaced: Any, wrote: Any, ids: list[int]) -> None:
        """Count one batch's statement's result in."""
        for partition, shape, attempt, n in replaced or ():
            self.replaced[partition, shape, attempt] += n
        for partition, shape, n in wrote or ():
            self.wrote[partition, shape] += n
        if self.ids is not None:
            self.ids.extend(ids)
            if len(self.ids) > MAX_WRITTEN_IDS:
                self.ids = None


class EarlyMerge:
    """Keys first on PostgreSQL: the parsed records merged into observations while the export
    still downloads, a batch at a time, so that PostgreSQL writes while the worker reads the
    next lines instead of after it. The statements go out in pipeline mode (none waits for its
    result) under a savepoint, and every batch's key rows go to a local spool as well.

    What the merge cannot tell while the export downloads is told at its end: a key that came
    twice, or a parsed record whose key a known line also had (its stored row's digest is one
    of the export's known lines). Either, or a statement that failed (a new key that another
    sync of the run inserted meanwhile, a key stored outside the run), undoes the early merge to
    its savepoint, and the spooled keys are staged and merged as before."""

    def __init__(
        self, conn: Connection, source: Source, stored: Callable[[list[bytes]], None]
    ) -> None:
        self._conn = conn
        self._stored = stored  # told the digests that the merged records' keys had stored
        raw = conn.connection.driver_connection
        assert raw is not None
        self._raw = raw
        conn.exec_driver_sql("SAVEPOINT obs_early")
        self._pipeline: psycopg.Pipeline | None = raw.pipeline()
        self._pipeline.__enter__()
        self._params: dict[str, Any] = {
            "run_id": source.run_id,
            "dataset": source.dataset,
            "window": source.window,
            "job_id": source.job_id,
            "attempt_id": source.attempt_id,
            # stored as naive UTC, stamped with the sync's start as rows copied straight in are
            "now": source.stored_now,
        }
        self._sent: deque[psycopg.Cursor[Any]] = deque()  # statements not yet read back
        self.keys: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the stager
        self.failed: str | None = None  # why the server refused a statement
        self.inserted = self.updated = 0
        self.rows = RowsWritten()

    def send(
        self, rows: list[tuple[Any, ...]], payloads: list[str], shapes: list[str | None]
    ) -> None:
        """Merge one batch of parsed records (key rows as staged, in KEY_COLUMNS' order, their
        payloads and their records' shapes), and spool its key rows."""
        keyed = [
            (o, k, e, p, u, h, d.hex() if d is not None else None) for o, k, e, p, u, h, d in rows
        ]
        self.keys.write(orjson.dumps(keyed) + b"\n")  # the payloads are in the stager's spool
        if self.failed:
            return
        # one JSON document, each payload in it as it is (no array of each column to dump
        # value by value, and PostgreSQL parses each payload once)
        batch = orjson.dumps(
            [
                (o, k, e, p, u, Fragment(payload), h, d, shape)
                for (o, k, e, p, u, h, d), payload, shape in zip(
                    keyed, payloads, shapes, strict=True
                )
            ]
        )
        cursor = self._raw.cursor()
        self._sent.append(cursor)
        try:
            cursor.execute(_EARLY, {**self._params, "batch": batch}, prepare=False)
            self._read(wait=False)
        except psycopg.Error as exc:  # a statement failed; the rest only spools
            self.failed = type(exc).__name__

    def _read(self, *, wait: bool) -> None:
        """Read back the statements whose results came (``wait``: all of them)."""
        sent = self._sent
        while sent and (wait or sent[0].pgresult is not None):
            with sent.popleft() as cursor:
                row = cursor.fetchone()
            assert row is not None
            self.updated += row[0]
            self.inserted += row[1]
            if row[2]:
                self._stored(row[2])
            self.rows.add(row[3], row[4], row[5])

    def finish(self) -> bool:
        """Wait for every statement: whether all of them went through."""
        pipeline, self._pipeline = self._pipeline, None
        assert pipeline is not None
        try:
            pipeline.__exit__(None, None, None)
            if not self.failed:
                self._read(wait=True)
        except psycopg.Error as exc:
            self.failed = self.failed or type(exc).__name__
        while self._sent:
            self._sent.popleft().close()
        return not self.failed

    def undo(self, why: str) -> None:
        """Undo the early merge (its statements' writes and staged keys) to its savepoint."""
        self._conn.exec_driver_sql("ROLLBACK TO SAVEPOINT obs_early")
        log.info("staging.early_merge_undone", extra={"reason": why})

    def keep(self) -> None:
        """Keep what the early merge wrote."""
        self._conn.exec_driver_sql("RELEASE SAVEPOINT obs_early")

    def abort(self, exc: BaseException) -> None:
        """Leave pipeline mode (the transaction is to be rolled back)."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            # the transaction is rolled back either way; the caller raises exc
            with contextlib.suppress(psycopg.Error):
                pipeline.__exit__(type(exc), exc, exc.__traceback__)
        while self._sent:
            self._sent.popleft().close()

    def spooled(self) -> Iterator[tuple[Any, ...]]:
        """The key rows of every batch, in order."""
        self.keys.seek(0)
        for batch in self.keys:
            for o, k, e, p, u, h, d in orjson.loads(batch):
                yield o, k, e, p, u, h, bytes.fromhex(d) if d is not None else None
