"""A run's first sync copied straight into observations while the export downloads."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import IO, cast

import orjson
import psycopg
from sqlalchemy import Connection

from sync import logs
from sync.identity import Identified
from sync.ingest.line_digests import DIGEST_SIZE
from sync.ingest.source import WRITTEN_COLUMNS, Source

log = logs.get("staging")

_NO_DIGEST = bytes(1 + DIGEST_SIZE)
_SPOOL_BUFFER = 1 << 20
# the most (partition, shape) groups a copy counts for its run's first evaluation: records that
# differ that much are counted by the database instead (see sync.runs.shapes)
MAX_GROUPS = 1000
_DIRECT = f"COPY observations ({WRITTEN_COLUMNS}, shape, plain_for) FROM STDIN"


class DirectCopy:
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
        # written in large pieces: a default-sized buffer costs a system call every dozen rows
        self.spool: IO[bytes] = tempfile.TemporaryFile(buffering=_SPOOL_BUFFER)  # noqa: SIM115 - closed by the stager
        self.rows = 0
        # the rows copied per (partition, shape), while they are few (None: too many)
        self.groups: Counter[tuple[str | None, str | None]] | None = Counter()
        self._failed: str | None = None  # why the server refused the copy before its end

    def add(
        self,
        staged: Identified,
        line_digest: bytes | None,
        shape: str | None,
        plain_for: str | None = None,
    ) -> None:
        """Copy one record with its shape and plain values' mark, and keep it in the spool
        (without either: a record staged again from the spool is read again by its evaluation
        and checked by its publication)."""
        observation_key, entity_key, partition, start_url, payload, payload_hash = staged
        s = self._source
        groups = self.groups
        if groups is not None:
            groups[partition, shape] += 1
            if len(groups) > MAX_GROUPS:
                self.groups = None
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
                        self._now,
                        self._now,
                        shape,
                        plain_for,
                    )
                )
            except psycopg.Error as exc:  # the server gave up on the copy: the spool goes on
                self._failed = type(exc).__name__
        # the line's digest first (a flag byte and its 16 bytes), then the record's values
        self.spool.write(
            (_NO_DIGEST if line_digest is None else b"\x01" + line_digest)
            + orjson.dumps(staged)
            + b"\n"
        )

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

    def spooled(self) -> Iterator[tuple[Identified, bytes | None]]:
        """Every record the copy took, in order, with its line's digest (from the spool)."""
        spool = self.spool
        spool.seek(0)
        while digest := spool.read(1 + DIGEST_SIZE):  # as add spooled it
            staged = cast(Identified, tuple(orjson.loads(spool.readline())))
            yield staged, digest[1:] if digest[0] else None
