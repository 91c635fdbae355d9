"""Remember what Cloud reported at each task's last committed sync, so a repeat of an
unchanged job commits without downloading it again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 06:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sync_tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("synced_fingerprint", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sync_tasks", schema=None) as batch_op:
        batch_op.drop_column("synced_fingerprint")
