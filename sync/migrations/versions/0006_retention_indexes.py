"""Retention: the indexes that let the maintenance pass find what is old in small batches
(notifications by when they arrived, attempts by when they started, outbox events by when
they were delivered). Observations are pruned by run, through ``ix_observations_run_partition``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 11:20:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_notifications_received_at", "notifications", "received_at"),
    ("ix_attempts_started_at", "attempts", "started_at"),
    ("ix_outbox_delivered_at", "outbox", "delivered_at"),
)


def upgrade() -> None:
    for name, table, column in INDEXES:
        op.create_index(op.f(name), table, [column], unique=False)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(op.f(name), table_name=table)
