"""Line digests: every observation keeps the digest of the export line it was last written from, so
that a later import of the same run (Cloud's "Continue" of a job, a forced sync) knows the lines
it finds again unchanged without parsing them.

A line's digest is the first 16 bytes of the SHA-256 of the read rules (see
:func:`sync.ingest.repeat.read_rules`: the dataset's whole definition, run, window, frozen
partitions, size limits and the import rules' version) and the line's bytes, without its line break;
two lines with one digest would take about 2^64 tries to find, so a scraped page cannot pass a
change off as a known line. The same line read under the same rules stages the same observation key,
partition, payload and payload hash, so a line whose digest a row of the run holds is that row's
record, stored as it is: a full import would stage it and find it unchanged. Every write of a row
sets its digest along with its payload (:mod:`sync.ingest.staging`); a row whose payload an import
finds unchanged keeps the digest it had, which still names a line that stages that payload.

What a known line does not tell is whether its key also came on another line of the export. The
stager keeps, per stored digest, the order of the last line that had it (a line that had it again is
a duplicate key with the same payload), and the merge asks PostgreSQL which parsed records have the
key of a known line, and stages that line too: duplicate keys count, and the last record of a key
wins, exactly as in a full import.

Two syncs of one run at once (two jobs of a window): the digests are read when the sync starts, so a
row that the other sync rewrites meanwhile from its own line is left as that sync wrote it when this
sync's line for it is known, as if this sync had committed first; a sync that starts after the other
committed finds the new digest, parses its line, and writes it if it differs.

Not known: the lines of a recovery batch (frozen partitions' records are set aside, not counted
unchanged), every line on SQLite (one writer at a time stages whole rows), and lines read under
other rules than the row's (a changed datasets file, or a row written by a version that took its
digest in another form: those rows keep their digest until their payload next changes, and their
lines are parsed meanwhile).

The stored digests are read once. A run of up to :data:`DICT_ROWS` rows keeps them in a dict, read
in whatever order PostgreSQL finds them: a lookup is one hash probe. A larger run keeps them sorted
by PostgreSQL in two arrays of 64-bit halves: 16 bytes per row, a fraction of what a dict takes.
A job that says it has more records than a dict takes has its run read sorted at once; otherwise
which way is told by reading up to one more digest than a dict takes, concatenated into one value
(4 MiB at most): a run found larger is read again, sorted, without ever holding a dict. Digests are
uniform, so the first bits of a digest say where it lies: a table of where each leading-bits value
starts (one entry per four rows, a byte per row) leaves a search among a few rows instead of the
whole run. Either way the stager adds 4 bytes per row for the order of the last line that had each.

A sync reads them beside its download (:meth:`LineDigests.reading`): a thread asks PostgreSQL on a
connection of its own (so that its scan of the run overlaps the download) while the sync reads
up to :data:`AHEAD_BYTES` of the export ahead and digests those lines (no further once the run turns
out too large for a dict: its sorted read takes long, and the memory would count); the first lookup
waits for the digests, and what stopped their reading is raised there. A snapshot taken a moment
apart from the sync's own changes nothing above: the digests are read as the sync starts.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg
from sqlalchemy import Engine

from sync.cloud.download import BOM, Line

DIGEST_SIZE = 16
FETCH = 8192  # digests read per round trip
DICT_ROWS = 1 << 18  # a run of up to this many rows keeps its digests in a dict
BUCKET_ROWS = 4  # stored digests per leading-bits value, at least
_LOW_BITS = (1 << 64) - 1
_STORED = (
    "SELECT line_digest FROM observations WHERE run_id = %(run_id)s AND line_digest IS NOT NULL"
)
_SORTED = _STORED + " ORDER BY line_digest"
AHEAD_BYTES = 8 << 20  # of lines read ahead while the run's digests are read
_FIRST = f"SELECT string_agg(line_digest, ''::bytea) FROM ({_STORED} LIMIT %(most)s) AS d"  # noqa: S608 - constant SQL


class LineDigests:
    """The digests of one import's lines under its read rules, and the run's stored ones."""

    def __init__(self, rules: str) -> None:
        # the version keeps a digest of another form (of the line with its break, before) from
        # ever matching
        self._rules = hashlib.sha256(b"scrapesync lines 2\x1f" + rules.encode())
        self._high = array("Q")
        self._low = array("Q")
        self._starts = array("I", [0, 0])  # per leading-bits value, its first index
        self._shift = 64  # the leading bits of a high half: high >> shift
        self._dict: dict[bytes, int] | None = None  # digest -> index, for a small run
        self._stored: bytes | None = None  # a small run's digests, read, not yet a dict
        self._done: threading.Event | None = None  # set once a reading apart has ended
        self._failure: BaseException | None = None  # what stopped it
        self._ahead: deque[tuple[list[Line], list[bytes | None]]] = deque()  # blocks digested
        # while it went on, with their lines' digests
        self._large = False  # the run turned out too large for a dict
        self._apart: tuple[Engine, str] | None = None  # where a reading apart reads
        self.known = 0
        self._digested = 0  # lines of the export digested so far
        self._asked = 0  # lines of the export asked about so far
        self._block: list[bytes | None] = []  # the digests of the block last asked about
        self._first_known: Callable[[], None] | None = None  # told of the first line known

    def _add_sorted(self, digests: bytes) -> None:
        """Take stored digests, concatenated, in ascending order and after those taken so far."""
        halves = array("Q", digests)
        if sys.byteorder == "little":  # big-endian halves sort as the bytes do
            halves.byteswap()
        self._high.extend(halves[0::2])
        self._low.extend(halves[1::2])
        self.known = len(self._high)

    def _index(self) -> None:
        """Tell where each leading-bits value starts, once every digest is taken."""
        high, known = self._high, self.known
        bits = max(0, (known // BUCKET_ROWS).bit_length() - 1)
        self._shift = shift = 64 - bits
        self._starts = array("I", (bisect_left(high, b << shift) for b in range(1 << bits)))
        self._starts.append(known)

    @classmethod
    def reading(
        cls,
        engine: Engine,
        rules: str,
        run_id: str,
        *,
        first_known: Callable[[], None] | None = None,
        expected: int = 0,
    ) -> LineDigests:
        """The digests the run's rows hold (PostgreSQL; none elsewhere), read by a thread on a
        connection of its own while the caller goes on: the first lookup waits for them, and
        :meth:`ahead` digests the lines that come meanwhile. (A run too large for a dict is
        read sorted by that lookup, in the caller's thread, whose memory it then reuses.)
        ``first_known`` is called once, when a line is first found known. ``expected``, the
        records the job says it has: more than a dict takes, and the run is read sorted at once,
        without a first read to tell or lines read ahead meanwhile (either is a batch of memory
        the sorted read then never reuses; a guess wrong either way costs time, never a line)."""
        found = cls(rules)
        found._first_known = first_known
        if engine.dialect.name == "postgresql":
            found._done = threading.Event()
            found._apart = (engine, run_id)
            if expected > DICT_ROWS:
                found._large = True
                found._done.set()
            else:
                read = threading.Thread(target=found._read_apart, name="line-digests", daemon=True)
                read.start()
        return found

    def _read_apart(self) -> None:
        assert self._done is not None
        assert self._apart is not None
        engine, run_id = self._apart
        try:
            with engine.connect() as conn:
                raw = conn.connection.driver_connection
                assert raw is not None
                self._read_first(raw, run_id)
        except BaseException as exc:  # raised in the caller's thread, by the lookup that waits
            self._failure = exc
        finally:
            self._done.set()

    def _read_first(self, raw: psycopg.Connection[Any], run_id: str) -> bool:
        """Read no more than DICT_ROWS + 1 of the run's digests, concatenated by PostgreSQL into
        one value (16 bytes each; no row to convert one by one): whether that was all of them,
        kept for a dict; if not, the run is too large for one, and is read sorted."""
        with raw.cursor(binary=True) as cursor:
            cursor.execute(_FIRST, {"run_id": run_id, "most": DICT_ROWS + 1})
            row = cursor.fetchone()
        stored = bytes(row[0]) if row is not None and row[0] is not None else b""
        if len(stored) <= DICT_ROWS * DIGEST_SIZE:
            self._stored = stored  # made a dict by _take, in the thread that looks lines up
            return True
        self._large = True  # reading ahead stops: the sorted read takes long, and memory counts
        return False

    def _read_sorted(self, raw: psycopg.Connection[Any], run_id: str) -> None:
        """Read a large run's digests sorted, a batch at a time, into the two arrays."""
        with raw.cursor(name="line_digests_sorted", binary=True) as cursor:
            cursor.execute(_SORTED, {"run_id": run_id})
            while batch := cursor.fetchmany(FETCH):
                self._add_sorted(b"".join(digest for (digest,) in batch))
        self._index()

    def _take(self) -> None:
        """Make the dict of the digests read for a small run."""
        stored, self._stored = self._stored, None
        if stored is not None:
            self.known = len(stored) // DIGEST_SIZE
            self._dict = {
                stored[at : at + DIGEST_SIZE]: at // DIGEST_SIZE
                for at in range(0, len(stored), DIGEST_SIZE)
            }

    @property
    def pending(self) -> bool:
        """Whether the run's digests are still being read."""
        return self._done is not None

    def wait(self) -> None:
        """Wait until the run's digests are read (raise what stopped the reading)."""
        done = self._done
        if done is None:
            return
        done.wait()
        self._done = None
        if self._failure is not None:
            raise self._failure
        if self._large and self._apart is not None:
            engine, run_id = self._apart
            with engine.connect() as conn:
                raw = conn.connection.driver_connection
                assert raw is not None
                self._read_sorted(raw, run_id)
        self._take()

    def ahead(self, blocks: Iterable[list[Line]]) -> Iterator[list[Line]]:
        """The blocks of lines as they come; while the run's digests are still being read, up
        to AHEAD_BYTES of lines are read ahead and digested, so that the download goes on
        meanwhile (:meth:`marks` takes those digests)."""
        rest = iter(blocks)
        done = self._done
        if done is not None:
            held: deque[list[Line]] = deque()
            size = 0
            for block in rest:
                held.append(block)
                self._ahead.append((block, self._digests(block)))
                size += sum(len(line) for line in block if isinstance(line, bytes))
                if size >= AHEAD_BYTES or done.is_set() or self._large:
                    break
            while held:
                yield held.popleft()
        yield from rest

    def _digest(self, line: bytes) -> bytes:
        h = self._rules.copy()
        h.update(line)
        return h.digest()[:DIGEST_SIZE]

    def _digests(self, block: list[Line]) -> list[bytes | None]:
        """The digest of each line of the next block of the export (None: a skipped line); a
        byte order mark that starts the export is no part of its first line."""
        digest = self._digest
        found = [digest(line) if isinstance(line, bytes) else None for line in block]
        first = block[0] if block and not self._digested else None
        if isinstance(first, bytes) and first.startswith(BOM):
            found[0] = digest(first.removeprefix(BOM))
        self._digested += len(block)
        return found

    def marks(self, block: list[Line]) -> list[int]:
        """Per line of the next block of the export: the index of the stored digest it has, or
        -1. (Blocks are asked about in order, each once; the lines' digests are kept for
        :meth:`digest_of` until the next block.)"""
        ahead = self._ahead
        digests = ahead.popleft()[1] if ahead and ahead[0][0] is block else self._digests(block)
        self._block = digests
        self._asked += len(block)
        if self._done is not None:
            self.wait()
        if self._dict is not None:
            get = self._dict.get
            found = [get(d, -1) if d is not None else -1 for d in digests]
        elif self.known:
            index_of = self.index_of
            found = [index_of(d) if d is not None else -1 for d in digests]
        else:
            return [-1] * len(digests)
        if self._first_known is not None and max(found, default=-1) >= 0:
            told, self._first_known = self._first_known, None
            told()
        return found

    def digest_of(self, number: int) -> bytes | None:
        """The digest of line ``number`` of the export, a line of the block last asked about."""
        return self._block[number - self._asked + len(self._block) - 1]

    def index_of(self, digest: bytes) -> int:
        """The index of a digest among the stored ones, or -1."""
        self.wait()
        if self._dict is not None:
            return self._dict.get(digest, -1)
        hi, known = self._high, self.known
        value = int.from_bytes(digest, "big")
        high = value >> 64
        bucket = high >> self._shift
        i = bisect_left(hi, high, self._starts[bucket], self._starts[bucket + 1])
        if i < known and hi[i] == high:
            lo, low = self._low, value & _LOW_BITS
            while i < known and hi[i] == high:
                if lo[i] == low:
                    return i
                i += 1
        return -1
