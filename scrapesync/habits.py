"""The shapes of results for ``--json``, and ``--out -``: what a shell user pipes on."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sync.datasets.export import ExportResult
    from sync.ingest.tasks import SyncResult
    from sync.runs.evaluation import Evaluation

STDOUT = "-"


def sync_json(result: SyncResult, verdict: Evaluation | None) -> dict[str, Any]:
    """``scrapesync sync --json``: the attempt's outcome and counts, and the run's verdict."""
    values: dict[str, Any] = {
        "task_key": result.task_key,
        "outcome": result.outcome,
        "state": result.state,
        "run_id": result.run_id,
        "records_read": result.records_read,
        "missing_key": result.missing_key,
        "invalid": result.invalid,
        "counts": dataclasses.asdict(result.counts) if result.counts is not None else None,
        "next_attempt_at": result.next_attempt_at,
        "error": result.error,
        "verdict": None,
    }
    if verdict is not None:
        values["verdict"] = {
            "run_id": verdict.run_id,
            "state": verdict.state,
            "outcome": verdict.outcome,
            "revision": verdict.revision,
            "events": list(verdict.events),
            "reasons": list(verdict.reasons),
        }
    return values


def export_json(result: ExportResult) -> dict[str, Any]:
    """``scrapesync export --json``: where the file went and what it holds."""
    return {
        "dataset": result.dataset,
        "run_id": result.run_id,
        "revision": result.revision,
        "format": result.format,
        "path": str(result.path),
        "manifest_path": str(result.manifest_path),
        "records": result.records,
        "sha256": result.sha256,
        "partitions": result.partitions,
    }


def export_to_stdout(write: Callable[[Path], ExportResult]) -> ExportResult:
    """Run an export into a scratch folder and copy the file to standard output (the manifest
    describes a file that is not kept, so it is not kept either)."""
    with tempfile.TemporaryDirectory(prefix="scrapesync-export-") as folder:
        result = write(Path(folder))
        with result.path.open("rb") as handle:
            shutil.copyfileobj(handle, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    return result
