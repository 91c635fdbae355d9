"""The worker's logs: RQ's own lines and scrapesync's, one JSON object per line on stdout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from simulator import CloudState
from simulator.server import SimServer
from tests.harness import (
    API_TOKEN,
    WEBHOOK_TOKEN,
    deployment_env,
    notify,
    products_sitemap,
    run_worker,
)

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_a_real_workers_stdout_is_json_line_by_line(
    tmp_path: Path, database_url: str, sim: SimServer, web: Flask, cloud: CloudState
) -> None:
    """The Procfile's worker syncs a job; every stdout line, RQ's included, parses as JSON."""
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.run_job(job_id, n=50)
    notify(web, job_id)
    done = run_worker(deployment_env(tmp_path, database_url=database_url, sim=sim))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    entries: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        entry = json.loads(line)
        assert isinstance(entry, dict), f"line {number} is not a JSON object: {line!r}"
        assert {"ts", "level", "logger", "event"} <= set(entry), line
        entries.append(entry)
    loggers = {entry["logger"] for entry in entries}
    assert "rq.worker" in loggers, loggers
    assert any(name.startswith("scrapesync.") for name in loggers), loggers
    assert any("started with PID" in entry["event"] for entry in entries)
    assert any(entry.get("task_key") == f"job-{job_id}" for entry in entries)
    assert done.stderr == "", done.stderr[-2000:]
    assert API_TOKEN not in done.stdout
    assert WEBHOOK_TOKEN not in done.stdout
