"""The acceptance and delivery tests' shared vocabulary: the test dataset, its signed HTTP
destination, and helpers that drive a job through sync, verdict and export."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from flask import Flask
from rq.registry import FailedJobRegistry
from sqlalchemy import select

from simulator import CloudState
from simulator.records import generate_records
from sync import bootstrap
from sync.acceptance.facts import Judgement
from sync.bootstrap import Services
from sync.datasets import export
from sync.ingest import store, tasks
from sync.models import OutboxEvent, PartitionVerdict, Run
from sync.queue import RecordingDispatcher, RQDispatcher
from sync.runs import evaluation, publication
from tests.fakes import Receiver
from tests.harness import datasets_from, drain, notify, products_sitemap

SECRET_ENV = "PRODUCTS_HOOK_SECRET"
SECRET = "whsec_" + base64.b64encode(b"the receiver's shared signing key!").decode()
HOOK_URL = "https://receiver.test/hooks/scrapesync"
RETAILERS = ("alpha.example", "beta.example", "gamma.example", "delta.example")

DATASETS_TOML = f"""
[datasets.products]
sitemap = "products"
entity_key = ["sku"]
window = "job"
partition = "retailer"
required = ["sku", "price"]
policy = "reject"
[datasets.products.quality]
parsers = {{ price = "number" }}

[[datasets.products.destinations]]
url = "{HOOK_URL}"
secret_env = "{SECRET_ENV}"
"""


def use_datasets(services: Services, text: str) -> Services:
    """The deployment switched to another datasets file (the worker jobs see it too)."""
    switched = replace(services, datasets=datasets_from(text))
    bootstrap.use(switched)
    return switched


def with_policy(policy: str, *, quality: str = "") -> str:
    """The test datasets file with another policy and extra quality lines."""
    text = DATASETS_TOML.replace('policy = "reject"', f'policy = "{policy}"')
    parsers = 'parsers = { price = "number" }'
    return text.replace(parsers, f"{parsers}\n{quality}")


def settle(services: Services) -> int:
    """Run every queued job as a worker would, and fail if any of them raised."""
    ran = drain(services)
    dispatcher = services.dispatcher
    assert isinstance(dispatcher, RQDispatcher)
    failed = FailedJobRegistry(queue=dispatcher.queue)
    problems = []
    for job_id in failed.get_job_ids():
        job = dispatcher.queue.fetch_job(job_id)
        result = job.latest_result() if job is not None else None
        problems.append(f"{job_id}: {result.exc_string if result is not None else '?'}")
    assert not problems, "\n".join(problems)
    return ran


def product_records(
    n: int,
    *,
    start: int = 0,
    retailers: tuple[str, ...] = RETAILERS,
    garbage: str | None = None,
) -> list[dict[str, str]]:
    """``n`` product records over the retailers; the ``garbage`` retailer's prices are junk."""
    records = list(generate_records(n, partitions=retailers, start=start))
    for record in records:
        if record["retailer"] == garbage:
            record["price"] = "call for price"
    return records


def finished_job(
    cloud: CloudState, records: list[dict[str, str]] | None = None, **finish: Any
) -> int:
    """A finished job of the products sitemap with these records."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, records=records if records is not None else product_records(40), **finish)
    return job_id


def run_id_of(job_id: int) -> str:
    """The run of a job of the test dataset (one run per job)."""
    return f"products-job-{job_id}"


@dataclass(frozen=True)
class StoredVerdict:
    """A run's verdict as the database holds it: state, revision, reasons with their numbers,
    each partition's verdict, whether it is published, and the run's outbox events."""

    state: str
    revision: int
    reasons: list[dict[str, Any]]
    partitions: list[dict[str, Any]]
    is_published: bool
    events: list[dict[str, Any]]


def verdict(services: Services, run_id: str) -> StoredVerdict:
    """A run's verdict, which must exist."""
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None, run_id
        partitions = session.execute(
            select(PartitionVerdict)
            .where(PartitionVerdict.run_id == run_id)
            .order_by(PartitionVerdict.partition)
        ).scalars()
        events = session.execute(
            select(OutboxEvent).where(OutboxEvent.run_id == run_id).order_by(OutboxEvent.id)
        ).scalars()
        return StoredVerdict(
            state=run.state,
            revision=run.revision,
            reasons=list(run.reasons or []),
            partitions=[
                {
                    "partition": p.partition,
                    "state": p.state,
                    "records": p.records,
                    "reasons": list(p.reasons or []),
                }
                for p in partitions
            ],
            is_published=publication.published_run_id(session, run.dataset) == run_id,
            events=[
                {"event_id": e.event_id, "type": e.event_type, "state": e.state} for e in events
            ],
        )


def quarantined(judgement: Judgement) -> tuple[str, ...]:
    """The partitions of a judged run that failed their checks."""
    return tuple(p.partition for p in judgement.partitions if not p.passed)


def publishable(judgement: Judgement) -> tuple[str, ...]:
    """The partitions of a judged run whose records are published: the passing ones of an
    accepted run, none of any other."""
    if judgement.state != "accepted":
        return ()
    return tuple(p.partition for p in judgement.partitions if p.passed)


def published(services: Services) -> str | None:
    """The run the products dataset's published pointer names."""
    with services.uow.begin() as session:
        return publication.published_run_id(session, "products")


def exported(
    services: Services, out: Path, **kw: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Export the products dataset; its records and its manifest."""
    result = export.export_dataset(services, "products", out=out, **kw)
    lines = result.path.read_text().splitlines()
    return [json.loads(line) for line in lines], json.loads(result.manifest_path.read_text())


def wire_receiver(services: Services, found: Receiver) -> Services:
    """The services with a signature-checking receiver as the test dataset's HTTP destination
    (the worker jobs see it too)."""
    wired = replace(
        services,
        delivery_transport=httpx.MockTransport(found),
        settings=replace(services.settings, environment={SECRET_ENV: SECRET}),
    )
    bootstrap.use(wired)
    return wired


def sync_offline(services: Services, job_id: int) -> None:
    """Sync a job as the worker would, with nothing queued after it (no evaluation, no
    delivery): the test evaluates when it chooses."""
    offline = replace(services, dispatcher=RecordingDispatcher())
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    assert tasks.run_sync(offline, wish.task_key).outcome == "committed"


def accept_quietly(services: Services, cloud: CloudState, n: int = 40) -> tuple[str, list[str]]:
    """Sync and accept a new job's run without queueing any delivery; its run id and events."""
    offline = replace(services, dispatcher=RecordingDispatcher())
    job_id = finished_job(cloud, product_records(n))
    sync_offline(services, job_id)
    judged = evaluation.evaluate_run(offline, run_id_of(job_id))
    assert judged.outcome == "published"
    return run_id_of(job_id), list(judged.events)


# Only the entity key is required and Cloud's own column check is off, so what catches an
# emptied or vanished field here is the history, not a fixed rule.
HISTORY_TOML = DATASETS_TOML.replace('required = ["sku", "price"]', 'required = ["sku"]').replace(
    'parsers = { price = "number" }', 'parsers = { price = "number" }\nuse_cloud_quality = false'
)
PER_RETAILER = 100


def history_datasets(*, policy: str = "reject", quality: str = "") -> str:
    """The history test dataset, with another policy and extra quality lines."""
    text = HISTORY_TOML.replace('policy = "reject"', f'policy = "{policy}"')
    return text.replace("use_cloud_quality = false", f"use_cloud_quality = false\n{quality}")


def collect(
    web: Flask, services: Services, cloud: CloudState, records: list[dict[str, str]]
) -> str:
    """A finished Cloud job with these records, notified, synced and evaluated; its run id."""
    job_id = finished_job(cloud, records)
    notify(web, job_id)
    settle(services)
    return run_id_of(job_id)


def three_accepted_runs(web: Flask, services: Services, cloud: CloudState) -> list[str]:
    """The dataset's history: three accepted runs of 100 records per retailer."""
    accepted = []
    for i in range(3):
        run_id = collect(web, services, cloud, product_records(400, start=400 * i))
        assert verdict(services, run_id).state == "published"
        accepted.append(run_id)
    return accepted
