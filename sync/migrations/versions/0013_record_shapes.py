"""Record shapes: an observation keeps the shape of its record as its run's last evaluation
judged it (the fields it fills and those it leaves empty, under the record rules' fingerprint),
so a later evaluation of the run reads again only the records that changed. A sync that rewrites
the row forgets it.

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
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("shape", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.drop_column("shape")
