"""Observations leave half of each page free (PostgreSQL's fillfactor 50), so that the verdict's
UPDATE of a run's rows, and a sync's rewrite of its changed rows, stay heap-only updates: the new
row version goes in the same page and no index is touched. Pages written before keep their fill
until rewritten. SQLite has no such setting; nothing changes there.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 00:30:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE observations SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE observations RESET (fillfactor)")
