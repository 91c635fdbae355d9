"""Impossible input stops at the door: windows that are not on the calendar, and reruns that
would launch the same recovery twice."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from sync.models import Run
from tests.harness import datasets_from

WEEKLY = """
[datasets.weekly]
sitemap = "products"
entity_key = ["sku"]
window = "weekly"
"""


@pytest.fixture
def weekly(services: Services) -> Services:
    """The deployment with a weekly dataset beside the daily ``products``."""
    from sync import bootstrap

    both = datasets_from(
        WEEKLY + "\n" + '[datasets.products]\nsitemap = "products"\nentity_key = ["sku"]\n'
    )
    changed = dataclasses.replace(services, datasets=both)
    bootstrap.use(changed)
    return changed


@pytest.mark.parametrize(
    ("dataset", "window"),
    [
        ("weekly", "2026-W54"),
        ("weekly", "2026-W99"),
        ("weekly", "2026-W00"),
        ("products", "2026-02-30"),
        ("products", "2026-13-01"),
    ],
)
def test_a_window_that_is_not_on_the_calendar_exits_before_any_cloud_call(
    weekly: Services, cloud: CloudState, dataset: str, window: str
) -> None:
    """`launch --window 2026-W54` (or W99, or 2026-02-30) exits non-zero, names the window, and
    neither Cloud nor the database saw it."""
    result = CliRunner().invoke(main, ["launch", dataset, "--window", window])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert window in result.output
    assert "on the calendar" in result.output
    assert cloud.requests == []
    assert cloud.jobs == {}
    with weekly.uow.begin() as session:
        assert session.execute(select(Run)).first() is None


def test_real_weeks_and_days_launch(weekly: Services, cloud: CloudState) -> None:
    """2026-W53 exists (2026 has 53 ISO weeks) and so does 2028-02-29: both launch."""
    for dataset, window in (("weekly", "2026-W53"), ("products", "2028-02-29")):
        result = CliRunner().invoke(main, ["launch", dataset, "--window", window])
        assert result.exit_code == 0, result.output
    assert len(cloud.jobs) == 2
