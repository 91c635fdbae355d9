"""Whether a run's row is valid, quarantined or pending, without writing the verdict into any row.

Every committed import of a run records the data version its commit made (``run_imports``: the
attempt that wrote it, and that version), in the transaction that writes its rows. A verdict
judges the rows of one snapshot, which holds exactly the imports of the version it reads
(``runs.data_version``; an import committed after the snapshot makes a later one). It writes its
partition verdicts and that version (``runs.judged_version``), and no row. A row then takes:

- its partition's verdict (``passed``: valid; ``quarantined``: quarantined), when the import that
  last wrote it made the judged version or an earlier one;
- ``pending`` otherwise: a sync wrote it after the verdict's snapshot (every write of a row names
  its attempt), and the run's next verdict judges it.

A first sync's verdict so costs a few rows, not an UPDATE of every observation of the run, and
observations fill their pages (nothing rewrites them in place). The same conditions serve every
reader, in the verdict's transaction and after it, on PostgreSQL and SQLite.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, case, func, literal, not_, select
from sqlalchemy.sql.elements import ColumnElement

from sync.acceptance.facts import NO_PARTITION
from sync.models import Observation, PartitionVerdict, Run, RunImport
from sync.states import PartitionState, ValidationState

_O = Observation.__table__.c


def judged(run_id: str, rows: Any = _O) -> ColumnElement[bool]:
    """The rows of ``run_id`` (columns ``rows``: observations' or an alias's) that its last
    verdict judged: written by an import that made its judged version or an earlier one."""
    i = RunImport.__table__.c
    version = select(Run.judged_version).where(Run.run_id == run_id).scalar_subquery()
    imports = select(i.attempt_id).where(i.run_id == run_id, i.version <= version)
    found: ColumnElement[bool] = rows.source_attempt_id.in_(imports)
    return found


def passed(run_id: str, rows: Any = _O) -> ColumnElement[bool]:
    """The rows of ``run_id`` in a partition its last verdict passed (judged or not)."""
    v = PartitionVerdict.__table__.c
    names = select(v.partition).where(v.run_id == run_id, v.state == PartitionState.PASSED)
    return func.coalesce(rows.partition, literal(NO_PARTITION)).in_(names)


def valid(run_id: str, rows: Any = _O) -> ColumnElement[bool]:
    """The run's valid rows: judged, in a partition that passed."""
    return and_(rows.run_id == run_id, judged(run_id, rows), passed(run_id, rows))


def pending(run_id: str, rows: Any = _O) -> ColumnElement[bool]:
    """The run's rows written since its last verdict's snapshot."""
    return not_(judged(run_id, rows))


def state(run_id: str, rows: Any = _O) -> ColumnElement[str]:
    """Each row's state, by name: ``pending``, ``valid`` or ``quarantined``."""
    return case(
        (pending(run_id, rows), literal(ValidationState.PENDING.value)),
        (passed(run_id, rows), literal(ValidationState.VALID.value)),
        else_=literal(ValidationState.QUARANTINED.value),
    )


def valid_sql(run_param: str = ":run_id", alias: str = "o") -> str:
    """:func:`valid`'s conditions as SQL text for a statement written by hand, on observations
    aliased ``alias``, the run's id bound as ``run_param``."""
    return (
        f"{alias}.run_id = {run_param} AND {alias}.source_attempt_id IN "  # noqa: S608 - names only
        f"(SELECT i.attempt_id FROM run_imports i WHERE i.run_id = {run_param} "
        f"AND i.version <= (SELECT r.judged_version FROM runs r WHERE r.run_id = {run_param})) "
        f"AND COALESCE({alias}.partition, '{NO_PARTITION}') IN (SELECT pv.partition FROM "
        f"partition_verdicts pv WHERE pv.run_id = {run_param} "
        f"AND pv.state = '{PartitionState.PASSED}')"
    )
