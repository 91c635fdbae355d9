"""Exports of a dataset: the published run (or a named accepted run) written from the database,
one line per observation in a stable order, under a versioned file name, with a manifest (run id,
revision, counts, hashes, time). Only observations of passing partitions are written:
quarantined rows never appear in an export, and a run that was not accepted is refused.

Both formats carry the dataset's typed columns, as its tables do: ``entity_key`` first, then
each column in the tables' order (the datasets file's; for a dataset that names none, one text
column per field). A CSV header is those column names; a JSON Lines line is one object keyed
by them, with numbers as JSON numbers and times as ISO 8601 text. A value that fails its cast
is empty (CSV) or null (JSON); the manifest counts the failures per column.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from config.columns import Column
from sync.acceptance import row_states
from sync.acceptance.facts import NO_PARTITION
from sync.bootstrap import Services
from sync.casts import cast_record, to_json
from sync.datasets.columns import columns_of
from sync.models import Observation, PartitionVerdict, Publication, Run
from sync.states import PartitionState, RunState

FORMATS = ("jsonl", "csv")
FORMULA_STARTS = frozenset("=+-@\t\r")
PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
EXPORTABLE = (RunState.ACCEPTED, RunState.PUBLISHED)
PROGRESS_EVERY = 1000  # rows between two progress reports
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class ExportError(Exception):
    """A dataset or run cannot be exported; the message names the dataset, the run and why."""


@dataclass(frozen=True)
class ExportResult:
    """Where an export was written and what it holds."""

    dataset: str
    run_id: str
    revision: int
    format: str
    path: Path
    manifest_path: Path
    records: int
    sha256: str
    partitions: dict[str, int]


def export_dataset(
    services: Services,
    dataset: str,
    *,
    run_id: str | None = None,
    fmt: str = "jsonl",
    out: Path | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> ExportResult:
    """Write the dataset's published run (or ``run_id``) to ``out`` (default: the export dir);
    ``on_progress(written, total)`` hears how far it has come."""
    configured = services.datasets.by_name.get(dataset)
    with services.uow.begin() as session:
        return write_export(
            session,
            dataset=dataset,
            declared=configured.columns if configured is not None else (),
            run_id=run_id,
            fmt=fmt,
            out=out if out is not None else services.settings.export_dir,
            now=services.clock(),
            on_progress=on_progress,
        )


def file_stem(dataset: str, run_id: str, revision: int) -> str:
    """The versioned name of an export, without its extension."""
    return f"{_UNSAFE.sub('_', dataset)}.{_UNSAFE.sub('_', run_id)}.r{revision}"


def write_export(
    session: Session,
    *,
    dataset: str,
    run_id: str | None,
    fmt: str,
    declared: tuple[Column, ...] = (),
    out: Path,
    now: datetime,
    on_progress: Callable[[int, int], None] | None = None,
) -> ExportResult:
    """Write an export inside the caller's transaction (a consistent snapshot of the run), in
    the columns the dataset's tables hold (before they are built: ``declared``, or one per
    field)."""
    if fmt not in FORMATS:
        raise ExportError(f"format must be one of {FORMATS}, got {fmt!r}")
    target = _exported_run(session, dataset, run_id)
    run_id, run = target.run_id, target.run
    path, manifest_path = _paths(out, file_stem(dataset, run_id, run.revision), fmt)
    total = _valid_count(session, run_id) if on_progress is not None else 0
    columns = columns_of(session, dataset, declared, lambda: _fields(session, run_id))
    rows = _Rows(session, run_id, columns, on_progress=on_progress, total=total)
    try:
        header = ["entity_key", *(c.name for c in columns)]
        if fmt == "jsonl":
            _write_file(path, lambda handle: _write_jsonl(handle, iter(rows)))
        else:
            _write_file(path, lambda handle: _write_csv(handle, header, iter(rows)))
        file_hash, size = _file_sha256(path)
        manifest = _manifest(
            session, target, rows, columns, fmt=fmt, path=path, file=(file_hash, size), now=now
        )
        write_atomically(
            manifest_path, (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()
        )
    except OSError as exc:
        raise ExportError(
            f"cannot write the export of run {run_id!r} to {path}: {exc.strerror or exc}"
        ) from None
    return ExportResult(
        dataset=dataset,
        run_id=run_id,
        revision=run.revision,
        format=fmt,
        path=path,
        manifest_path=manifest_path,
        records=rows.records,
        sha256=file_hash,
        partitions=dict(sorted(rows.partitions.items())),
    )


@dataclass(frozen=True)
class _Target:
    """The run an export writes, and whether it is its dataset's published run."""

    dataset: str
    run_id: str
    run: Run
    published: bool


def _exported_run(session: Session, dataset: str, run_id: str | None) -> _Target:
    """The run to export: ``run_id``, else the published one; only an accepted run of this
    dataset is exported."""
    current = session.execute(
        select(Publication.run_id).where(Publication.dataset == dataset, Publication.is_current)
    ).scalar_one_or_none()
    if run_id is None:
        if current is None:
            raise ExportError(f"dataset {dataset!r} has no published run yet")
        run_id = current
    run = session.get(Run, run_id)
    if run is None or run.dataset != dataset:
        raise ExportError(f"dataset {dataset!r} has no run {run_id!r}")
    if run.state not in EXPORTABLE:
        raise ExportError(
            f"run {run_id!r} of dataset {dataset!r} is {run.state}: only accepted runs are exported"
        )
    return _Target(dataset, run_id, run, published=current == run_id)


def _paths(out: Path, stem: str, fmt: str) -> tuple[Path, Path]:
    """The export's file and its manifest: versioned names in a folder, or beside a named file.
    A CSV file's manifest says so in its name (``….csv.manifest.json``), so that the CSV of a
    run written where its JSON Lines are (a file destination's folder) never replaces theirs."""
    manifest = f"{'.csv' if fmt == 'csv' else ''}.manifest.json"
    if out.is_dir() or not out.suffix:
        return out / f"{stem}.{fmt}", out / f"{stem}{manifest}"
    return out, out.with_name(f"{out.stem}{manifest}")


class _Rows:
    """The run's exportable rows in the dataset's columns, counted while they are written:
    records per partition, cast failures per column, a digest over their payload hashes."""

    def __init__(
        self,
        session: Session,
        run_id: str,
        columns: tuple[Column, ...],
        *,
        on_progress: Callable[[int, int], None] | None,
        total: int,
    ) -> None:
        self.session, self.run_id, self.columns = session, run_id, columns
        self.on_progress, self.total = on_progress, total
        self.partitions: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.digest = hashlib.sha256()

    @property
    def records(self) -> int:
        """Rows written so far."""
        return sum(self.partitions.values())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Each row as ``entity_key`` then the typed columns, reporting progress as it goes."""
        written = 0
        for entity_key, partition, payload, payload_hash in _valid_rows(self.session, self.run_id):
            name = partition if partition is not None else NO_PARTITION
            self.partitions[name] = self.partitions.get(name, 0) + 1
            self.digest.update(payload_hash.encode())
            values, failed = cast_record(self.columns, payload)
            for failure in failed:
                self.failures[failure.column] = self.failures.get(failure.column, 0) + 1
            yield {"entity_key": entity_key, **values}
            written += 1
            if self.on_progress is not None and written % PROGRESS_EVERY == 0:
                self.on_progress(written, self.total)
        if self.on_progress is not None:
            self.on_progress(written, self.total)


def _manifest(
    session: Session,
    target: _Target,
    rows: _Rows,
    columns: tuple[Column, ...],
    *,
    fmt: str,
    path: Path,
    file: tuple[str, int],
    now: datetime,
) -> dict[str, Any]:
    """What an export holds, beside it: run, revision, counts, hashes and times."""
    run = target.run
    quarantined = sorted(
        session.execute(
            select(PartitionVerdict.partition).where(
                PartitionVerdict.run_id == target.run_id,
                PartitionVerdict.state == PartitionState.QUARANTINED,
            )
        ).scalars()
    )
    return {
        "dataset": target.dataset,
        "run_id": target.run_id,
        "collection_window": run.collection_window,
        "revision": run.revision,
        "state": run.state,
        "is_published": target.published,
        "format": fmt,
        "file": path.name,
        "records": rows.records,
        "partitions": dict(sorted(rows.partitions.items())),
        "quarantined_partitions": quarantined,
        "sha256": file[0],
        "bytes": file[1],
        "records_sha256": rows.digest.hexdigest(),
        "columns": [{"name": c.name, "field": c.field, "type": c.type} for c in columns],
        "cast_failures": dict(sorted(rows.failures.items())),
        "accepted_at": run.accepted_at.isoformat() if run.accepted_at else None,
        "published_at": run.published_at.isoformat() if run.published_at else None,
        "generated_at": now.isoformat(),
    }


def _valid_rows(session: Session, run_id: str) -> Iterator[tuple[str, str | None, Any, str]]:
    """The run's exportable observations in a stable order, the same on every database."""
    collation = "C" if session.get_bind().dialect.name == "postgresql" else "BINARY"
    stmt = (
        select(
            Observation.entity_key,
            Observation.partition,
            Observation.payload,
            Observation.payload_hash,
        )
        .where(row_states.valid(session, run_id))
        .order_by(Observation.entity_key.collate(collation), Observation.observation_key)
        .execution_options(yield_per=2000)
    )
    for row in session.execute(stmt):
        yield row.entity_key, row.partition, row.payload, row.payload_hash


def _valid_count(session: Session, run_id: str) -> int:
    return session.execute(
        select(func.count()).select_from(Observation).where(row_states.valid(session, run_id))
    ).scalar_one()


def _fields(session: Session, run_id: str) -> list[str]:
    """Every field of the run's exportable records (the columns of a dataset that names none)."""
    seen: dict[str, None] = {}
    for _key, _partition, payload, _hash in _valid_rows(session, run_id):
        seen.update(dict.fromkeys(payload))
    return sorted(seen)


def _write_jsonl(handle: IO[bytes], rows: Iterator[dict[str, Any]]) -> None:
    for values in rows:
        typed = {name: to_json(value) for name, value in values.items()}
        line = json.dumps(typed, separators=(",", ":"), ensure_ascii=False)
        handle.write(line.encode() + b"\n")


def neutralise(text: str) -> str:
    """A CSV cell a spreadsheet never runs as a formula: text that starts with ``=``, ``+``,
    ``-``, ``@``, TAB or CR gets a leading single quote (OWASP's advice); a plain number stays
    as it is, since a spreadsheet reads it as a number."""
    if text[:1] in FORMULA_STARTS and not PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


def _cell(value: Any) -> str:
    """A typed value as CSV text: numbers in plain decimal notation, true/false, ISO 8601
    times, JSON for a json column; NULL is an empty cell."""
    if value is None:
        return ""
    if isinstance(value, str):
        return neutralise(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, datetime):
        return str(to_json(value))
    if isinstance(value, int):
        return str(value)
    return neutralise(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def _write_csv(handle: IO[bytes], columns: list[str], rows: Iterator[dict[str, Any]]) -> None:
    text = io.TextIOWrapper(handle, encoding="utf-8", newline="")
    writer = csv.writer(text)
    writer.writerow([neutralise(c) for c in columns])
    for values in rows:
        writer.writerow([_cell(values.get(c)) for c in columns])
    text.flush()
    text.detach()


def _write_file(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""

    def write(handle: IO[bytes]) -> None:
        handle.write(data)

    _write_file(path, write)


def _file_sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
