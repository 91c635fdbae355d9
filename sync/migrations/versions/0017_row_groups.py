"""A run's rows per group, kept at its data version: ``runs.row_groups`` holds how many rows the
run has per partition, stored shape and attempt that last wrote them, at the version it names
(its imports and evaluations keep it, see ``sync.runs.shapes``), and each import's row in
``run_imports`` the ids of the rows it wrote (``written``), when it kept them. An evaluation
then counts a run at that version, and finds its pending rows, without a pass over the run.

``runs.import_tally`` (a first sync's copied rows per partition and shape) goes: what it held
is a case of the groups. A run that held one takes one pass at its next evaluation, which keeps
the groups from then on.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 06:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("row_groups", _json(), nullable=True))
        batch_op.drop_column("import_tally")
    with op.batch_alter_table("run_imports", schema=None) as batch_op:
        batch_op.add_column(sa.Column("written", _json(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_imports", schema=None) as batch_op:
        batch_op.drop_column("written")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("import_tally", _json(), nullable=True))
        batch_op.drop_column("row_groups")
