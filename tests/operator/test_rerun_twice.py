"""``rerun`` is idempotent like ``launch``: the same pages asked twice make one Cloud job."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from flask import Flask

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from tests.operations.test_rerun import BROKEN, RUN_ID, _records, _run_job, rejected_run

pytestmark = pytest.mark.redis
__all__ = ["rejected_run"]


def _rerun(*extra: str) -> dict[str, object]:
    result = CliRunner().invoke(main, ["rerun", RUN_ID, "--partition", BROKEN, "--json", *extra])
    assert result.exit_code == 0, result.output
    values: dict[str, object] = json.loads(result.output)
    return values


def test_rerun_twice_launches_one_cloud_job_until_it_is_synced(
    web: Flask, services: Services, cloud: CloudState, rejected_run: int
) -> None:
    """Two `rerun --partition` in a row: one batch, one Cloud job; once that job is synced (and
    the partition still fails), the next rerun is a new batch."""
    first = _rerun()
    again = _rerun()
    assert again["batch_id"] == first["batch_id"] == f"{RUN_ID}~r1"
    assert again["job_id"] == first["job_id"]
    assert again["created_job"] is False
    assert "already launched" in str(again["message"])
    assert [j.id for j in cloud.jobs.values() if j.custom_id == first["batch_id"]] == [
        first["job_id"]
    ]
    recovery = [r for r in _records(broken=True) if r["retailer"] == BROKEN]
    _run_job(web, services, cloud, int(str(first["job_id"])), recovery)
    third = _rerun()
    assert third["batch_id"] == f"{RUN_ID}~r2"
    assert third["created_job"] is True
