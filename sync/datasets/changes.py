"""What changed between two published states of a dataset: entities added, removed, and
changed in the columns that matter (the dataset's ``watch`` table, or every column).

:func:`compare` is the one comparison: publication uses it for the change feed, and
``scrapesync diff`` for any two runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from config.columns import Watch
from sync.casts import to_json

ADDED = "added"
REMOVED = "removed"
CHANGED = "changed"
KINDS = (ADDED, REMOVED, CHANGED)

Values = Mapping[str, Any]  # one entity's typed column values, by column name


@dataclass(frozen=True)
class ColumnChange:
    """One column of one entity, before and after."""

    column: str
    before: Any
    after: Any


@dataclass(frozen=True)
class EntityChange:
    """One entity that was added, removed or changed. ``values`` are the entity's column values
    after (added, changed) or before (removed); ``columns`` the changes that matter."""

    entity_key: str
    kind: str
    values: Values = field(default_factory=dict)
    columns: tuple[ColumnChange, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The entry as JSON carries it: a changed entity names its columns with before and
        after; an added or removed one carries its values."""
        if self.kind == CHANGED:
            return {
                "entity_key": self.entity_key,
                "columns": {
                    c.column: {"before": to_json(c.before), "after": to_json(c.after)}
                    for c in self.columns
                },
            }
        return {
            "entity_key": self.entity_key,
            "values": {name: to_json(value) for name, value in self.values.items()},
        }


@dataclass(frozen=True)
class ChangeSet:
    """The changes one publication of ``run_id`` made to what readers of the dataset get,
    relative to ``previous_run_id``'s publication. ``baseline`` is a dataset's first
    publication: everything is new, and only the counts are reported."""

    dataset: str
    run_id: str
    previous_run_id: str | None
    added: tuple[EntityChange, ...] = ()
    removed: tuple[EntityChange, ...] = ()
    changed: tuple[EntityChange, ...] = ()
    baseline: bool = False
    # a baseline's counts: its entries are never listed, so they are not kept either
    totals: Mapping[str, int] | None = None

    @property
    def entries(self) -> tuple[EntityChange, ...]:
        """Every entry, added then removed then changed, each in entity-key order."""
        return self.added + self.removed + self.changed

    def counts(self) -> dict[str, int]:
        """How many entities were added, removed and changed."""
        if self.totals is not None:
            return dict(self.totals)
        return {ADDED: len(self.added), REMOVED: len(self.removed), CHANGED: len(self.changed)}

    def as_dict(self) -> dict[str, Any]:
        """The whole change set as JSON: counts, and the ``added``, ``removed`` and ``changed``
        lists (empty for a baseline)."""
        return {
            "dataset": self.dataset,
            "run_id": self.run_id,
            "previous_run_id": self.previous_run_id,
            "baseline": self.baseline,
            "counts": self.counts(),
            ADDED: [] if self.baseline else [e.as_dict() for e in self.added],
            REMOVED: [] if self.baseline else [e.as_dict() for e in self.removed],
            CHANGED: [e.as_dict() for e in self.changed],
        }


def column_changes(
    before: Values, after: Values, watch: Mapping[str, Watch]
) -> tuple[ColumnChange, ...]:
    """The columns of one entity whose change matters: with no watched columns any column
    whose value differs, otherwise the watched ones whose change passes their tolerance."""
    if not watch:
        names = sorted(set(before) | set(after))
        return tuple(
            ColumnChange(n, before.get(n), after.get(n))
            for n in names
            if before.get(n) != after.get(n)
        )
    return tuple(
        ColumnChange(n, before.get(n), after.get(n))
        for n in sorted(watch)
        if watch[n].matters(before.get(n), after.get(n))
    )


def compare(
    dataset: str,
    run_id: str,
    previous_run_id: str | None,
    before: Mapping[str, Values],
    after: Mapping[str, Values],
    watch: Mapping[str, Watch],
    *,
    baseline: bool = False,
) -> ChangeSet:
    """The change set from ``before`` to ``after`` (entity key -> column values). Only the
    entities present in both whose values differ need be passed: an entity missing from
    ``after`` is removed only if it is in ``before``. A baseline into nothing is counted only:
    its entries are never listed."""
    if baseline and not before:
        return ChangeSet(
            dataset=dataset,
            run_id=run_id,
            previous_run_id=previous_run_id,
            baseline=True,
            totals={ADDED: len(after), REMOVED: 0, CHANGED: 0},
        )
    added = tuple(
        EntityChange(k, ADDED, values=after[k]) for k in sorted(after.keys() - before.keys())
    )
    removed = tuple(
        EntityChange(k, REMOVED, values=before[k]) for k in sorted(before.keys() - after.keys())
    )
    changed: list[EntityChange] = []
    for key in sorted(before.keys() & after.keys()):
        columns = column_changes(before[key], after[key], watch)
        if columns:
            changed.append(EntityChange(key, CHANGED, values=after[key], columns=columns))
    return ChangeSet(
        dataset=dataset,
        run_id=run_id,
        previous_run_id=previous_run_id,
        added=added,
        removed=removed,
        changed=tuple(changed),
        baseline=baseline,
    )
