"""Alerts: the messages to people's alert channels (``alerts``), written in the transaction of
the state they report, and what each channel was last told per dataset and reason
(``alert_conditions``), so that one message goes out per reason and alert interval (see
:mod:`sync.alerts`).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 13:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _payload() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False)


def upgrade() -> None:
    op.create_table(
        "alert_conditions",
        _id(),
        sa.Column("dataset", sa.String(length=100), nullable=False),
        sa.Column("reason", sa.String(length=40), nullable=False),
        sa.Column("firing", sa.Boolean(), nullable=False),
        sa.Column("announced", sa.Boolean(), nullable=False),
        sa.Column("since", sa.DateTime(), nullable=True),
        sa.Column("last_alerted_at", sa.DateTime(), nullable=True),
        sa.Column("messages", sa.Integer(), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=True),
        sa.Column("notice", _payload(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_conditions")),
        sa.UniqueConstraint("dataset", "reason", name=op.f("uq_alert_conditions_dataset")),
    )
    op.create_table(
        "alerts",
        _id(),
        sa.Column("alert_id", sa.String(length=100), nullable=False),
        sa.Column("channel", sa.String(length=500), nullable=False),
        sa.Column("dataset", sa.String(length=100), nullable=True),
        sa.Column("reason", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("details", _payload(), nullable=False),
        sa.Column("command", sa.String(length=300), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("lease_until", sa.DateTime(), nullable=True),
        sa.Column("sent_at", sa.DateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("alert_id", name=op.f("uq_alerts_alert_id")),
    )
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_alerts_state"), ["state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_alerts_state"))
    op.drop_table("alerts")
    op.drop_table("alert_conditions")
