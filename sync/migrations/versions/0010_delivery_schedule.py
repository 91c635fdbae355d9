"""Deliveries that wait out long outages: each destination's failing streak and whether it is
disabled (410 Gone), the moment of a delivery's last attempt, an index for the relay's "oldest
waiting delivery of this destination" (see :mod:`sync.delivery.relay`), and each outbox event's
place in the pull feed, given in commit order so a consumer never skips one committed late
(:mod:`sync.delivery.feed`).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 13:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "destination_states",
        sa.Column("destination", sa.String(length=500), nullable=False),
        sa.Column("failing_since", sa.DateTime(), nullable=True),
        sa.Column("disabled_at", sa.DateTime(), nullable=True),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("destination", name=op.f("pk_destination_states")),
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("feed_position", sa.BigInteger(), nullable=True))
        batch_op.create_unique_constraint(batch_op.f("uq_outbox_feed_position"), ["feed_position"])
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("last_attempt_at", sa.DateTime(), nullable=True))
        batch_op.create_index(
            "ix_deliveries_destination_state", ["destination", "state", "id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_deliveries_destination_state")
        batch_op.drop_column("last_attempt_at")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_outbox_feed_position"), type_="unique")
        batch_op.drop_column("feed_position")
    op.drop_table("destination_states")
