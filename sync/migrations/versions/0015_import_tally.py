"""The import's tally: a run's first sync copied straight in keeps, with the run, how many rows
it wrote per partition and record shape, so that the run's first evaluation counts them without
a pass over the run (see ``sync.runs.shapes``).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "import_tally",
                sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
                nullable=True,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("import_tally")
