"""Operator decisions and bounded failures: a run keeps an operator's decision (accept, reject,
cancel) with its reason and time, counts the evaluations that raised, and keeps the diagnosis of
its rejection; every decision is logged in ``operator_decisions`` (a dataset's baseline resets
too); records set aside at import whose entity is known are kept in ``set_aside_records``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 13:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("decision", sa.String(length=20), nullable=True))
        batch_op.add_column(sa.Column("decided_by", sa.String(length=20), nullable=True))
        batch_op.add_column(sa.Column("decision_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("decided_at", sa.DateTime(), nullable=True))
        batch_op.add_column(
            sa.Column(
                "evaluation_failures", sa.Integer(), nullable=False, server_default=sa.text("0")
            )
        )
        batch_op.add_column(sa.Column("diagnosis", _JSON, nullable=True))
    op.create_table(
        "operator_decisions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("dataset", sa.String(length=100), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=True),
        sa.Column("action", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("decided_by", sa.String(length=20), nullable=False),
        sa.Column("decided_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operator_decisions")),
    )
    op.create_index(
        op.f("ix_operator_decisions_dataset"), "operator_decisions", ["dataset"], unique=False
    )
    op.create_index(
        op.f("ix_operator_decisions_run_id"), "operator_decisions", ["run_id"], unique=False
    )
    op.create_table(
        "set_aside_records",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("dataset", sa.String(length=100), nullable=False),
        sa.Column("entity_key", sa.Text(), nullable=False),
        sa.Column("partition", sa.String(length=200), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("line", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=50), nullable=False),
        sa.Column("values", _JSON, nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_set_aside_records")),
        sa.UniqueConstraint("run_id", "entity_key", name=op.f("uq_set_aside_records_run_id")),
    )


def downgrade() -> None:
    op.drop_table("set_aside_records")
    op.drop_index(op.f("ix_operator_decisions_run_id"), table_name="operator_decisions")
    op.drop_index(op.f("ix_operator_decisions_dataset"), table_name="operator_decisions")
    op.drop_table("operator_decisions")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("diagnosis")
        batch_op.drop_column("evaluation_failures")
        batch_op.drop_column("decided_at")
        batch_op.drop_column("decision_reason")
        batch_op.drop_column("decided_by")
        batch_op.drop_column("decision")
