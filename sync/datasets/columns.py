"""Which typed columns a dataset's data has: the ones its tables were built with (the
``dataset_columns`` registry); before they are built, the ones its datasets file names, or else
one ``text`` column per field of its records."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from config.columns import Column, default_columns
from sync.models import DatasetColumn


def registered_columns(session: Session, dataset: str) -> tuple[Column, ...]:
    """The columns the registry says the dataset's tables hold, in table order."""
    rows = session.execute(
        select(DatasetColumn)
        .where(DatasetColumn.dataset == dataset)
        .order_by(DatasetColumn.position, DatasetColumn.column_name)
    ).scalars()
    return tuple(
        Column(name=r.column_name, field=r.field, type=r.type, decimal=r.decimal) for r in rows
    )


def columns_of(
    session: Session,
    dataset: str,
    declared: tuple[Column, ...],
    fields: Callable[[], Iterable[str]] = tuple,
) -> tuple[Column, ...]:
    """The dataset's typed columns: the registry's; with none registered, ``declared`` (its
    datasets file's), or else one text column per field that ``fields()`` names."""
    return registered_columns(session, dataset) or declared or default_columns(fields())
