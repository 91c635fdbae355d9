"""Initial schema: runs, jobs, inbox, sync tasks, attempts, observations, outbox, publications.

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-02 16:33:26.526573
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "attempts",
        sa.Column("attempt_id", sa.String(length=36), nullable=False),
        sa.Column("task_key", sa.String(length=100), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.Integer(), nullable=False),
        sa.Column("recovery_batch", sa.String(length=200), nullable=True),
        sa.Column("worker", sa.String(length=200), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("cloud_status", sa.String(length=40), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("error_class", sa.String(length=100), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("records_read", sa.Integer(), nullable=False),
        sa.Column("inserted", sa.Integer(), nullable=False),
        sa.Column("updated", sa.Integer(), nullable=False),
        sa.Column("unchanged", sa.Integer(), nullable=False),
        sa.Column("missing_key", sa.Integer(), nullable=False),
        sa.Column("protected", sa.Integer(), nullable=False),
        sa.Column("duplicate_keys", sa.Integer(), nullable=False),
        sa.Column("conflicting_duplicates", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("attempt_id", name=op.f("pk_attempts")),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_attempts_task_key"), ["task_key"], unique=False)

    op.create_table(
        "maintenance_runs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column(
            "summary",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_maintenance_runs")),
    )
    op.create_table(
        "notifications",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.Column("remote_addr", sa.String(length=64), nullable=True),
        sa.Column(
            "form",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.String(length=40), nullable=True),
        sa.Column("task_key", sa.String(length=100), nullable=True),
        sa.Column("outcome", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notifications")),
    )
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_notifications_job_id"), ["job_id"], unique=False)

    op.create_table(
        "observations",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("observation_key", sa.String(length=64), nullable=False),
        sa.Column("dataset", sa.String(length=100), nullable=False),
        sa.Column("entity_key", sa.Text(), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("collection_window", sa.String(length=40), nullable=False),
        sa.Column("partition", sa.String(length=200), nullable=True),
        sa.Column("start_url", sa.Text(), nullable=True),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("payload_hash", sa.String(length=64), nullable=False),
        sa.Column("source_job_id", sa.BigInteger(), nullable=False),
        sa.Column("source_attempt_id", sa.String(length=36), nullable=False),
        sa.Column("validation_state", sa.String(length=20), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(), nullable=False),
        sa.Column("last_changed_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_observations")),
        sa.UniqueConstraint("observation_key", name=op.f("uq_observations_observation_key")),
    )
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.create_index(
            "ix_observations_run_partition", ["run_id", "partition"], unique=False
        )

    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("event_id", sa.String(length=100), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=True),
        sa.Column("dataset", sa.String(length=100), nullable=True),
        sa.Column("event_type", sa.String(length=50), nullable=False),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("delivered_at", sa.DateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
        sa.UniqueConstraint("event_id", name=op.f("uq_outbox_event_id")),
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_outbox_run_id"), ["run_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_outbox_state"), ["state"], unique=False)

    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("dataset", sa.String(length=100), nullable=False),
        sa.Column("collection_window", sa.String(length=40), nullable=False),
        sa.Column("sitemap_id", sa.BigInteger(), nullable=True),
        sa.Column("sitemap_name", sa.String(length=200), nullable=True),
        sa.Column("config_version", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column(
            "reasons",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("revision", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("evaluated_at", sa.DateTime(), nullable=True),
        sa.Column("accepted_at", sa.DateTime(), nullable=True),
        sa.Column("published_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
        sa.UniqueConstraint("dataset", "collection_window", name=op.f("uq_runs_dataset")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_runs_dataset"), ["dataset"], unique=False)

    op.create_table(
        "sync_tasks",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("task_key", sa.String(length=100), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("requested_generation", sa.Integer(), nullable=False),
        sa.Column("claimed_generation", sa.Integer(), nullable=False),
        sa.Column("synced_generation", sa.Integer(), nullable=False),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("failure_count", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_until", sa.DateTime(), nullable=True),
        sa.Column("lease_token", sa.Integer(), nullable=False),
        sa.Column("enqueued_at", sa.DateTime(), nullable=True),
        sa.Column("last_error_class", sa.String(length=100), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sync_tasks")),
        sa.UniqueConstraint("task_key", name=op.f("uq_sync_tasks_task_key")),
    )
    with op.batch_alter_table("sync_tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sync_tasks_run_id"), ["run_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_sync_tasks_state"), ["state"], unique=False)

    op.create_table(
        "deliveries",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("event_id", sa.String(length=100), nullable=False),
        sa.Column("destination", sa.String(length=500), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("lease_until", sa.DateTime(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["event_id"], ["outbox.event_id"], name=op.f("fk_deliveries_event_id_outbox")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
        sa.UniqueConstraint("event_id", "destination", name=op.f("uq_deliveries_event_id")),
    )
    op.create_table(
        "launches",
        sa.Column("batch_id", sa.String(length=200), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("partition", sa.String(length=200), nullable=True),
        sa.Column(
            "start_urls",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "manifest",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_launches_run_id_runs")),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_launches")),
    )
    op.create_table(
        "partition_verdicts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("partition", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("records", sa.Integer(), nullable=False),
        sa.Column(
            "reasons",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("evaluated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_partition_verdicts_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_partition_verdicts")),
        sa.UniqueConstraint("run_id", "partition", name=op.f("uq_partition_verdicts_run_id")),
    )
    op.create_table(
        "publications",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("dataset", sa.String(length=100), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("is_current", sa.Boolean(), nullable=False),
        sa.Column("published_at", sa.DateTime(), nullable=False),
        sa.Column("superseded_at", sa.DateTime(), nullable=True),
        sa.Column("event_id", sa.String(length=100), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_publications_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_publications")),
    )
    with op.batch_alter_table("publications", schema=None) as batch_op:
        batch_op.create_index(
            "uq_publications_current",
            ["dataset"],
            unique=True,
            postgresql_where=sa.text("is_current"),
            sqlite_where=sa.text("is_current"),
        )

    op.create_table(
        "scraping_jobs",
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=True),
        sa.Column("recovery_batch", sa.String(length=200), nullable=True),
        sa.Column("sitemap_id", sa.BigInteger(), nullable=True),
        sa.Column("sitemap_name", sa.String(length=200), nullable=True),
        sa.Column("custom_id", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=40), nullable=True),
        sa.Column("jobs_scheduled", sa.Integer(), nullable=False),
        sa.Column("jobs_executed", sa.Integer(), nullable=False),
        sa.Column("jobs_failed", sa.Integer(), nullable=False),
        sa.Column("jobs_empty", sa.Integer(), nullable=False),
        sa.Column("jobs_no_value", sa.Integer(), nullable=False),
        sa.Column("stored_record_count", sa.Integer(), nullable=False),
        sa.Column("time_created", sa.DateTime(), nullable=True),
        sa.Column("first_seen_at", sa.DateTime(), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(), nullable=False),
        sa.Column(
            "data_quality",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "problematic_urls",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("quality_checked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_scraping_jobs_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_scraping_jobs")),
    )
    with op.batch_alter_table("scraping_jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_scraping_jobs_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("scraping_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_scraping_jobs_run_id"))

    op.drop_table("scraping_jobs")
    with op.batch_alter_table("publications", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_publications_current",
            postgresql_where=sa.text("is_current"),
            sqlite_where=sa.text("is_current"),
        )

    op.drop_table("publications")
    op.drop_table("partition_verdicts")
    op.drop_table("launches")
    op.drop_table("deliveries")
    with op.batch_alter_table("sync_tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sync_tasks_state"))
        batch_op.drop_index(batch_op.f("ix_sync_tasks_run_id"))

    op.drop_table("sync_tasks")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_dataset"))

    op.drop_table("runs")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_outbox_state"))
        batch_op.drop_index(batch_op.f("ix_outbox_run_id"))

    op.drop_table("outbox")
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.drop_index("ix_observations_run_partition")

    op.drop_table("observations")
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_notifications_job_id"))

    op.drop_table("notifications")
    op.drop_table("maintenance_runs")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attempts_task_key"))

    op.drop_table("attempts")
