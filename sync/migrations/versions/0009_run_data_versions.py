"""Run data versions: each committed import of a run counts up the run's ``data_version``, and
an evaluation records the version it judged, so a run is due for evaluation exactly when its
data changed since its verdict (see :mod:`sync.runs.evaluation`).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 08:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("data_version", sa.Integer(), nullable=False, server_default=sa.text("1"))
        )
        batch_op.add_column(sa.Column("evaluated_version", sa.Integer(), nullable=True))
    # a run judged after its last sync has judged its data as it stands; any other stays due
    op.execute(
        "UPDATE runs SET evaluated_version = 1 WHERE evaluated_at IS NOT NULL AND NOT EXISTS "
        "(SELECT 1 FROM sync_tasks t WHERE t.run_id = runs.run_id "
        "AND t.updated_at > runs.evaluated_at)"
    )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("evaluated_version")
        batch_op.drop_column("data_version")
