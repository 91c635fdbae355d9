"""``scrapesync doctor``: every part of a deployment checked, with a hint for each failure."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from simulator import CloudState, SimServer, serve
from sync.cloud.budget import RedisApiBudget, account_key_for
from tests.conftest import REDIS_URL
from tests.harness import BIN, write_datasets

pytestmark = [pytest.mark.redis, pytest.mark.slow]

API_TOKEN = "doctor-sim-token"
HOOK_SECRET = "a shared signing secret for the receiver"
SELECTORS = [
    {"id": "sku", "type": "SelectorText", "parentSelectors": ["_root"], "selector": ".sku"},
    {"id": "title", "type": "SelectorText", "parentSelectors": ["_root"], "selector": "h1"},
    {"id": "price", "type": "SelectorText", "parentSelectors": ["_root"], "selector": ".price"},
    {"id": "url", "type": "SelectorLink", "parentSelectors": ["_root"], "selector": "a.product"},
    {"id": "retailer", "type": "SelectorText", "parentSelectors": ["_root"], "selector": ".shop"},
]
GOOD_DATASETS = """
[datasets.products]
sitemap = "products"
entity_key = ["sku"]
partition = "retailer"
required = ["sku", "price", "url-href"]
[datasets.products.quality]
parsers = { price = "number" }

[[datasets.products.destinations]]
url = "https://receiver.example/hooks"
secret_env = "PRODUCTS_HOOK_SECRET"
"""


@pytest.fixture
def account() -> Iterator[SimServer]:
    """A simulated Cloud account holding the ``products`` sitemap with five selectors, on
    loopback as a deployed process reaches Cloud."""
    with CloudState(api_token=API_TOKEN) as state:
        state.add_sitemap("products", start_urls=["https://alpha.example/"], selectors=SELECTORS)
        with serve(state) as server:
            yield server


@pytest.fixture
def redis_db(redis_conn: Redis) -> Redis:
    """The tests' Redis database, emptied."""
    return redis_conn


def doctor(
    tmp_path: Path, database_url: str, sim: SimServer, datasets: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``scrapesync doctor`` as an operator does, in a deployment's environment."""
    path = write_datasets(tmp_path, datasets)
    base = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
        "WEBSCRAPER_API_URL": sim.api_url,
        "WEBSCRAPER_API_TOKEN": API_TOKEN,
        "WEBHOOK_TOKEN": "a-long-random-webhook-token",
        "SCRAPESYNC_STATUS_TOKEN": "a-long-random-status-token",
        "SCRAPESYNC_DATASETS": str(path),
        "PRODUCTS_HOOK_SECRET": HOOK_SECRET,
    }
    return subprocess.run(
        [str(BIN / "scrapesync"), "doctor", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )


def checks(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    """The checks of a ``doctor --json`` run, by name."""
    return {check["name"]: check for check in json.loads(done.stdout)["checks"]}


def test_a_correct_deployment_passes_every_check(
    tmp_path: Path, database_url: str, account: SimServer, redis_db: Redis
) -> None:
    """Variables, database at head, Redis, the token, the sitemap, its fields, the secret: ok."""
    done = doctor(tmp_path, database_url, account, GOOD_DATASETS)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(line.startswith("ok  ") for line in lines[:-1]), done.stdout
    assert lines[-1] == f"all {len(lines) - 1} checks passed"
    for name in ("variable WEBSCRAPER_API_TOKEN", "database", "redis", "cloud token"):
        assert any(line.startswith(f"ok    {name}:") for line in lines), name
    assert any("dataset products: fields:" in line for line in lines)
    assert API_TOKEN not in done.stdout + done.stderr
    assert HOOK_SECRET not in done.stdout + done.stderr
    assert "a-long-random" not in done.stdout + done.stderr


def test_a_field_that_is_not_a_selector_fails_naming_dataset_field_and_sitemap(
    tmp_path: Path, database_url: str, account: SimServer, redis_db: Redis
) -> None:
    """A typo in ``required`` is caught before the first job: exit 1, and the line says where."""
    typo = GOOD_DATASETS.replace('"price", "url-href"', '"prize", "url-href"')
    done = doctor(tmp_path, database_url, account, typo)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1, done.stdout
    assert "dataset products" in failed[0]
    assert "'prize'" in failed[0]
    assert "sitemap 'products'" in failed[0]
    assert "hint:" in done.stdout
    assert re.fullmatch(r"1 of \d+ checks failed", done.stdout.splitlines()[-1])
    as_json = doctor(tmp_path, database_url, account, typo, "--json")
    assert as_json.returncode == 1
    report = checks(as_json)
    assert report["dataset products: field prize"]["ok"] is False
    assert report["dataset products: field prize"]["hint"]
    assert report["database"]["ok"]
    assert report["cloud token"]["ok"]


def test_the_token_check_is_one_call_counted_in_the_shared_budget(
    tmp_path: Path, database_url: str, account: SimServer, redis_db: Redis
) -> None:
    """The doctor spends from the budget every process shares: account, sitemaps, the sitemap."""
    budget = RedisApiBudget(
        Redis.from_url(REDIS_URL), account_key=account_key_for(API_TOKEN), limit=200, window=900
    )
    assert budget.remaining() == 200
    calls_before = account.state.calls
    done = doctor(tmp_path, database_url, account, GOOD_DATASETS)
    assert done.returncode == 0, done.stdout
    spent = account.state.calls - calls_before
    assert spent == 3  # GET account, GET sitemaps, GET sitemap/1
    assert budget.remaining() == 200 - spent


def test_a_wrong_token_missing_variables_and_secret_each_fail_with_a_hint(
    tmp_path: Path, database_url: str, account: SimServer, redis_db: Redis
) -> None:
    """A refused token, an unset status token and an unset destination secret: three failures."""
    done = doctor(
        tmp_path,
        database_url,
        account,
        GOOD_DATASETS,
        "--json",
        WEBSCRAPER_API_TOKEN="not-the-token",
        SCRAPESYNC_STATUS_TOKEN="",
        PRODUCTS_HOOK_SECRET="",
    )
    assert done.returncode == 1
    report = checks(done)
    failed = sorted(name for name, check in report.items() if not check["ok"])
    destination = "dataset products: destination https://receiver.example/hooks"
    assert failed == ["cloud token", destination, "variable SCRAPESYNC_STATUS_TOKEN"]
    assert "401" in report["cloud token"]["detail"]
    assert "WEBSCRAPER_API_TOKEN" in report["cloud token"]["hint"]
    assert "PRODUCTS_HOOK_SECRET" in report[destination]["detail"]
    assert "not-the-token" not in done.stdout + done.stderr


def test_a_fresh_database_fails_until_it_is_migrated_and_an_unknown_sitemap_fails(
    tmp_path: Path, account: SimServer, redis_db: Redis
) -> None:
    """On a fresh clone the doctor says to run the release command; a wrong sitemap is named."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    elsewhere = GOOD_DATASETS.replace('sitemap = "products"', 'sitemap = "produtcs"')
    done = doctor(tmp_path, url, account, elsewhere, "--json")
    assert done.returncode == 1
    report = checks(done)
    assert not report["database"]["ok"]
    assert "scrapesync db upgrade" in report["database"]["hint"]
    assert not report["dataset products: sitemap"]["ok"]
    assert "'produtcs'" in report["dataset products: sitemap"]["detail"]
    upgrade = subprocess.run(
        [str(BIN / "scrapesync"), "db", "upgrade"],
        env={"PATH": os.environ["PATH"], "DATABASE_URL": url},
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    again = doctor(tmp_path, url, account, GOOD_DATASETS)
    assert again.returncode == 0, again.stdout


def test_a_broken_datasets_file_and_an_unreachable_redis_are_named(
    tmp_path: Path, database_url: str, account: SimServer
) -> None:
    """The file's own error is shown with its path; a Redis that does not answer fails, and the
    token is still checked (on this process's own budget)."""
    broken = GOOD_DATASETS.replace('entity_key = ["sku"]', 'entity_key = ["web-scraper-order"]')
    done = doctor(
        tmp_path,
        database_url,
        account,
        broken,
        "--json",
        REDIS_URL="redis://127.0.0.1:1/0?socket_connect_timeout=1",
    )
    assert done.returncode == 1
    report = checks(done)
    failed = sorted(name for name, check in report.items() if not check["ok"])
    datasets = f"datasets file {tmp_path / 'datasets.toml'}"
    assert failed == [datasets, "redis"]
    assert "entity_key" in report[datasets]["detail"]
    assert "products" in report[datasets]["detail"]
    assert report["cloud token"]["ok"]
    assert not any(name.startswith("dataset products") for name in report)
