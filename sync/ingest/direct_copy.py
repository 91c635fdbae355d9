"""A run's first sync copied straight into observations while the export downloads."""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import IO, cast

import psycopg
from sqlalchemy import Connection

from sync import logs
from sync.identity import Identified
from sync.ingest.source import Source

log = logs.get("staging")

_SPOOL_BUFFER = 1 << 20
_SEND_ROWS = 256  # rows joined into one piece of the copy
# the most (partition, shape) groups a copy counts for its run's first evaluation: records that
# differ that much are counted by the database instead (see sync.runs.shapes)
MAX_GROUPS = 1000
# the record's own values first, then what every row of the sync shares (written once)
_DIRECT = (
    "COPY observations (observation_key, entity_key, partition, start_url, payload, payload_hash, "
    "line_digest, shape, plain_for, dataset, run_id, collection_window, source_job_id, "
    "source_attempt_id, first_seen_at, last_changed_at) FROM STDIN"
)
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


def copy_text(value: str | None) -> str:
    """A value as a field of COPY's text format: NULL as ``\\N``; a backslash, tab, line feed
    or carriage return escaped (no other character is special, and no text holds a NUL)."""
    if value is None:
        return "\\N"
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_ESCAPES)
    return value


def copy_value(field: str) -> str | None:
    """A field of COPY's text format as :func:`copy_text` wrote it, read back."""
    if field == "\\N":
        return None
    if "\\" in field:
        return _ESCAPED.sub(lambda m: _UNESCAPES[m[1]], field)
    return field


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
        # what every row shares, as the end of each row's text (the time stored as naive UTC)
        now = source.stored_now.isoformat(sep=" ")
        shared = (source.dataset, source.run_id, source.window, str(source.job_id))
        self._tail = "\t".join(map(copy_text, (*shared, source.attempt_id, now, now))) + "\n"
        self._rows: list[str] = []  # the rows not sent yet
        raw = conn.connection.driver_connection
        assert raw is not None
        conn.exec_driver_sql("SAVEPOINT obs_direct")
        self._cursor = raw.cursor()
        self._copying: AbstractContextManager[psycopg.Copy] | None = self._cursor.copy(_DIRECT)
        self._copy = self._copying.__enter__()
        # the copy's rows as sent, in pieces of _SEND_ROWS rows, for staging should it fail
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
        groups = self.groups
        if groups is not None:
            groups[partition, shape] += 1
            if len(groups) > MAX_GROUPS:
                self.groups = None
        # each row written as COPY's text, a fraction of the steps of psycopg's write_row,
        # which adapts each of its sixteen values on its own
        rows = self._rows
        rows.append(
            "\t".join(
                (
                    observation_key,
                    copy_text(entity_key),
                    copy_text(partition),
                    copy_text(start_url),
                    copy_text(payload),
                    payload_hash,
                    "\\N" if line_digest is None else "\\\\x" + line_digest.hex(),
                    copy_text(shape),
                    copy_text(plain_for),
                    self._tail,
                )
            )
        )
        if len(rows) >= _SEND_ROWS:
            self._send()

    def finish(self) -> bool:
        """End the copy: True when every record went in, False when the server refused it (a
        key stored already, as a rule): the copy is undone, and the spool holds every record
        for staging, whose merge deals with what the copy could not."""
        self._send()
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

    def _send(self) -> None:
        """Send the rows not sent yet, as one piece of the copy, and keep them in the spool."""
        rows, self._rows = self._rows, []
        if not rows:
            return
        data = "".join(rows).encode()
        self.spool.write(data)
        if not self._failed:
            try:
                self._copy.write(data)
            except psycopg.Error as exc:  # the server gave up on the copy: the spool goes on
                self._failed = type(exc).__name__

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
        """Every record the copy took, in order, with its line's digest (from the spool, which
        holds the copy's rows as they were sent)."""
        spool = self.spool
        spool.seek(0)
        for line in spool:
            fields = [copy_value(f) for f in line.decode().removesuffix("\n").split("\t")]
            staged = cast(Identified, tuple(fields[:6]))
            digest = fields[6]
            yield staged, None if digest is None else bytes.fromhex(digest.removeprefix("\\x"))
