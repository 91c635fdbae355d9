"""The diagnosis kept with a rejection: for each failed rule, what most likely broke and what to
run next.

Inside the evaluating transaction (:func:`of`) each failure gets the fields whose fill rate
dropped, a few sample records of the last accepted run and of this one, Cloud's problematic URLs
of the affected partition, and the exact next command: ``rerun`` for what a re-scrape repairs (a
partition, failed pages), ``accept`` then ``baseline reset`` for a change that lasts (a shrink).
After the commit, :func:`add_selectors` names the sitemap selector behind each field, from one
call to Cloud (``GET sitemap/{id}``), and writes them into the diagnosis and the unsent
``run.rejected`` event.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import logs
from sync.acceptance.facts import ACCEPTED, NO_PARTITION, NOTE, WAITING, Judgement, Reason
from sync.bootstrap import Services
from sync.cloud.errors import CloudError
from sync.models import Observation, OutboxEvent, Run, ScrapingJob
from sync.runs import evidence
from sync.states import EventType, OutboxState

log = logs.get("runs")

SAMPLES = 2
FAILURES = 20  # failures diagnosed at most (each costs a few small queries)
URLS = 5
_SCANNED = 500  # records read to find samples of one failure
FIELD_RULES = ("fill_rate_drop", "field_missing")
RERUN_PARTITION = (
    "partition_drop",
    "required_missing",
    "unparsable",
    "consent_page",
    "empty_shell",
    "invalid_records",
    "fill_rate_drop",
    "field_missing",
)
RERUN_PAGES = ("failed_pages", "empty_pages", "no_value_pages", "job_not_finished")


def _failures(judgement: Judgement) -> list[Reason]:
    """Every failed rule of the verdict, run-level and per partition (no notes, no waits)."""
    found = [r for r in judgement.reasons if r.code != "partition_quarantined"]
    for p in judgement.partitions:
        found.extend(p.reasons)
    return [r for r in found if r.detail.get("kind") not in (NOTE, WAITING)]


def of(session: Session, run: Run, dataset: Dataset, judgement: Judgement) -> dict[str, Any]:
    """The diagnosis of a run the rules did not accept, from what the transaction reads."""
    previous = _last_accepted(session, run)
    failures = [
        _failure(session, run, dataset, r, previous) for r in _failures(judgement)[:FAILURES]
    ]
    commands: list[str] = []
    for f in failures:
        for command in f["next"]:
            if command not in commands:
                commands.append(command)
    return {"failures": failures, "next": commands, "previous_run_id": previous}


def kept(
    session: Session, run: Run, dataset: Dataset, judgement: Judgement
) -> dict[str, Any] | None:
    """The diagnosis a verdict keeps on its run: none for an accepted run; else made again,
    with the selectors an earlier verdict named."""
    if judgement.state == ACCEPTED:
        return None
    return with_selectors_of(of(session, run, dataset, judgement), run.diagnosis)


def _last_accepted(session: Session, run: Run) -> str | None:
    history = evidence.accepted_history(session, run, limit=1)
    return history[0].run_id if history else None


def _failure(
    session: Session, run: Run, dataset: Dataset, reason: Reason, previous: str | None
) -> dict[str, Any]:
    partition = reason.partition
    fields = _fields(reason)
    found: dict[str, Any] = {
        "code": reason.code,
        "partition": partition,
        "message": reason.message,
        "got": reason.got,
        "baseline": reason.baseline,
        "expected": reason.expected,
        "fields": [{"field": f, "selector": None} for f in fields],
        "samples": _samples(session, run.run_id, previous, partition, fields),
        "problematic_urls": _problematic_urls(session, run.run_id, partition),
        "next": _next(run, dataset, reason),
    }
    return found


def _fields(reason: Reason) -> list[str]:
    if reason.code in FIELD_RULES and isinstance(reason.detail.get("field"), str):
        return [str(reason.detail["field"])]
    if reason.code in ("required_missing", "unparsable"):
        named = reason.detail.get("fields") or reason.detail.get("field")
        if isinstance(named, str):
            return [named]
        if isinstance(named, Mapping | list):
            return [str(n) for n in named]
    return []


def _samples(
    session: Session,
    run_id: str,
    previous: str | None,
    partition: str | None,
    fields: list[str],
) -> dict[str, list[dict[str, Any]]]:
    """A few records of this run where the fields are empty (or any, for other rules), and the
    same entities (or others of the partition) as the last accepted run had them."""
    after = _records(session, run_id, partition, empty=fields)
    if previous is None:
        return {"before": [], "after": after}
    keys = [str(r["_entity_key"]) for r in after]
    before = _records(session, previous, partition, keys=keys) if keys else []
    if not before:
        before = _records(session, previous, partition, filled=fields)
    return {"before": before, "after": after}


def _records(
    session: Session,
    run_id: str,
    partition: str | None,
    *,
    empty: Iterable[str] = (),
    filled: Iterable[str] = (),
    keys: Iterable[str] = (),
) -> list[dict[str, Any]]:
    o = Observation.__table__.c
    query = select(o.entity_key, o.payload).where(o.run_id == run_id)
    if partition is not None and partition != NO_PARTITION:
        query = query.where(o.partition == partition)
    wanted = list(keys)
    if wanted:
        query = query.where(o.entity_key.in_(wanted))
    query = query.order_by(o.entity_key).limit(_SCANNED)
    empty, filled = list(empty), list(filled)
    out: list[dict[str, Any]] = []
    for key, payload in session.execute(query):
        if empty and not any(_blank(payload.get(f)) for f in empty):
            continue
        if filled and not all(not _blank(payload.get(f)) for f in filled):
            continue
        out.append({"_entity_key": key, **{k: _short(v) for k, v in payload.items()}})
        if len(out) == SAMPLES:
            break
    return out


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _short(value: Any) -> Any:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _problematic_urls(session: Session, run_id: str, partition: str | None) -> list[str]:
    """Cloud's problematic URLs of the run's jobs, those of the partition's host first."""
    urls: list[str] = []
    for listed in session.execute(
        select(ScrapingJob.problematic_urls).where(ScrapingJob.run_id == run_id)
    ).scalars():
        urls.extend(str(u.get("url")) for u in listed or [] if isinstance(u, Mapping))
    if partition is not None and partition != NO_PARTITION:
        urls = [u for u in urls if partition in (urlsplit(u).hostname or "")] or []
    return urls[:URLS]


def _next(run: Run, dataset: Dataset, reason: Reason) -> list[str]:
    """The commands that most likely settle this failure, the likeliest first."""
    rid = shlex.quote(run.run_id)
    accept = f"scrapesync accept {rid} --reason 'the change is real'"
    if reason.code in RERUN_PARTITION and reason.partition not in (None, NO_PARTITION):
        return [f"scrapesync rerun {rid} --partition {shlex.quote(str(reason.partition))}", accept]
    if reason.code in RERUN_PAGES:
        return [f"scrapesync rerun {rid} --failed-pages", accept]
    if reason.code == "record_drop":
        reset = f"scrapesync baseline reset {shlex.quote(dataset.name)} --reason 'the new normal'"
        return [accept, reset]
    return [f"scrapesync check {rid}", accept]


# --- after the commit: the selectors behind the fields --------------------------------------------


def add_selectors(services: Services, run_id: str) -> None:
    """Name the sitemap selector behind each field of the run's diagnosis (one Cloud call), in
    the diagnosis and in the unsent ``run.rejected`` event that carries it."""
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        if run is None or not run.diagnosis or run.sitemap_id is None:
            return
        found = run.diagnosis
        sitemap_id = run.sitemap_id
    wanted = {
        f["field"]
        for x in found.get("failures", [])
        for f in x.get("fields", [])
        if not f.get("selector")
    }
    if not wanted:
        return  # nothing to name, or named at an earlier verdict
    try:
        with services.cloud() as cloud:
            sitemap = cloud.get_sitemap(sitemap_id)
        selectors = selectors_of(sitemap)
    except (CloudError, ValueError) as exc:
        log.warning(
            "diagnosis.sitemap_unavailable",
            extra={"run_id": run_id, "sitemap_id": sitemap_id, "error": type(exc).__name__},
        )
        return
    for failure in found.get("failures", []):
        for field in failure.get("fields", []):
            field["selector"] = field.get("selector") or selectors.get(field["field"])
    with services.uow.begin() as session:
        session.execute(update(Run).where(Run.run_id == run_id).values(diagnosis=found))
        for event in session.execute(
            select(OutboxEvent).where(
                OutboxEvent.run_id == run_id,
                OutboxEvent.event_type == EventType.RUN_REJECTED,
                OutboxEvent.state == OutboxState.UNSENT,
            )
        ).scalars():
            if "diagnosis" in (event.payload or {}):
                event.payload = {**event.payload, "diagnosis": found}
        session.commit()


def selectors_of(sitemap: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A sitemap's selectors by id (the field name they fill in an export): type, CSS selector
    and parents. Cloud returns the definition as a JSON string."""
    definition = sitemap.get("sitemap")
    if isinstance(definition, str):
        definition = json.loads(definition)
    if not isinstance(definition, Mapping):
        return {}
    found: dict[str, dict[str, Any]] = {}
    for s in definition.get("selectors") or []:
        if isinstance(s, Mapping) and isinstance(s.get("id"), str):
            found[s["id"]] = {
                "id": s["id"],
                "type": s.get("type"),
                "selector": s.get("selector"),
                "parents": list(s.get("parentSelectors") or []),
            }
    return found


def with_selectors_of(found: dict[str, Any], stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """A diagnosis made again (``scrapesync check``) with the selectors the stored one named,
    field by field: a re-judgement calls no Cloud API."""
    known = {
        f["field"]: f["selector"]
        for x in (stored or {}).get("failures", [])
        for f in x.get("fields", [])
        if f.get("selector")
    }
    for failure in found["failures"]:
        for field in failure["fields"]:
            field["selector"] = known.get(field["field"])
    return found
