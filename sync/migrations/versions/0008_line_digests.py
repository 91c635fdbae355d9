"""Line digests: each observation keeps the digest of the export line it was last written from,
so a later import of the same run that finds that line again knows the record unchanged without
parsing it (see :mod:`sync.ingest.line_digests`).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 03:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("line_digest", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.drop_column("line_digest")
