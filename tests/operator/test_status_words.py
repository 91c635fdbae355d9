"""``status`` in words that stay true: previously published runs, coverage capped with the raw
figures beside it, a filter by dataset, and one chart per dataset on its own scale."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from click.testing import CliRunner
from flask import Flask
from sqlalchemy import update

from config.datasets import Datasets
from scrapesync.cli import main
from simulator import CloudState, generate_records
from sync.bootstrap import Services
from sync.models import ScrapingJob
from sync.runs import launch
from tests.harness import datasets_from, drain, notify
from webhooks import create_app

pytestmark = pytest.mark.redis

TOKEN = "words-status-token-31"
TWO = """
[datasets.products]
sitemap = "products"
entity_key = ["sku"]
window = "daily"

[datasets.tiny]
sitemap = "tiny"
entity_key = ["sku"]
window = "daily"
"""


@pytest.fixture
def datasets() -> Datasets:
    """Two datasets of very different sizes."""
    return datasets_from(TWO)


def _collect(
    web: Flask, services: Services, cloud: CloudState, dataset: str, window: str, n: int
) -> str:
    outcome = launch.launch(services, dataset, window=window)
    assert outcome.job_id is not None
    cloud.set_records(outcome.job_id, [dict(r) for r in generate_records(n)])
    cloud.run_job(outcome.job_id)
    notify(web, outcome.job_id, custom_id=outcome.run_id, sitemap_name=dataset)
    drain(services)
    return outcome.run_id


@pytest.fixture
def two_datasets(web: Flask, services: Services, cloud: CloudState) -> dict[str, str]:
    """products published twice (the first replaced), tiny published once, five records."""
    cloud.add_sitemap("tiny", start_urls=["https://tiny.example/"])
    return {
        "old": _collect(web, services, cloud, "products", "2026-11-29", 400),
        "new": _collect(web, services, cloud, "products", "2026-11-30", 400),
        "tiny": _collect(web, services, cloud, "tiny", "2026-11-30", 5),
    }


def _status(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(main, ["status", "--json", *args])
    assert result.exit_code == 0, result.output
    values: dict[str, object] = json.loads(result.output)
    return values


def test_a_replaced_run_is_previously_published_and_coverage_is_capped(
    services: Services, two_datasets: dict[str, str]
) -> None:
    """The replaced run reads "previously published", the current one "published"; a run that
    kept more records than Cloud counted shows 100% with the raw 125% beside it."""
    with services.uow.begin() as session:
        session.execute(
            update(ScrapingJob)
            .where(ScrapingJob.run_id == two_datasets["new"])
            .values(stored_record_count=320)
        )
        session.commit()
    runs = {r["run_id"]: r for r in _status()["runs"]}  # type: ignore[attr-defined]
    old, new = runs[two_datasets["old"]], runs[two_datasets["new"]]
    assert (old["state"], old["standing"], old["published"]) == (
        "published",
        "previously published",
        False,
    )
    assert (new["standing"], new["published"]) == ("published", True)
    assert (new["coverage_percent"], new["coverage_raw_percent"]) == (100.0, 125.0)
    text = CliRunner().invoke(main, ["status"]).output
    (old_line,) = [x for x in text.splitlines() if x.startswith(two_datasets["old"] + " ")]
    assert "previously published" in old_line
    (new_line,) = [x for x in text.splitlines() if x.startswith(two_datasets["new"] + " ")]
    assert "100% (raw 125%)" in new_line
    assert " 400 " in new_line
    assert " 320 " in new_line
    assert "125%" not in text.replace("(raw 125%)", "")


def test_status_and_the_api_filter_by_dataset(
    services: Services, two_datasets: dict[str, str]
) -> None:
    """`status --dataset tiny` and `/api/runs?dataset=tiny` show only tiny's runs and
    publication."""
    shown = _status("--dataset", "tiny")
    assert [r["run_id"] for r in shown["runs"]] == [two_datasets["tiny"]]  # type: ignore[attr-defined]
    assert [p["dataset"] for p in shown["publications"]] == ["tiny"]  # type: ignore[attr-defined]
    text = CliRunner().invoke(main, ["status", "--dataset", "tiny"]).output
    assert two_datasets["tiny"] in text
    assert two_datasets["old"] not in text
    settings = dataclasses.replace(services.settings, status_token=TOKEN)
    client = create_app(dataclasses.replace(services, settings=settings)).test_client()
    answer = client.get(f"/api/runs?dataset=tiny&token={TOKEN}").get_json()
    assert [r["run_id"] for r in answer["runs"]] == [two_datasets["tiny"]]
    everything = client.get(f"/api/runs?token={TOKEN}").get_json()
    assert len(everything["runs"]) == 3


def test_the_status_page_charts_each_dataset_on_its_own_scale(
    services: Services, two_datasets: dict[str, str]
) -> None:
    """/status draws one chart per dataset; tiny's five records fill its chart's height, not a
    sliver of products' 400."""
    settings = dataclasses.replace(services.settings, status_token=TOKEN)
    client = create_app(dataclasses.replace(services, settings=settings)).test_client()
    html = client.get(f"/status?token={TOKEN}").get_data(as_text=True)
    assert "previously published" in html
    charts = re.findall(r'<div class="panel chart" data-dataset="(\w+)">(.*?)</svg>', html, re.S)
    assert [name for name, _ in charts] == ["products", "tiny"]
    tiny_svg = dict(charts)["tiny"]
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([0-9.]+)"', tiny_svg)]
    assert heights
    assert max(heights) > 50  # the plot is 102 high: the bar is tall on tiny's own scale
    assert 'fill="#6b7280">5<' in tiny_svg  # the axis top is tiny's own maximum
