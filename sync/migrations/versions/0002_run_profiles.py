"""Run profiles: what each accepted run held, the history acceptance judges new runs against.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 05:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _payload() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "run_profiles",
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("dataset", sa.String(length=100), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("records", sa.Integer(), nullable=False),
        sa.Column("partitions", _payload(), nullable=False),
        sa.Column("fill_rates", _payload(), nullable=False),
        sa.Column("partition_fill_rates", _payload(), nullable=False),
        sa.Column("fields", _payload(), nullable=False),
        sa.Column("profiled_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_run_profiles_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_profiles")),
    )
    with op.batch_alter_table("run_profiles", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_profiles_dataset"), ["dataset"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("run_profiles", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_profiles_dataset"))
    op.drop_table("run_profiles")
