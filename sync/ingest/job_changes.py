"""Whether a Cloud job changed since our last sync of it: what Cloud reports of the job now
(its status, page counters and stored records; Cloud's "Continue" changes them) compared with
what that sync recorded. The sync task keeps a fingerprint of those facts, with the run the job
went to and its scraping duration; the scraping job's row keeps the counters themselves."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sync.cloud.jobs import CloudJob

# what Cloud reports of a job that a sync depends on, as the scraping job's row keeps it
COUNTERS = (
    "status",
    "jobs_scheduled",
    "jobs_executed",
    "jobs_failed",
    "jobs_empty",
    "jobs_no_value",
    "stored_record_count",
)


def job_fingerprint(job: CloudJob, run_id: str) -> str:
    """What a sync of ``job`` into ``run_id`` depends on, as Cloud reports it: a job whose
    fingerprint is unchanged since its last committed sync has nothing new to download."""
    facts = [run_id, *(getattr(job, name) for name in COUNTERS), job.scraping_duration]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()


def changed_since(
    job: CloudJob, synced: str | Mapping[str, Any] | None, *, run_id: str | None = None
) -> bool:
    """Whether Cloud reports ``job`` otherwise than our last sync of it recorded it: ``synced``
    is the fingerprint its sync task keeps (of the job synced into ``run_id``), or the job's
    row in scraping_jobs; None when no sync recorded it."""
    if synced is None:
        return True
    if isinstance(synced, str):
        assert run_id is not None, "a fingerprint is of the job synced into a run"
        return job_fingerprint(job, run_id) != synced
    return any(synced[name] != getattr(job, name) for name in COUNTERS)
