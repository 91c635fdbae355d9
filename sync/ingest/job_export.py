"""A scraping job's export, read for its sync: compared with the task's last import, whose
outcome a byte-for-byte repeat takes over (see :mod:`sync.ingest.repeat`), or staged as it
downloads for the merge into observations (see :mod:`sync.ingest.staging`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync.bootstrap import Services
from sync.casts import PlainValues
from sync.cloud.client import CloudClient
from sync.cloud.download import Line
from sync.cloud.jobs import CloudJob
from sync.datasets.columns import columns_of
from sync.identity import RecordIdentity
from sync.ingest import records, repeat, run_rows, staging
from sync.ingest.line_digests import LineDigests
from sync.ingest.staging import UpsertCounts
from sync.ingest.store import Lease
from sync.ingest.targets import Target
from sync.models import Publication


@dataclass(frozen=True)
class Imported:
    """What an import wrote (or, repeating an import byte for byte, what that one wrote), as
    its attempt records it."""

    counts: UpsertCounts
    read: records.ExportRead
    invalid_count: int
    invalid_detail: dict[str, Any] | None
    digest: repeat.ExportDigest
    origin: str | None = None  # the import this one repeats


@dataclass(frozen=True)
class Staged:
    """An export staged (or copied or merged early) for its merge into observations."""

    stager: staging.ObservationStager
    source: staging.Source
    read: records.ExportRead
    digest: repeat.ExportDigest
    start: int | None = None  # the run's data version when the import began (PostgreSQL)
    start_groups: dict[str, Any] | None = None  # and the groups kept with it then

    def merge(self, now: datetime) -> Imported:
        """Merge the staged records, stamped ``now``."""
        counts = self.stager.merge(self.source, now=now)
        invalid = self.read.invalid
        return Imported(counts, self.read, invalid.count, invalid.as_detail(), self.digest)

    def groups_change(self, version: int) -> run_rows.GroupsChange | None:
        """How this import changed the run's rows per group (see :mod:`sync.runs.shapes`),
        when it can tell: its commit counted the run's data version up by one from the
        version it began at (no other import committed meanwhile), and it copied every row
        straight into the run it found empty, or merged them while the export downloaded."""
        stager = self.stager
        if self.start is None or version != self.start + 1:
            return None
        if not stager.keys_first and stager.copied_groups is not None:
            return run_rows.GroupsChange(self.start, replaces_all=True, wrote=stager.copied_groups)
        written = stager.written
        if written is None:
            return None
        return run_rows.GroupsChange(
            self.start,
            replaces_all=False,
            wrote=written.wrote,
            replaced=written.replaced,
            ids=None if written.ids is None else list(written.ids),
            start_groups=self.start_groups,
        )


def read_export(
    services: Services,
    session: Session,
    cloud: CloudClient,
    lease: Lease,
    job: CloudJob,
    target: Target,
    tick: Callable[[int], None],
    *,
    repeat_of_same_job: bool,
) -> Staged | Imported:
    """Download the job's export: staged for its merge, or, when it is byte for byte the
    task's last import (``repeat_of_same_job``: Cloud reports the job as it was) and that
    import's rows still hold, that import's outcome. ``tick`` gets the count of lines read."""
    rules = repeat.read_rules(
        target.dataset,
        run_id=target.run_id,
        window=target.window,
        frozen=target.frozen_partitions,
        max_record_bytes=services.settings.max_record_bytes,
        max_line_bytes=services.settings.max_record_line_bytes,
    )
    digest = repeat.ExportDigest(rules)
    last = repeat.last_import(session, lease.task_key) if repeat_of_same_job else None
    verdict: repeat.Verdict = "again"
    if last is not None:
        verdict, blocks = repeat.compare(
            cloud.export_blocks(job.id, tap=digest),
            digest,
            last,
            tick,
            vouch=functools.partial(repeat.still_stored, session, last, target.run_id),
        )
    if verdict == "again":
        digest = repeat.ExportDigest(rules)
        blocks = cloud.export_blocks(job.id, tap=digest)
    if verdict == "same" and last is not None:
        read = records.ExportRead(last.records_read, last.missing_key, last.protected)
        counts = repeat.repeated(last)
        return Imported(
            counts, read, last.invalid_records, last.invalid_detail, digest, origin=last.origin
        )
    return _stage(services, session, cloud, lease, job, target, rules, digest, blocks, tick)


def _stage(
    services: Services,
    session: Session,
    cloud: CloudClient,
    lease: Lease,
    job: CloudJob,
    target: Target,
    rules: str,
    digest: repeat.ExportDigest,
    blocks: Iterable[list[Line]],
    tick: Callable[[int], None],
) -> Staged:
    """Stage the export's records as they download (lines a row of the run was written from
    are known unchanged without parsing, see :mod:`sync.ingest.line_digests`)."""
    source = staging.Source(
        dataset=target.dataset.name,
        run_id=target.run_id,
        window=target.window,
        job_id=job.id,
        attempt_id=lease.attempt_id,
        now=services.clock(),
    )
    found = staging.run_version(session, target.run_id)
    keys_first = found.has_rows
    known = LineDigests(rules)  # every line is parsed, and digested to be stored, but:
    if keys_first and not target.frozen_partitions:
        # lines a row of the run was written from are known unchanged without parsing
        # (a recovery batch, which sets frozen partitions' records aside, reads all);
        # the run's digests are read while the stager is made
        known = LineDigests.reading(
            services.uow.engine,
            rules,
            target.run_id,
            first_known=digest.stop,
            expected=job.stored_record_count,
        )
    # read before the stager, whose copy straight in (a run with no rows yet) holds the
    # connection until the export ends
    plain = None if keys_first else _plain_values(session, target.dataset)
    stager = staging.ObservationStager(
        session, run_id=target.run_id, source=source, keys_first=keys_first
    )
    try:  # whatever fails, the copy or merge it began is cancelled before the rollback
        stager.know(known)
        read = records.stage_export(
            stager,
            cloud.iter_export(job.id, known.ahead(blocks), known=known.marks),
            RecordIdentity(target.dataset, target.window),
            frozen=target.frozen_partitions,
            max_record_bytes=services.settings.max_record_bytes,
            tick=tick,
            lines=known,
            plain=plain,
        )
    except BaseException as exc:
        stager.abort(exc)
        raise
    return Staged(stager, source, read, digest, found.version, found.groups)


def _plain_values(session: Session, dataset: Dataset) -> PlainValues | None:
    """The plain values of the dataset's columns, as its tables hold them or will (the registry's,
    else its datasets file's; with neither, every field is a text column), for the records of
    a dataset never published: only its first publication reads the marks (a later one finds
    its changed rows first, and checks those)."""
    published = select(exists().where(Publication.dataset == dataset.name))
    if session.execute(published).scalar_one():
        return None
    return PlainValues.of(columns_of(session, dataset.name, dataset.columns))
