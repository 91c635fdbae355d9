"""The work of a sync and its verdicts: runs, scraping jobs, the inbox, sync tasks and their
attempts, observations and what was set aside, partition verdicts, run profiles, launches,
maintenance passes and operator decisions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from sync.models.base import Base, Payload, ScrubbedPayload, ScrubbedText, utcnow
from sync.states import (
    AttemptOutcome,
    LaunchState,
    RunState,
    TaskState,
)


class Run(Base):
    """One intended collection: a dataset over a collection window."""

    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    dataset: Mapped[str] = mapped_column(String(100), index=True)
    collection_window: Mapped[str] = mapped_column(String(40))
    sitemap_id: Mapped[int | None] = mapped_column(BigInteger)
    sitemap_name: Mapped[str | None] = mapped_column(String(200))
    config_version: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(20), default=RunState.COLLECTING)
    reasons: Mapped[list[Any]] = mapped_column(ScrubbedPayload, default=list)
    revision: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # counted up by each committed import of the run; the version its last verdict judged
    data_version: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    evaluated_version: Mapped[int | None] = mapped_column(Integer)
    # the data version whose rows the run's partition verdicts judge: a row written by an import
    # that made this version or an earlier one takes its partition's verdict, a later one's is
    # pending (sync.acceptance.row_states)
    judged_version: Mapped[int | None] = mapped_column(Integer)
    # the run's rows at data version v per partition, stored shape and attempt that last wrote
    # them: {"version": v, "groups": [[partition, shape, attempt_id, rows], ...]} (the imports
    # and evaluations of sync.runs.shapes keep it; an evaluation trusts it while v is the run's
    # version, instead of a pass over the run)
    row_groups: Mapped[dict[str, Any] | None]
    evaluated_at: Mapped[datetime | None]
    accepted_at: Mapped[datetime | None]
    published_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    # an operator's decision (accept, reject, cancel), which every later evaluation keeps
    decision: Mapped[str | None] = mapped_column(String(20))
    decided_by: Mapped[str | None] = mapped_column(String(20))
    decision_reason: Mapped[str | None] = mapped_column(ScrubbedText)
    decided_at: Mapped[datetime | None]
    # evaluations that raised since the last one that finished; N of them quarantine the run
    evaluation_failures: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # what most likely broke and what to run next, kept with a rejection (sync.runs.diagnosis)
    diagnosis: Mapped[dict[str, Any] | None] = mapped_column(ScrubbedPayload)

    __table_args__ = (UniqueConstraint("dataset", "collection_window"),)


class ScrapingJob(Base):
    """A Cloud scraping job as last read from Cloud."""

    __tablename__ = "scraping_jobs"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.run_id"), index=True)
    recovery_batch: Mapped[str | None] = mapped_column(String(200))
    sitemap_id: Mapped[int | None] = mapped_column(BigInteger)
    sitemap_name: Mapped[str | None] = mapped_column(String(200))
    custom_id: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str | None] = mapped_column(String(40))
    jobs_scheduled: Mapped[int] = mapped_column(BigInteger, default=0)
    jobs_executed: Mapped[int] = mapped_column(BigInteger, default=0)
    jobs_failed: Mapped[int] = mapped_column(BigInteger, default=0)
    jobs_empty: Mapped[int] = mapped_column(BigInteger, default=0)
    jobs_no_value: Mapped[int] = mapped_column(BigInteger, default=0)
    stored_record_count: Mapped[int] = mapped_column(BigInteger, default=0)
    time_created: Mapped[datetime | None]
    first_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    data_quality: Mapped[dict[str, Any] | None]
    problematic_urls: Mapped[list[Any] | None] = mapped_column(Payload)
    quality_checked_at: Mapped[datetime | None]


class Notification(Base):
    """The inbox: every notification Cloud sent, stored raw before anything else happens."""

    __tablename__ = "notifications"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    received_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)  # retention
    remote_addr: Mapped[str | None] = mapped_column(String(64))
    form: Mapped[dict[str, Any]] = mapped_column(ScrubbedPayload)
    job_id: Mapped[int | None] = mapped_column(BigInteger, index=True)
    status: Mapped[str | None] = mapped_column(String(40))
    task_key: Mapped[str | None] = mapped_column(String(100))
    outcome: Mapped[str] = mapped_column(String(200), default="stored")


class SyncTask(Base):
    """The wish to have one Cloud job's data in SQL; one per job, stable across retries."""

    __tablename__ = "sync_tasks"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    task_key: Mapped[str] = mapped_column(String(100), unique=True)
    job_id: Mapped[int] = mapped_column(BigInteger)
    run_id: Mapped[str | None] = mapped_column(String(200), index=True)
    state: Mapped[str] = mapped_column(String(20), default=TaskState.PENDING, index=True)
    requested_generation: Mapped[int] = mapped_column(Integer, default=1)
    claimed_generation: Mapped[int] = mapped_column(Integer, default=0)
    synced_generation: Mapped[int] = mapped_column(Integer, default=0)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    failure_count: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_until: Mapped[datetime | None]
    lease_token: Mapped[int] = mapped_column(Integer, default=0)
    enqueued_at: Mapped[datetime | None]
    synced_fingerprint: Mapped[str | None] = mapped_column(String(64))
    last_error_class: Mapped[str | None] = mapped_column(String(100))
    last_error: Mapped[str | None] = mapped_column(ScrubbedText)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Attempt(Base):
    """One try at a sync task: who, when, what Cloud said, what was written."""

    __tablename__ = "attempts"

    attempt_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    task_key: Mapped[str] = mapped_column(String(100), index=True)
    job_id: Mapped[int] = mapped_column(BigInteger)
    generation: Mapped[int] = mapped_column(Integer)
    lease_token: Mapped[int] = mapped_column(Integer)
    recovery_batch: Mapped[str | None] = mapped_column(String(200))
    worker: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)  # retention
    finished_at: Mapped[datetime | None]
    cloud_status: Mapped[str | None] = mapped_column(String(40))
    http_status: Mapped[int | None] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(20), default=AttemptOutcome.RUNNING)
    error_class: Mapped[str | None] = mapped_column(String(100))
    error: Mapped[str | None] = mapped_column(ScrubbedText)
    records_read: Mapped[int] = mapped_column(Integer, default=0)
    inserted: Mapped[int] = mapped_column(Integer, default=0)
    updated: Mapped[int] = mapped_column(Integer, default=0)
    unchanged: Mapped[int] = mapped_column(Integer, default=0)
    missing_key: Mapped[int] = mapped_column(Integer, default=0)
    protected: Mapped[int] = mapped_column(Integer, default=0)
    duplicate_keys: Mapped[int] = mapped_column(Integer, default=0)
    conflicting_duplicates: Mapped[int] = mapped_column(Integer, default=0)
    invalid_records: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # the records set aside: {"partitions": {name: {reason: n}}, "unplaced": {reason: n},
    # "lines": [{"line", "reason", "detail", "partition"}, ...] (the first few)}
    invalid_detail: Mapped[dict[str, Any] | None] = mapped_column(ScrubbedPayload)
    # what an import read (see sync.ingest.repeat): the digest of the export's lines and the rules
    # they
    # were read under, the digest of their first MiB, and for a byte-identical repeat the
    # import whose outcome it repeats
    export_digest: Mapped[str | None] = mapped_column(String(64))
    export_prefix: Mapped[str | None] = mapped_column(String(64))
    repeat_of: Mapped[str | None] = mapped_column(String(36))


class Observation(Base):
    """One real thing seen in one collection window; written once, rewritten only on change."""

    __tablename__ = "observations"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    observation_key: Mapped[str] = mapped_column(String(64), unique=True)
    dataset: Mapped[str] = mapped_column(String(100))
    entity_key: Mapped[str] = mapped_column(Text)
    run_id: Mapped[str] = mapped_column(String(200))
    collection_window: Mapped[str] = mapped_column(String(40))
    partition: Mapped[str | None] = mapped_column(String(200))
    start_url: Mapped[str | None] = mapped_column(Text)
    payload: Mapped[dict[str, Any]]
    payload_hash: Mapped[str] = mapped_column(String(64))
    # the export line it was last written from, keyed by the read rules (sync.ingest.line_digests)
    line_digest: Mapped[bytes | None] = mapped_column(LargeBinary)
    source_job_id: Mapped[int] = mapped_column(BigInteger)
    # the attempt whose import last wrote it: with the data version that import made
    # (RunImport), it says whether the run's verdict has judged the row (sync.acceptance.row_states)
    source_attempt_id: Mapped[str] = mapped_column(String(36))
    # the record's shape as the last evaluation (or the sync that wrote it) found it, when it
    # had no defect (its rules' fingerprint, then the fields it fills and leaves empty); a
    # merge after the download forgets it
    shape: Mapped[str | None] = mapped_column(Text)
    # the fingerprint of the plain values (sync.casts.PlainValues) every value of the record
    # was found to be when it was copied in, read so by a first publication; a merge forgets it
    plain_for: Mapped[str | None] = mapped_column(String(16))
    first_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_changed_at: Mapped[datetime] = mapped_column(default=utcnow)

    # Pages are filled: a verdict writes no row (it is kept per partition, for the rows of the
    # imports it judged), so a pass over a run reads as few pages as its rows need.
    __table_args__ = (Index("ix_observations_run_partition", "run_id", "partition"),)


class RunImport(Base):
    """A committed import of a run: the attempt that wrote it and the data version its commit
    made. Kept as long as the run (an attempt's own row may be pruned before its rows go)."""

    __tablename__ = "run_imports"

    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    attempt_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    # the ids of the rows it wrote, when it kept them (sync.runs.shapes: while its rows are
    # pending, the run's next evaluation finds them here instead of passing over the run)
    written: Mapped[list[int] | None] = mapped_column(Payload)


class PartitionVerdict(Base):
    """Whether one partition of a run passed acceptance, with the reasons and numbers."""

    __tablename__ = "partition_verdicts"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"))
    partition: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(20))
    records: Mapped[int] = mapped_column(Integer, default=0)
    reasons: Mapped[list[Any]] = mapped_column(ScrubbedPayload, default=list)
    evaluated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("run_id", "partition"),)


class RunProfile(Base):
    """What an accepted run held, kept when it was accepted: the history later runs of its
    dataset are judged against (records per partition, each field's fill rate in percent over
    the run and per partition, the fields seen)."""

    __tablename__ = "run_profiles"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"), primary_key=True)
    dataset: Mapped[str] = mapped_column(String(100), index=True)
    revision: Mapped[int] = mapped_column(Integer)
    records: Mapped[int] = mapped_column(Integer)
    partitions: Mapped[dict[str, Any]]
    fill_rates: Mapped[dict[str, Any]]
    partition_fill_rates: Mapped[dict[str, Any]]
    fields: Mapped[list[Any]] = mapped_column(Payload)
    profiled_at: Mapped[datetime] = mapped_column(default=utcnow)


class SetAsideRecord(Base):
    """A record of a run set aside at import (a NUL, an overlong value...) whose entity is
    known: its entity keeps its last published row, flagged stale, and is never reported
    removed for it."""

    __tablename__ = "set_aside_records"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(200))
    dataset: Mapped[str] = mapped_column(String(100))
    entity_key: Mapped[str] = mapped_column(Text)
    partition: Mapped[str | None] = mapped_column(String(200))
    job_id: Mapped[int] = mapped_column(BigInteger)
    line: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(50))
    # the values at fault: [{"field", "reason", "detail"}]
    values: Mapped[list[Any]] = mapped_column(ScrubbedPayload, default=list)
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("run_id", "entity_key"),)


class Launch(Base):
    """The intent to start a Cloud job for a run (a launch or a recovery batch), kept before the
    call so that an uncertain create is never repeated blindly."""

    __tablename__ = "launches"

    batch_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"))
    kind: Mapped[str] = mapped_column(String(20))
    partition: Mapped[str | None] = mapped_column(String(200))
    start_urls: Mapped[list[Any] | None] = mapped_column(Payload)
    manifest: Mapped[dict[str, Any] | None]
    state: Mapped[str] = mapped_column(String(20), default=LaunchState.INTENDED)
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_error: Mapped[str | None] = mapped_column(ScrubbedText)


class MaintenanceRun(Base):
    """A sweep or reconcile pass and what it found and did."""

    __tablename__ = "maintenance_runs"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(20))
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    summary: Mapped[dict[str, Any]] = mapped_column(ScrubbedPayload, default=dict)


class OperatorDecision(Base):
    """One decision an operator took (accept, reject, cancel a run; reset a dataset's
    baseline), kept with its reason and time."""

    __tablename__ = "operator_decisions"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    dataset: Mapped[str] = mapped_column(String(100), index=True)
    run_id: Mapped[str | None] = mapped_column(String(200), index=True)
    action: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(ScrubbedText)
    decided_by: Mapped[str] = mapped_column(String(20), default="operator")
    decided_at: Mapped[datetime] = mapped_column(default=utcnow)
