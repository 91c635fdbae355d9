"""An observation keeps whether every value of its record is plain (``plain_for``: the
fingerprint of the plain values it was checked against as it was copied in, see
``sync.casts.PlainValues``), so that a first publication casts it without checking its values
again. Rows written before keep none and are checked by the publication, as before.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 14:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("plain_for", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.drop_column("plain_for")
