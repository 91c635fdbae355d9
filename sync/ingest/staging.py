"""Staging one job's records: collected in a temporary table and merged into observations in one
statement (what cannot be stored is set aside before, see :mod:`sync.ingest.records`)."""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, cast

import orjson
import psycopg
from orjson import Fragment
from sqlalchemy import Connection, bindparam, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sync import logs
from sync.identity import Identified
from sync.ingest.line_digests import DIGEST_SIZE, LineDigests
from sync.models import UTCDateTime
from sync.states import ValidationState

BATCH_SIZE = 5000  # records staged per COPY
MERGE_BATCH = 1000  # parsed records merged per statement while the export downloads (keys first)
log = logs.get("staging")


@dataclass(frozen=True)
class UpsertCounts:
    """What one sync did to the observations table."""

    staged: int
    inserted: int
    updated: int
    unchanged: int
    duplicate_keys: int
    conflicting_duplicates: int


_STAGING = (
    "CREATE TEMP TABLE IF NOT EXISTS obs_staging (ord integer, observation_key text, "
    "payload_hash text, entity_key text, partition text, start_url text, payload text, "
    "line_digest {binary})"
)
# in the order of RecordIdentity's values and the line's digest, the payload left out when keys
# go first
_STAGED_COLUMNS = (
    "ord, observation_key, entity_key, partition, start_url, payload, payload_hash, line_digest"
)
_KEY_COLUMNS = "ord, observation_key, entity_key, partition, start_url, payload_hash, line_digest"
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
    + ", ".join(f"c.{name}" for name in _KEY_COLUMNS.split(", "))
    + ", o.observation_key IS NULL AS new, "
    "o.observation_key IS NULL OR o.payload_hash <> c.payload_hash AS write, o.line_digest"
    " FROM obs_staging c LEFT JOIN observations o ON o.observation_key = c.observation_key "
    "AND o.run_id = %(run_id)s "
    "WHERE o.observation_key IS NULL OR o.payload_hash <> c.payload_hash{also} ORDER BY c.ord"
)
# ... and the staged records whose key a stored row has that a known line may name
_KNOWN_KEY = " OR o.line_digest IS NOT NULL"
# whether any key was staged twice (the counts of what was are taken only then)
_DUPLICATES = (
    "SELECT count(*) FROM (SELECT 1 FROM obs_staging GROUP BY observation_key "
    "HAVING count(*) > 1) AS d"
)


@dataclass(frozen=True)
class Source:
    """What every observation of one sync carries besides the record's own values (``now``:
    when rows copied straight in were first seen; a merge is stamped with its own time)."""

    dataset: str
    run_id: str
    window: str
    job_id: int
    attempt_id: str
    now: datetime

    @property
    def stored_now(self) -> datetime:
        """``now`` as observations store it: naive UTC."""
        return self.now.astimezone(UTC).replace(tzinfo=None)


_NO_DIGEST = bytes(1 + DIGEST_SIZE)
# every column a sync writes, in the order of each statement that inserts an observation
_WRITTEN = (
    "observation_key, dataset, entity_key, run_id, collection_window, partition, start_url, "
    "payload, payload_hash, line_digest, source_job_id, source_attempt_id, validation_state, "
    "first_seen_at, last_changed_at"
)
_DIRECT = f"COPY observations ({_WRITTEN}) FROM STDIN"


class _DirectCopy:
    """A run's first sync copied straight into observations while the export downloads, so
    that PostgreSQL parses and indexes the rows while the worker reads the next ones, instead of
    after it. The copy runs under a savepoint, and every record goes to a local spool as well:
    a key that turns out to be stored already (twice in the export, or written meanwhile by
    another sync of the run) fails the copy at its end, the savepoint undoes it, and the spool
    is staged and merged as any other sync is."""

    def __init__(self, conn: Connection, source: Source) -> None:
        self._conn = conn
        self._source = source
        # stored as naive UTC; sent as text, which costs a fraction of dumping a datetime a row
        self._now = source.stored_now.isoformat(sep=" ")
        raw = conn.connection.driver_connection
        assert raw is not None
        conn.exec_driver_sql("SAVEPOINT obs_direct")
        self._cursor = raw.cursor()
        self._copying: AbstractContextManager[psycopg.Copy] | None = self._cursor.copy(_DIRECT)
        self._copy = self._copying.__enter__()
        self.spool: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the stager
        self.rows = 0
        self._failed: str | None = None  # why the server refused the copy before its end

    def add(self, staged: Identified, line_digest: bytes | None) -> None:
        """Copy one record, and keep it in the spool."""
        observation_key, entity_key, partition, start_url, payload, payload_hash = staged
        s = self._source
        if not self._failed:
            try:
                self._copy.write_row(
                    (
                        observation_key,
                        s.dataset,
                        entity_key,
                        s.run_id,
                        s.window,
                        partition,
                        start_url,
                        payload,
                        payload_hash,
                        line_digest,
                        s.job_id,
                        s.attempt_id,
                        ValidationState.PENDING.value,
                        self._now,
                        self._now,
                    )
                )
            except psycopg.Error as exc:  # the server gave up on the copy: the spool goes on
                self._failed = type(exc).__name__
        # the line's digest first (a flag byte and its 16 bytes), then the record's values
        self.spool.write(_NO_DIGEST if line_digest is None else b"\x01" + line_digest)
        self.spool.write(orjson.dumps(staged) + b"\n")

    def finish(self) -> bool:
        """End the copy: True when every record went in, False when the server refused it (a
        key stored already, as a rule): the copy is undone, and the spool holds every record
        for staging, whose merge deals with what the copy could not."""
        copying, self._copying = self._copying, None
        assert copying is not None
        try:
            copying.__exit__(None, None, None)
        except psycopg.Error as exc:  # a key stored already, as a rule; staging tells what it was
            self._failed = self._failed or type(exc).__name__
        if self._failed:
            self._cursor.close()
            self._conn.exec_driver_sql("ROLLBACK TO SAVEPOINT obs_direct")
            log.info(
                "staging.copy_undone",
                extra={"run_id": self._source.run_id, "refused": self._failed},
            )
            return False
        self.rows = self._cursor.rowcount
        self._cursor.close()
        self._conn.exec_driver_sql("RELEASE SAVEPOINT obs_direct")
        return True

    def abort(self, exc: BaseException) -> None:
        """Cancel an unfinished copy (the transaction is to be rolled back)."""
        copying, self._copying = self._copying, None
        if copying is not None:
            try:
                copying.__exit__(type(exc), exc, exc.__traceback__)
            except (psycopg.Error, type(exc)):
                pass  # the copy is cancelled either way; the caller raises exc
            self._cursor.close()


# One statement per batch of parsed records, sent while the export downloads (see _EarlyMerge):
# their stored rows looked up once (by key, in the run); their keys staged for the duplicate
# check; the stored digests of their keys returned for the known-line check; changed rows
# updated (the hash compared again on the row as it is when locked), new keys inserted. A key
# stored outside the run looks new, and the insert's unique key undoes the early merge.
_EARLY = (
    "WITH k AS (SELECT (e->>0)::integer AS ord, e->>1 AS observation_key, "  # noqa: S608 - constant SQL
    "e->>2 AS entity_key, e->>3 AS partition, e->>4 AS start_url, e->5 AS payload, "
    "e->>6 AS payload_hash, decode(e->>7, 'hex') AS line_digest "
    "FROM jsonb_array_elements(convert_from(%(batch)b, 'UTF8')::jsonb) AS e), "
    "s AS MATERIALIZED (SELECT k.*, o.id AS stored_id, o.payload_hash AS stored_hash, "
    "o.line_digest AS stored_digest FROM k LEFT JOIN observations o "
    "ON o.observation_key = k.observation_key AND o.run_id = %(run_id)s), "
    f"staged AS (INSERT INTO obs_staging ({_KEY_COLUMNS}) SELECT {_KEY_COLUMNS} FROM k), "
    "changed AS (UPDATE observations o SET payload = s.payload, "
    "payload_hash = s.payload_hash, line_digest = s.line_digest, partition = s.partition, "
    "start_url = s.start_url, entity_key = s.entity_key, source_job_id = %(job_id)s, "
    "source_attempt_id = %(attempt_id)s, "
    f"validation_state = '{ValidationState.PENDING}', last_changed_at = %(now)s FROM s "
    "WHERE o.id = s.stored_id AND s.stored_hash <> s.payload_hash "
    "AND o.payload_hash <> s.payload_hash RETURNING 1), "
    f"new AS (INSERT INTO observations ({_WRITTEN}) "
    "SELECT s.observation_key, %(dataset)s, s.entity_key, %(run_id)s, %(window)s, s.partition, "
    "s.start_url, s.payload, s.payload_hash, s.line_digest, %(job_id)s, "
    f"%(attempt_id)s, '{ValidationState.PENDING}', %(now)s, %(now)s FROM s "
    "WHERE s.stored_id IS NULL RETURNING 1) "
    "SELECT (SELECT count(*) FROM changed), (SELECT count(*) FROM new), "
    "ARRAY(SELECT stored_digest FROM s WHERE stored_digest IS NOT NULL)"
)


class _EarlyMerge:
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

    def send(self, rows: list[tuple[Any, ...]], payloads: list[str]) -> None:
        """Merge one batch of parsed records (key rows as staged, in _KEY_COLUMNS' order, and
        their payloads), and spool its key rows."""
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
                (o, k, e, p, u, Fragment(payload), h, d)
                for (o, k, e, p, u, h, d), payload in zip(keyed, payloads, strict=True)
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


def stages_keys_first(session: Session, run_id: str) -> bool:
    """Whether a stager of the run stages keys first: on PostgreSQL, when the run holds
    observations already (see :class:`ObservationStager`)."""
    conn = session.connection()
    return conn.dialect.name == "postgresql" and bool(
        conn.execute(
            text("SELECT EXISTS (SELECT 1 FROM observations WHERE run_id = :run_id)"),
            {"run_id": run_id},
        ).scalar_one()
    )


class ObservationStager:
    """Collects one job's records in a temporary table (COPY on PostgreSQL), then merges them
    into observations: new keys inserted, changed payloads updated, unchanged payloads neither
    written nor locked. Memory stays flat however many records the job has.

    The staged payload is text: only the rows that are written get parsed as JSON. One
    statement merges: it joins the staged hashes with the stored ones and writes only what is
    new or changed (nothing is copied into a change table first), and counts what it wrote.

    Keys first (PostgreSQL, when the run holds observations already, so most records of a sync
    are likely stored unchanged): only keys and hashes are staged, the payloads go to a local
    spool file; after one join with the stored hashes, the payloads of the new and changed
    records alone are sent, from the spool, and merged from a table of those rows only.

    Straight in (PostgreSQL, a run's first sync, given its ``source``): the records are copied
    into observations as they come (see :class:`_DirectCopy`); ``flush`` at the end of the
    export ends the copy.

    Merged early (keys first, given the ``source``): the parsed records are merged a batch at
    a time while the export downloads, and only a key twice, a parsed key of a known line or a
    refused statement falls back to the merge above (see :class:`_EarlyMerge`);
    ``merge_early=False`` stages and merges after the download.

    Known lines (keys first, given the run's ``lines``): a line whose digest a row of the run
    holds is that row's record, stored as it is (see :mod:`sync.ingest.line_digests`); it is
    counted,
    not staged, unless its key comes on another line too.

    ``keys_first`` is what :func:`stages_keys_first` said of the run, when the caller asked.
    """

    def __init__(
        self,
        session: Session,
        *,
        batch_size: int = BATCH_SIZE,
        merge_batch: int | None = None,
        merge_early: bool = True,
        run_id: str | None = None,
        source: Source | None = None,
        lines: LineDigests | None = None,
        keys_first: bool | None = None,
    ) -> None:
        self.session = session
        self.conn: Connection = session.connection()
        self.postgres = self.conn.dialect.name == "postgresql"
        self.batch_size = batch_size
        self.count = 0
        self._batch: list[tuple[Any, ...]] = []
        self._table = "obs_staging"
        binary = "bytea" if self.postgres else "blob"
        self.conn.exec_driver_sql(
            _STAGING.format(binary=binary) + (" ON COMMIT DROP" if self.postgres else "")
        )
        self.conn.exec_driver_sql("DELETE FROM obs_staging")
        if keys_first is None:
            keys_first = run_id is not None and stages_keys_first(session, run_id)
        self.keys_first = keys_first
        self._spool = tempfile.TemporaryFile() if self.keys_first else None  # noqa: SIM115 - closed by merge or close
        self._ends = array("q")  # where each spooled payload ends
        self._spooled = 0
        self._direct: _DirectCopy | None = None
        self.copied: int | None = None  # rows copied straight in, once that copy went through
        if self.postgres and not self.keys_first and source is not None:
            self._direct = _DirectCopy(self.conn, source)
        self._early: _EarlyMerge | None = None
        self._payloads: list[str] = []  # the payloads of the batch, when merged early
        self._merge_batch = merge_batch or MERGE_BATCH
        # the stored digests of parsed records' keys that known lines may name, by index
        self._named = array("i")
        self.merged_early = False  # whether the early merge stood (see _EarlyMerge)
        if self.keys_first and merge_early and source is not None:
            self._early = _EarlyMerge(self.conn, source, self._note_stored)
        self._lines: LineDigests | None = None
        # per stored digest: the order of the last line that had it (0: none did)
        # (made at the first known line: the run's digests may still be being read till then)
        self._last_known = array("i")
        self._known_lines = 0  # lines counted as known rows
        self._known_again = 0  # of them, lines that a line before them had already named
        if lines is not None:
            self.know(lines)

    def know(self, lines: LineDigests) -> None:
        """Count the lines that these digests know as the run's rows (keys first only; before
        the first record), instead of staging them."""
        if self.keys_first and (lines.pending or lines.known):
            self._lines = lines

    def add(self, staged: Identified, line_digest: bytes | None = None) -> None:
        """Stage one record: its values as :class:`RecordIdentity` gives them, and the digest of
        its line (see :mod:`sync.ingest.line_digests`)."""
        self.count += 1
        if self._direct is not None:
            self._direct.add(staged, line_digest)
            return
        if self._spool is not None:
            observation_key, entity_key, partition, start_url, payload, payload_hash = staged
            data = payload.encode()
            self._spool.write(data)
            self._spooled += len(data)
            self._ends.append(self._spooled)
            if self._early is not None:
                self._payloads.append(payload)
            self._batch.append(
                (
                    self.count,
                    observation_key,
                    entity_key,
                    partition,
                    start_url,
                    payload_hash,
                    line_digest,
                )
            )
        else:
            self._batch.append((self.count, *staged, line_digest))
        if len(self._batch) >= (self.batch_size if self._early is None else self._merge_batch):
            self.flush()

    @property
    def knows_lines(self) -> bool:
        """Whether lines known as the run's stored rows are to be counted by :meth:`known`."""
        return self._lines is not None

    def known(self, indexes: list[int]) -> None:
        """Count lines that are the records of the run's rows with these stored digest
        indexes (as the ``lines`` given say), without staging them."""
        assert self._lines is not None, "known lines are counted only when given"
        last, count, again = self._last_known, self.count, 0
        if not last:
            last = self._last_known = array("i", [0]) * self._lines.known
        for index in indexes:
            count += 1
            if last[index]:
                again += 1
            last[index] = count
        self.count = count
        self._known_lines += len(indexes)
        self._known_again += again
        self._ends.extend(itertools.repeat(self._spooled, len(indexes)))  # never written

    def flush(self) -> None:
        """Write the buffered records to the staging table (straight in: end the copy, and
        stage the spooled records if it could not take them)."""
        if self._direct is not None:
            direct, self._direct = self._direct, None
            try:
                if direct.finish():
                    self.copied = direct.rows
                else:
                    self._restage(direct.spool)
            finally:
                direct.spool.close()
        if not self._batch:
            return
        if self._early is not None:
            self._early.send(self._batch, self._payloads)
            self._batch, self._payloads = [], []
            return
        if self.postgres:
            raw = self.conn.connection.driver_connection
            assert raw is not None
            columns = _KEY_COLUMNS if self._spool is not None else _STAGED_COLUMNS
            with (
                raw.cursor() as cursor,
                cursor.copy(f"COPY obs_staging ({columns}) FROM STDIN") as copy,
            ):
                for row in self._batch:
                    copy.write_row(row)
        else:
            self.conn.exec_driver_sql(
                f"INSERT INTO obs_staging ({_STAGED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608 - constant SQL
                self._batch,
            )
        self._batch.clear()

    def _restage(self, spool: IO[bytes]) -> None:
        """Stage the records a straight copy could not take, from its spool."""
        spool.seek(0)
        count, self.count = self.count, 0
        while digest := spool.read(1 + DIGEST_SIZE):  # as the copy spooled it
            staged = cast(Identified, tuple(orjson.loads(spool.readline())))
            self.add(staged, digest[1:] if digest[0] else None)
        assert self.count == count, "the spool holds every record copied"

    def abort(self, exc: BaseException) -> None:
        """Cancel a straight copy or an early merge still under way (the transaction is to be
        rolled back)."""
        direct, self._direct = self._direct, None
        if direct is not None:
            direct.abort(exc)
            direct.spool.close()
        early, self._early = self._early, None
        if early is not None:
            early.abort(exc)
            early.keys.close()
        self.close()  # the payload spool too

    def _finish_early(self) -> UpsertCounts | None:
        """End the early merge: its counts when it stands, or None when it was undone and its
        keys staged again for the merge (a key twice, a parsed key of a known line, a statement
        the server refused)."""
        early, self._early = self._early, None
        assert early is not None
        try:
            why = None if early.finish() else early.failed
            if why is None and self.conn.exec_driver_sql(_DUPLICATES).scalar_one():
                why = "duplicate_key"
            if why is None and any(map(self._order_of, self._named)):
                why = "known_line_key"
            if why is not None:
                early.undo(why)
                for row in early.spooled():
                    self._batch.append(row)
                    if len(self._batch) >= self.batch_size:
                        self.flush()
                self.flush()
                return None
            early.keep()
            self.merged_early = True
        finally:
            early.keys.close()
        self.conn.exec_driver_sql("DROP TABLE obs_staging")
        self.close()
        duplicates = self._known_again  # the same line again: the same key, the same payload
        return UpsertCounts(
            staged=self.count,
            inserted=early.inserted,
            updated=early.updated,
            unchanged=self.count - duplicates - early.inserted - early.updated,
            duplicate_keys=duplicates,
            conflicting_duplicates=0,
        )

    def _note_stored(self, digests: list[bytes]) -> None:
        """Keep which of the run's stored digests the early merge found on parsed records'
        keys, to tell at the end whether a known line named one of those rows."""
        lines = self._lines
        if lines is None:
            return
        for digest in digests:
            index = lines.index_of(digest)
            if index >= 0:
                self._named.append(index)

    def merge(self, source: Source, *, now: datetime) -> UpsertCounts:
        """Merge the staged records into observations as ``source`` says, stamped ``now``; the
        last record of a key wins."""
        self.flush()
        conn = self.conn
        if self._early is not None and (early := self._finish_early()) is not None:
            return early
        if self.copied is not None:  # every record went straight in, each key once
            conn.exec_driver_sql("DROP TABLE obs_staging")
            return UpsertCounts(
                staged=self.count,
                inserted=self.copied,
                updated=0,
                unchanged=0,
                duplicate_keys=0,
                conflicting_duplicates=0,
            )
        # the rows staged: the parsed records, and known lines whose key came on another line too
        rows = self.count - self._known_lines
        todo: tuple[int, int] | None = None
        twice = conn.exec_driver_sql(_DUPLICATES).scalar_one()
        if self._spool is not None and self._known_lines and not twice:
            # most parsed records share no key with a known line: the join that sends the
            # payloads tells, and only if one does are those lines staged and the join run again
            todo = self._send_payloads(source.run_id, known_keys=True)
        if todo is None:
            staged_known = self._stage_known_keys(source.run_id)
            if staged_known:
                rows += staged_known
                twice = conn.exec_driver_sql(_DUPLICATES).scalar_one()
        duplicates = conflicting = 0
        if twice:  # most exports hold each key once
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
        if todo is None and self._spool is not None:
            todo = self._send_payloads(source.run_id, known_keys=False)
        # One join finds what is new or changed; only those rows are written (or even locked).
        # The conflict clause keeps a payload that another sync made the same from a rewrite.
        payload = "CAST(c.payload AS jsonb)" if self.postgres else "c.payload"
        upsert = (
            f"INSERT INTO observations ({_WRITTEN}) "  # noqa: S608 - constant SQL
            "SELECT c.observation_key, :dataset, c.entity_key, :run_id, :window, "
            f"c.partition, c.start_url, {payload}, c.payload_hash, c.line_digest, :job_id, "
            ":attempt_id, "
            f"'{ValidationState.PENDING}', :now, :now FROM {self._table} c "
            "LEFT JOIN observations o ON o.observation_key = c.observation_key "
            "AND o.run_id = :in_run "
            "WHERE o.observation_key IS NULL OR o.payload_hash <> c.payload_hash "
            "ON CONFLICT (observation_key) DO UPDATE SET "
            "payload = excluded.payload, payload_hash = excluded.payload_hash, "
            "line_digest = excluded.line_digest, partition = excluded.partition, "
            "start_url = excluded.start_url, "
            "entity_key = excluded.entity_key, source_job_id = excluded.source_job_id, "
            "source_attempt_id = excluded.source_attempt_id, "
            f"validation_state = '{ValidationState.PENDING}', "
            "last_changed_at = excluded.last_changed_at "
            "WHERE observations.payload_hash <> excluded.payload_hash"
        )
        params = {
            "dataset": source.dataset,
            "run_id": source.run_id,
            "in_run": source.run_id,  # compared with a column; run_id is inserted
            "window": source.window,
            "job_id": source.job_id,
            "attempt_id": source.attempt_id,
            "now": now,
        }
        if self.postgres:
            inserted, updated = self._write_changes(upsert, params, rows - duplicates, todo)
        else:  # one writer at a time: what the join finds is what the upsert writes
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
            updated = int(written.written) - inserted
        if self.postgres:
            conn.exec_driver_sql("DROP TABLE obs_staging")
            if self._table != "obs_staging":
                conn.exec_driver_sql(f"DROP TABLE {self._table}")
        else:
            conn.exec_driver_sql("DELETE FROM obs_staging")
        duplicates += self._known_again  # the same line again: the same key, the same payload
        return UpsertCounts(
            staged=self.count,
            inserted=inserted,
            updated=updated,
            unchanged=self.count - duplicates - inserted - updated,
            duplicate_keys=duplicates,
            conflicting_duplicates=conflicting,
        )

    def _send_payloads(self, run_id: str, *, known_keys: bool) -> tuple[int, int] | None:
        """Keys first: the staged records that are new or changed come back from one join, and
        go to obs_changes with their spooled payloads; the merge reads those rows alone; how
        many were new and how many changed. Analysed at once: a temporary table has no
        statistics, and a planner that guesses its size picks joins that cost more than the
        whole merge. Only the key the writes join on is analysed (with the row count, which
        ANALYZE always takes): the payloads' statistics, which no plan uses, took three
        quarters of its time.

        ``known_keys``: the same join also brings the stored rows of the other staged keys,
        and None, with nothing sent, when one of them is the row of a known line (see
        :meth:`_stage_known_keys`)."""
        spool = self._spool
        assert spool is not None
        spool.flush()
        fd, ends = spool.fileno(), self._ends
        raw = self.conn.connection.driver_connection
        assert raw is not None
        self.conn.exec_driver_sql(_CHANGES)
        new = changed = 0
        named, collided = self._known_line_order, False
        with raw.cursor(name="obs_to_write") as wanted:
            wanted.execute(
                _TO_WRITE.format(also=_KNOWN_KEY if known_keys else ""), {"run_id": run_id}
            )
            while rows := wanted.fetchmany(self.batch_size):
                if known_keys and any(stored and named(stored) for *_, stored in rows):
                    collided = True
                    break
                with (
                    raw.cursor() as cursor,
                    cursor.copy(f"COPY obs_changes ({_STAGED_COLUMNS}) FROM STDIN") as copy,
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
            self.conn.exec_driver_sql("DROP TABLE obs_changes")
            return None
        self.conn.exec_driver_sql("ANALYZE obs_changes (observation_key)")
        self.close()
        self._table = "obs_changes"
        return new, changed

    def _known_line_order(self, digest: bytes) -> int:
        """The order of the last known line of the export that named the stored row with this
        line digest; 0 when none did."""
        lines = self._lines
        if lines is None:
            return 0
        return self._order_of(lines.index_of(bytes(digest)))

    def _order_of(self, index: int) -> int:
        """The order of the last known line of the export that named the stored digest of this
        index (-1: none); 0 when none did."""
        return self._last_known[index] if index >= 0 and self._last_known else 0

    def _stage_known_keys(self, run_id: str) -> int:
        """Stage the known lines whose key a parsed record has too (as the row they name, with
        the order of the last such line), so that duplicate keys count and the last record of
        a key wins as in a full import; how many were staged."""
        if self._lines is None or not self._known_lines:
            return 0
        self.flush()
        found = self.conn.execute(
            text(
                "SELECT o.line_digest FROM obs_staging c JOIN observations o "
                "ON o.observation_key = c.observation_key AND o.run_id = :run_id "
                "WHERE o.line_digest IS NOT NULL"
            ),
            {"run_id": run_id},
        ).scalars()
        both: dict[bytes, int] = {}
        for digest in found:
            if order := self._known_line_order(digest):
                both[bytes(digest)] = order
        if both:
            self.conn.execute(
                text(
                    f"INSERT INTO obs_staging ({_KEY_COLUMNS}) "  # noqa: S608 - constant SQL
                    "SELECT k.ord, o.observation_key, o.entity_key, o.partition, o.start_url, "
                    "o.payload_hash, o.line_digest FROM observations o JOIN "
                    "unnest(CAST(:ords AS integer[]), CAST(:digests AS bytea[])) AS k(ord, d) "
                    "ON o.line_digest = k.d AND o.run_id = :run_id"
                ),
                {"ords": list(both.values()), "digests": list(both), "run_id": run_id},
            )
        return len(both)

    def close(self) -> None:
        """Remove the payload spool, if any."""
        if self._early is not None:
            self._early.keys.close()
        if self._spool is not None:
            self._spool.close()
            self._spool = None

    def _write_changes(
        self, upsert: str, params: dict[str, Any], rows: int, todo: tuple[int, int] | None
    ) -> tuple[int, int]:
        """Write new and changed rows on PostgreSQL (``rows`` staged, one per key); (inserted,
        updated).

        One join counts what is new and what changed (keys first: ``todo``, counted as the
        payloads were sent); a plain UPDATE of the changed keys and a
        plain INSERT of the new ones, each run only when needed, cost about half of one
        INSERT ... ON CONFLICT. When every staged key was new (a run's first sync), the INSERT
        takes them all without looking each one up again. If another sync inserted one of the
        new keys meanwhile, the INSERT fails on the unique key: it is undone to its savepoint
        and the upsert, which takes such rows as they are by now, writes what is left.
        """
        conn = self.conn
        now = bindparam("now", type_=UTCDateTime())
        if todo is None:
            found = conn.execute(
                text(
                    "SELECT count(*) FILTER (WHERE o.observation_key IS NULL) AS new, "  # noqa: S608 - constant SQL
                    "count(*) FILTER (WHERE o.payload_hash <> c.payload_hash) AS changed "
                    f"FROM {self._table} c LEFT JOIN observations o "
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
                    "source_attempt_id = :attempt_id, "
                    f"validation_state = '{ValidationState.PENDING}', "
                    f"last_changed_at = :now FROM {self._table} c "
                    "WHERE o.observation_key = c.observation_key AND o.run_id = :in_run "
                    "AND o.payload_hash <> c.payload_hash"
                ).bindparams(now),
                params,
            ).rowcount
        if not new:
            return 0, int(updated)
        conn.exec_driver_sql("SAVEPOINT obs_insert")
        try:
            only_new = (
                ""
                if new == rows
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
            return int(inserted), int(updated)
        except IntegrityError:
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT obs_insert")
            written = conn.execute(
                text(
                    f"WITH w AS ({upsert} RETURNING xmax = 0 AS is_new) "  # noqa: S608 - constant SQL
                    "SELECT count(*) AS written, count(*) FILTER (WHERE is_new) AS new FROM w"
                ).bindparams(now),
                params,
            ).one()
            return int(written.new), int(updated) + int(written.written) - int(written.new)
