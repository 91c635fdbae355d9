"""``reconcile`` with the API budget spent says how long it would wait, waits only with
``--wait``, and an incomplete pass is incomplete, in its own report and in ``status``."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from scrapesync.cli import main
from simulator import CloudState
from sync import bootstrap
from sync.bootstrap import Services
from sync.cloud.budget import MemoryApiBudget
from tests.operations.test_reconcile import _cloud_with, _finished_job

pytestmark = pytest.mark.redis


def test_a_spent_budget_ends_the_pass_at_once_and_says_how_long_it_would_wait(
    services: Services, cloud: CloudState
) -> None:
    """No silent ten-minute wait: the pass ends at once, names the wait a complete listing
    needs and --wait, exits 3, and `status` calls the pass incomplete, not done."""
    _finished_job(cloud, n=4)
    bootstrap.use(_cloud_with(services, cloud, MemoryApiBudget(limit=0, window=600.0)))
    started = time.monotonic()
    result = CliRunner().invoke(main, ["reconcile"])
    assert time.monotonic() - started < 10
    assert result.exit_code == 3, result.output
    assert "INCOMPLETE" in result.output
    assert "API budget" in result.output
    assert "would wait 60" in result.output  # the budget's 600 s window, plus the margin
    assert "--wait" in result.output
    as_json = json.loads(CliRunner().invoke(main, ["reconcile", "--json"]).output)
    assert as_json["complete"] is False
    assert as_json["would_wait_seconds"] >= 600
    assert as_json["waited_seconds"] == 0
    shown = json.loads(CliRunner().invoke(main, ["status", "--json"]).output)
    assert shown["last_reconcile"]["state"] == "incomplete"
    assert shown["last_reconcile"]["complete"] is False
    text = CliRunner().invoke(main, ["status"]).output
    (line,) = [x for x in text.splitlines() if x.startswith("last reconcile:")]
    assert "(incomplete," in line
    assert "INCOMPLETE" in line


def test_with_wait_the_pass_waits_for_the_budget_and_completes(
    services: Services, cloud: CloudState
) -> None:
    """`reconcile --wait` waits the time the budget names (a one-second window here), then
    lists whole and exits 0."""
    _finished_job(cloud, n=4)
    budget = MemoryApiBudget(limit=1, window=1.0)
    budget.acquire()  # the window's one call is spent
    bootstrap.use(_cloud_with(services, cloud, budget))
    result = CliRunner().invoke(main, ["reconcile", "--wait", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["complete"] is True
    assert report["waited_seconds"] > 0
    assert report["listed"] == 1
