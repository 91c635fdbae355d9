"""The byte-identical repeat: a sync of an export that is byte for byte the one its task last
imported, read under the same rules, commits that import's outcome without parsing or staging
a record (a forced repeat, ``scrapesync sync JOB_ID --force``, of a job Cloud reports as it was).

Every import records the digest of what it read: SHA-256 over the rules the lines were read
under (the dataset's whole definition, run, window, frozen partitions, size limits and
:data:`IMPORT_RULES`) followed by the export's body as downloaded, gunzipped, byte for byte
(lines that were skipped, too long or not UTF-8, included). The body is hashed a piece at a
time as it comes, not a line at a time: a repeat reads no line it does not need. It also keeps
the digest of the body's first MiB, so that an export which changed is told from the last one
after its first MiB. An import that finds a line known (:mod:`sync.ingest.line_digests`) counts its
record unchanged, unless a later line of the key wins, and no repeat goes back to an import that
counted one unchanged (below): it hashes no more than the first MiB and records no digest.

A repeat is taken only where it is provably what a full import would do, in the transaction that
commits it:

- the task's last import (by lease token) recorded the same digest;
- the import it goes back to wrote every record it staged (it found none unchanged), and every
  row it wrote still carries its attempt id in ``source_attempt_id``: a later rewrite of any of
  them, by any sync, would have put another attempt's id there.

A full import would then find every staged payload unchanged: the attempt commits with the same
records read, invalid, missing, protected and duplicate counts, nothing inserted or updated, and
every staged key unchanged. Otherwise the export is imported in full; one that differs only
after its first MiB is downloaded again for that (its lines were not kept).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync.cloud.download import Line
from sync.db import planner_method_off
from sync.ingest.staging import UpsertCounts
from sync.models import Attempt, Observation
from sync.states import AttemptOutcome

IMPORT_RULES = 1  # raise it when identity or staging rules change what the same lines import as
PREFIX_BYTES = 1 << 20
TICK_EVERY = 1000


def read_rules(
    dataset: Dataset,
    *,
    run_id: str,
    window: str,
    frozen: Iterable[str],
    max_record_bytes: int,
    max_line_bytes: int,
) -> str:
    """Everything besides the lines themselves that decides what an import of them writes."""
    rules = [
        IMPORT_RULES,
        repr(dataset),
        run_id,
        window,
        sorted(frozen),
        max_record_bytes,
        max_line_bytes,
    ]
    return json.dumps(rules, ensure_ascii=False)


class ExportDigest:
    """The running SHA-256 of the read rules and the body of one download (a
    :class:`~sync.cloud.download.PieceTap`)."""

    def __init__(self, rules: str) -> None:
        # the version keeps a digest of another form (per line, before) from ever matching
        self._rules = hashlib.sha256(b"scrapesync export 2\x1f" + rules.encode() + b"\x1f")
        self.stopped = False  # the import found a line known: no more than the prefix counts
        self.restart()

    def restart(self) -> None:
        """Forget the body seen so far (the download is tried again from its start)."""
        self._hash = self._rules.copy()
        self._size = 0
        self._prefix: str | None = None

    def stop(self) -> None:
        """Hash no more of the body than its first MiB: the import found a line known, so it
        counts a record unchanged (unless a later line of that key wins), and such an import is
        never a repeat's origin (:func:`still_stored`). It records no digest, only the
        prefix's."""
        self.stopped = True

    def feed(self, data: bytes) -> None:
        """Hash the next piece of the body; the digest of its first MiB is taken on the way."""
        if self._prefix is None and self._size + len(data) >= PREFIX_BYTES:
            cut = PREFIX_BYTES - self._size
            piece = memoryview(data)
            self._hash.update(piece[:cut])
            self._prefix = self._hash.hexdigest()
            if not self.stopped:
                self._hash.update(piece[cut:])
        elif self._prefix is None or not self.stopped:
            self._hash.update(data)
        self._size += len(data)

    @property
    def prefix_reached(self) -> bool:
        """Whether the body hashed so far reaches its first MiB."""
        return self._prefix is not None

    def digest(self) -> str:
        """The digest of the rules and the body so far."""
        return self._hash.hexdigest()

    def recorded(self) -> str | None:
        """What the import records as its export's digest: None if it stopped hashing."""
        return None if self.stopped else self.digest()

    def prefix(self) -> str:
        """The digest of the rules and the body's first MiB (all of it, if shorter)."""
        return self._prefix if self._prefix is not None else self.digest()


@dataclass(frozen=True)
class LastImport:
    """The task's last import (digests), and the full import it goes back to (its outcome)."""

    digest: str
    prefix: str
    origin: str
    counts: UpsertCounts
    records_read: int
    missing_key: int
    protected: int
    invalid_records: int
    invalid_detail: dict[str, Any] | None


def last_import(session: Session, task_key: str) -> LastImport | None:
    """The task's last committed import, if it recorded its digest (an import that found a
    line known did not: no repeat goes back to it), or None."""
    a = Attempt.__table__.c
    last = session.execute(
        select(a.export_digest, a.export_prefix, a.repeat_of, a.attempt_id)
        .where(
            a.task_key == task_key,
            a.outcome == AttemptOutcome.COMMITTED,
            or_(a.export_digest.is_not(None), a.export_prefix.is_not(None)),
        )
        .order_by(a.lease_token.desc())
        .limit(1)
    ).one_or_none()
    if last is None or last.export_prefix is None or last.export_digest is None:
        return None
    origin = session.execute(
        select(Attempt.__table__).where(a.attempt_id == (last.repeat_of or last.attempt_id))
    ).one_or_none()
    if origin is None:
        return None
    return LastImport(
        digest=last.export_digest,
        prefix=last.export_prefix,
        origin=origin.attempt_id,
        counts=UpsertCounts(
            staged=origin.inserted + origin.updated + origin.unchanged + origin.duplicate_keys,
            inserted=origin.inserted,
            updated=origin.updated,
            unchanged=origin.unchanged,
            duplicate_keys=origin.duplicate_keys,
            conflicting_duplicates=origin.conflicting_duplicates,
        ),
        records_read=origin.records_read,
        missing_key=origin.missing_key,
        protected=origin.protected,
        invalid_records=origin.invalid_records,
        invalid_detail=origin.invalid_detail,
    )


def still_stored(session: Session, last: LastImport, run_id: str) -> bool:
    """Whether every row of the last import's origin still holds what it wrote: it found no
    staged record unchanged, and as many rows carry its attempt id as it wrote."""
    if last.counts.unchanged:
        return False
    written = last.counts.inserted + last.counts.updated
    o = Observation.__table__.c
    # Read through the run's index: with a few windows kept, PostgreSQL takes the run for a
    # share of the table that a sequential scan reads as fast, and reads every window instead
    # (the run's rows sit together, on a tenth of the pages or fewer).
    with planner_method_off(session, "enable_seqscan"):
        kept = session.execute(
            select(func.count())
            .select_from(Observation)
            .where(o.run_id == run_id, o.source_attempt_id == last.origin)
        ).scalar_one()
    return int(kept) == written


def repeated(last: LastImport) -> UpsertCounts:
    """What a full import of the same lines would count now: every staged key unchanged."""
    c = last.counts
    return UpsertCounts(
        staged=c.staged,
        inserted=0,
        updated=0,
        unchanged=c.inserted + c.updated,
        duplicate_keys=c.duplicate_keys,
        conflicting_duplicates=c.conflicting_duplicates,
    )


Verdict = Literal["same", "changed", "again"]


def compare(
    blocks: Iterable[list[Line]],
    digest: ExportDigest,
    last: LastImport,
    tick: Callable[[int], None],
    *,
    vouch: Callable[[], bool],
) -> tuple[Verdict, Iterator[list[Line]]]:
    """Read the download (its lines a gunzipped piece at a time, its body hashed by ``digest``
    as it comes) as far as needed to tell it from the last import's: "same" when it is byte
    for byte identical (read to its end) and ``vouch()`` says the last import's rows still hold
    what it wrote; "changed" with every piece's lines from the first (those read so far kept,
    the rest still streaming); "again" when it differs only after its first MiB (those lines
    were not kept). ``vouch`` is asked only once the first MiB matches: an export that changed
    early never pays for it. ``tick`` gets the count of lines at every thousand."""
    rest = iter(blocks)
    head: list[list[Line]] = []
    for block in rest:
        head.append(block)
        if digest.prefix_reached:
            break
    if not digest.prefix_reached:  # the whole export is shorter than a MiB
        same = digest.digest() == last.digest and vouch()
        return ("same", iter(())) if same else ("changed", iter(head))
    if digest.prefix() != last.prefix or not vouch():
        return "changed", itertools.chain(head, rest)
    count = sum(map(len, head))
    for block in rest:
        before, count = count, count + len(block)
        for mark in range(before // TICK_EVERY + 1, count // TICK_EVERY + 1):
            tick(mark * TICK_EVERY)
    return ("same" if digest.digest() == last.digest else "again"), iter(())
