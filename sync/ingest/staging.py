"""Staging one job's records: collected in a temporary table and merged into observations in one
statement (what cannot be stored is set aside before, see :mod:`sync.ingest.records`). How they
are written: copied straight in (:mod:`sync.ingest.direct_copy`), merged while the export
downloads (:mod:`sync.ingest.early_merge`), or merged after it (:mod:`sync.ingest.staged_merge`).
"""

from __future__ import annotations

import itertools
import tempfile
from array import array
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from sync.identity import Identified
from sync.ingest import early_merge, staged_merge
from sync.ingest.direct_copy import DirectCopy
from sync.ingest.early_merge import EarlyMerge, RowsWritten
from sync.ingest.line_digests import LineDigests
from sync.ingest.source import KEY_COLUMNS, STAGED_COLUMNS, Source
from sync.ingest.staged_merge import DUPLICATES

__all__ = ["BATCH_SIZE", "ObservationStager", "Source", "UpsertCounts", "stages_keys_first"]

BATCH_SIZE = 5000  # records staged per COPY


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


class RunFound(NamedTuple):
    """What an import found of its run before it wrote anything (see :func:`run_version`)."""

    has_rows: bool
    version: int | None  # its data version (PostgreSQL)
    groups: dict[str, Any] | None  # its rows per group as kept then (PostgreSQL)


def run_version(session: Session, run_id: str) -> RunFound:
    """Whether a stager of the run stages keys first (as :func:`stages_keys_first` says) and,
    on PostgreSQL, the run's data version and the groups kept with it, read in the same snapshot
    (version 1 for a run not recorded yet: its first import counts up from there), before the
    import writes anything. An import that then counts the version up by exactly one saw every
    row it replaced as the run held it at that version: any other import committed meanwhile
    would have counted it up first (and an evaluation that gave rows their shapes meanwhile
    kept other groups)."""
    conn = session.connection()
    if conn.dialect.name != "postgresql":
        return RunFound(False, None, None)
    has_rows, version, groups = conn.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM observations WHERE run_id = :run_id), "
            "(SELECT data_version FROM runs WHERE run_id = :run_id), "
            "(SELECT row_groups FROM runs WHERE run_id = :run_id)"
        ),
        {"run_id": run_id},
    ).one()
    return RunFound(bool(has_rows), version if version is not None else 1, groups)


def stages_keys_first(session: Session, run_id: str) -> bool:
    """Whether a stager of the run stages keys first: on PostgreSQL, when the run holds
    observations already (see :class:`ObservationStager`)."""
    return run_version(session, run_id).has_rows


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
    into observations as they come (see :class:`DirectCopy`); ``flush`` at the end of the
    export ends the copy.

    Merged early (keys first, given the ``source``): the parsed records are merged a batch at
    a time while the export downloads, and only a key twice, a parsed key of a known line or a
    refused statement falls back to the merge above (see :class:`EarlyMerge`);
    ``merge_early=False`` stages and merges after the download.

    Known lines (keys first, given the run's ``lines``): a line whose digest a row of the run
    holds is that row's record, stored as it is (see :mod:`sync.ingest.line_digests`); it is
    counted, not staged, unless its key comes on another line too.

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
        self._direct: DirectCopy | None = None
        self.copied: int | None = None  # rows copied straight in, once that copy went through
        # and how many per (partition, shape), when the copy could count them
        self.copied_groups: Counter[tuple[str | None, str | None]] | None = None
        if self.postgres and not self.keys_first and source is not None:
            self._direct = DirectCopy(self.conn, source)
        self._early: EarlyMerge | None = None
        self._payloads: list[str] = []  # the payloads of the batch, when merged early
        self._shapes: list[str | None] = []  # and their records' shapes
        self._merge_batch = merge_batch or early_merge.MERGE_BATCH
        # the stored digests of parsed records' keys that known lines may name, by index
        self._named = array("i")
        self.merged_early = False  # whether the early merge stood (see EarlyMerge)
        self.written: RowsWritten | None = None  # what it wrote, once it stood
        if self.keys_first and merge_early and source is not None:
            self._early = EarlyMerge(self.conn, source, self._note_stored)
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

    @property
    def takes_shapes(self) -> bool:
        """Whether records are copied straight in or merged while the export downloads, where
        a record's shape, given to :meth:`add`, is stored with it (see
        :mod:`sync.runs.shapes`; a merge after the download forgets it)."""
        return self._direct is not None or self._early is not None

    @property
    def takes_plain(self) -> bool:
        """Whether records are copied straight in, where a record's mark that its values are
        all plain (the fingerprint of :class:`sync.casts.PlainValues`), given to :meth:`add`,
        is stored with it (a merge forgets it)."""
        return self._direct is not None

    def add(
        self,
        staged: Identified,
        line_digest: bytes | None = None,
        shape: str | None = None,
        plain_for: str | None = None,
    ) -> None:
        """Stage one record: its values as :class:`RecordIdentity` gives them, the digest of
        its line (see :mod:`sync.ingest.line_digests`) and, where :attr:`takes_shapes`, its
        shape, and where :attr:`takes_plain`, its plain values' mark."""
        self.count += 1
        if self._direct is not None:
            self._direct.add(staged, line_digest, shape, plain_for)
            return
        if self._spool is not None:
            observation_key, entity_key, partition, start_url, payload, payload_hash = staged
            data = payload.encode()
            self._spool.write(data)
            self._spooled += len(data)
            self._ends.append(self._spooled)
            if self._early is not None:
                self._payloads.append(payload)
                self._shapes.append(shape)
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
                    groups = direct.groups
                    if groups is not None and sum(groups.values()) == direct.rows:
                        self.copied_groups = groups
                else:
                    self._restage(direct)
            finally:
                direct.spool.close()
        if not self._batch:
            return
        if self._early is not None:
            self._early.send(self._batch, self._payloads, self._shapes)
            self._batch, self._payloads, self._shapes = [], [], []
            return
        if self.postgres:
            raw = self.conn.connection.driver_connection
            assert raw is not None
            columns = KEY_COLUMNS if self._spool is not None else STAGED_COLUMNS
            with (
                raw.cursor() as cursor,
                cursor.copy(f"COPY obs_staging ({columns}) FROM STDIN") as copy,
            ):
                for row in self._batch:
                    copy.write_row(row)
        else:
            self.conn.exec_driver_sql(
                f"INSERT INTO obs_staging ({STAGED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608 - constant SQL
                self._batch,
            )
        self._batch.clear()

    def _restage(self, direct: DirectCopy) -> None:
        """Stage the records a straight copy could not take, from its spool."""
        count, self.count = self.count, 0
        for staged, line_digest in direct.spooled():
            self.add(staged, line_digest)
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
            if why is None and self.conn.exec_driver_sql(DUPLICATES).scalar_one():
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
            self.written = early.rows
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
        if self._early is not None and (early := self._finish_early()) is not None:
            return early
        if self.copied is not None:  # every record went straight in, each key once
            self.conn.exec_driver_sql("DROP TABLE obs_staging")
            return UpsertCounts(
                staged=self.count,
                inserted=self.copied,
                updated=0,
                unchanged=0,
                duplicate_keys=0,
                conflicting_duplicates=0,
            )
        rows, twice, todo = self._stage_known_lines(source.run_id)
        duplicates = conflicting = 0
        if twice:  # most exports hold each key once
            duplicates, conflicting = staged_merge.drop_duplicates(self.conn)
        if todo is None and self._spool is not None:
            todo = self._send_payloads(source.run_id, known_keys=False)
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
            inserted, updated = staged_merge.write_changes(
                self.conn, self._table, params, rows - duplicates, todo
            )
        else:
            upsert = staged_merge.upsert_sql(self._table, postgres=False)
            inserted, updated = staged_merge.write_on_sqlite(self.conn, upsert, params)
        self._drop_staging()
        duplicates += self._known_again  # the same line again: the same key, the same payload
        return UpsertCounts(
            staged=self.count,
            inserted=inserted,
            updated=updated,
            unchanged=self.count - duplicates - inserted - updated,
            duplicate_keys=duplicates,
            conflicting_duplicates=conflicting,
        )

    def _stage_known_lines(self, run_id: str) -> tuple[int, int, tuple[int, int] | None]:
        """Stage the known lines whose key a parsed record has too: the rows staged (the parsed
        records and those lines), whether a key is staged twice, and, when the join that sends
        the payloads told that none has such a key, how many are new and how many changed."""
        # the rows staged: the parsed records, and known lines whose key came on another line too
        rows = self.count - self._known_lines
        todo: tuple[int, int] | None = None
        twice = self.conn.exec_driver_sql(DUPLICATES).scalar_one()
        if self._spool is not None and self._known_lines and not twice:
            # most parsed records share no key with a known line: the join that sends the
            # payloads tells, and only if one does are those lines staged and the join run again
            todo = self._send_payloads(run_id, known_keys=True)
        if todo is None:
            staged_known = self._stage_known_keys(run_id)
            if staged_known:
                rows += staged_known
                twice = self.conn.exec_driver_sql(DUPLICATES).scalar_one()
        return rows, twice, todo

    def _drop_staging(self) -> None:
        """Remove what the merge staged."""
        if self.postgres:
            self.conn.exec_driver_sql("DROP TABLE obs_staging")
            if self._table != "obs_staging":
                self.conn.exec_driver_sql(f"DROP TABLE {self._table}")
        else:
            self.conn.exec_driver_sql("DELETE FROM obs_staging")

    def _send_payloads(self, run_id: str, *, known_keys: bool) -> tuple[int, int] | None:
        """Keys first: send the payloads of the new and changed staged records, which the merge
        then reads alone (see :func:`staged_merge.send_payloads`); None when ``known_keys``
        found a parsed key of a known line, and nothing was sent."""
        spool = self._spool
        assert spool is not None
        todo = staged_merge.send_payloads(
            self.conn,
            spool,
            self._ends,
            run_id,
            batch_size=self.batch_size,
            known_line=self._known_line_order if known_keys else None,
        )
        if todo is not None:
            self.close()
            self._table = "obs_changes"
        return todo

    def _stage_known_keys(self, run_id: str) -> int:
        """Stage the known lines whose key a parsed record has too (as the row they name, with
        the order of the last such line), so that duplicate keys count and the last record of
        a key wins as in a full import; how many were staged."""
        if self._lines is None or not self._known_lines:
            return 0
        self.flush()
        return staged_merge.stage_known_keys(self.conn, run_id, self._known_line_order)

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

    def close(self) -> None:
        """Remove the payload spool, if any."""
        if self._early is not None:
            self._early.keys.close()
        if self._spool is not None:
            self._spool.close()
            self._spool = None
