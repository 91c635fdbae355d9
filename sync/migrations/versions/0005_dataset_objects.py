"""Dataset objects: what each dataset's typed tables hold (column, source field, type), and each
publication's change counts.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 11:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _payload() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "dataset_columns",
        sa.Column("dataset", sa.String(length=100), nullable=False),
        sa.Column("column_name", sa.String(length=63), nullable=False),
        sa.Column("field", sa.Text(), nullable=False),
        sa.Column("type", sa.String(length=20), nullable=False),
        sa.Column("decimal", sa.String(length=1), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("dataset", "column_name", name=op.f("pk_dataset_columns")),
    )
    with op.batch_alter_table("publications", schema=None) as batch_op:
        batch_op.add_column(sa.Column("changes", _payload(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("publications", schema=None) as batch_op:
        batch_op.drop_column("changes")
    op.drop_table("dataset_columns")
