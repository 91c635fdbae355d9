"""Record profiles: the shape of each clean record a run's evaluation has judged, by payload hash
and record rules, so a later evaluation of the run reads again only the records that changed.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 21:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "record_profiles",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("payload_hash", sa.String(length=64), nullable=False),
        sa.Column("rules", sa.String(length=32), nullable=False),
        sa.Column("shape", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_record_profiles")),
    )
    op.create_index(
        "ix_record_profiles_run_hash", "record_profiles", ["run_id", "payload_hash"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_record_profiles_run_hash", table_name="record_profiles")
    op.drop_table("record_profiles")
