"""Invalid records and wide counters: each attempt counts the records it set aside (with reason,
partition and line), and a scraping job's counters hold any 64-bit value Cloud reports.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 06:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COUNTERS = (
    "jobs_scheduled",
    "jobs_executed",
    "jobs_failed",
    "jobs_empty",
    "jobs_no_value",
    "stored_record_count",
)


def _payload() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("invalid_records", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("invalid_detail", _payload(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":  # SQLite's INTEGER is 64-bit already
        for name in COUNTERS:
            op.alter_column("scraping_jobs", name, type_=sa.BigInteger())


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name in COUNTERS:
            op.alter_column("scraping_jobs", name, type_=sa.Integer())
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("invalid_detail")
        batch_op.drop_column("invalid_records")
