"""Export digests: each import records the digest of what it read (the export's lines and the
rules it read them under), so a forced repeat of a byte-identical export can repeat its outcome
without parsing it again.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 11:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("export_digest", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("export_prefix", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("repeat_of", sa.String(length=36), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("repeat_of")
        batch_op.drop_column("export_prefix")
        batch_op.drop_column("export_digest")
