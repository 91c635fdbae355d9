"""A verdict is kept per partition, never written into each row: every committed import records
the data version its commit made (``run_imports``), a verdict records the version whose rows it
judged (``runs.judged_version``), and a row takes its partition's verdict when the import that
last wrote it made that version or an earlier one (see ``sync.acceptance.row_states``). Each row's
``validation_state`` goes, and observations fill their pages again (PostgreSQL): the half left
free was for the verdict's UPDATE of every row.

The rows marked before carry over: the imports whose rows a verdict marked valid or quarantined
are recorded at version 0 and the run judged at version 0, so those rows keep their verdict; the
imports whose rows were still pending are recorded at the run's data version, past that, so
their rows stay pending until the run's next verdict.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 04:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_imports",
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("attempt_id", sa.String(length=36), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "attempt_id", name=op.f("pk_run_imports")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("judged_version", sa.Integer(), nullable=True))
    # the imports of the rows a verdict marked, judged at version 0; the others' rows pending
    op.execute(
        "INSERT INTO run_imports (run_id, attempt_id, version) "
        "SELECT o.run_id, o.source_attempt_id, "
        "CASE WHEN min(CASE WHEN o.validation_state <> 'pending' THEN 0 ELSE 1 END) = 0 "
        "THEN 0 ELSE max(r.data_version) END "
        "FROM observations o JOIN runs r ON r.run_id = o.run_id "
        "GROUP BY o.run_id, o.source_attempt_id"
    )
    op.execute(
        "UPDATE runs SET judged_version = 0 WHERE run_id IN "
        "(SELECT run_id FROM run_imports WHERE version = 0)"
    )
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.drop_column("validation_state")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE observations RESET (fillfactor)")


def downgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "validation_state",
                sa.String(length=20),
                nullable=False,
                server_default="pending",
            )
        )
    # each row as its verdict left it: its partition's state, for the imports the run judged
    op.execute(
        "UPDATE observations SET validation_state = CASE WHEN pv.state = 'passed' THEN 'valid' "
        "ELSE 'quarantined' END FROM run_imports i, runs r, partition_verdicts pv "
        "WHERE i.run_id = observations.run_id AND i.attempt_id = observations.source_attempt_id "
        "AND r.run_id = observations.run_id AND i.version <= r.judged_version "
        "AND pv.run_id = observations.run_id "
        "AND pv.partition = COALESCE(observations.partition, '(none)')"
    )
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.alter_column("validation_state", server_default=None)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("judged_version")
    op.drop_table("run_imports")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE observations SET (fillfactor = 50)")
