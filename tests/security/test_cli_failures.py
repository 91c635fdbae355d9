"""The CLI never shows a traceback for an expected failure: one ``error:`` line naming what
failed, and a non-zero exit status."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from click.testing import CliRunner, Result

from config.datasets import Datasets
from scrapesync.cli import main
from simulator import CloudState
from simulator import create_app as create_simulator
from sync import bootstrap
from sync.bootstrap import Services
from sync.db import UnitOfWork
from tests.security.conftest import echoing_422, leaked, stored_text

pytestmark = pytest.mark.redis


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def redis_down(
    services: Services, uow: UnitOfWork, cloud: CloudState, datasets: Datasets
) -> Iterator[Services]:
    """The deployment's services with REDIS_URL pointing at a port where nothing listens."""
    settings = replace(services.settings, redis_url=f"redis://127.0.0.1:{_closed_port()}/0")
    built = bootstrap.build(
        settings,
        uow=uow,
        datasets=datasets,
        transport=httpx.WSGITransport(app=create_simulator(cloud)),
    )
    bootstrap.use(built)
    yield built
    bootstrap.use(services)


def _one_error_line(result: Result, *, naming: str) -> None:
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ")
    assert naming in line


@pytest.mark.parametrize(
    "args", [["reconcile"], ["reconcile", "--json"], ["launch", "products"]], ids=" ".join
)
def test_redis_down_is_one_error_line(redis_down: Services, args: list[str]) -> None:
    """Reconcile and launch with Redis unreachable name Redis in one line and exit non-zero."""
    _one_error_line(CliRunner().invoke(main, args), naming="Redis")


@pytest.mark.parametrize("status", [500, 401])
def test_cloud_failing_during_launch_is_one_error_line(
    services: Services, cloud: CloudState, status: int
) -> None:
    """Cloud answering a 5xx or refusing the token while launching: one line naming Cloud's
    answer, no traceback."""
    cloud.inject_fault("status", path_contains="scraping-job", times=None, status=status)
    result = CliRunner().invoke(main, ["launch", "products", "--window", "2026-12-02"])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert f"HTTP {status}" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_launch_prints_one_error_line_without_the_secret_cloud_echoes(
    guarded: Services, cloud: CloudState
) -> None:
    """Cloud refuses the create with a 422 quoting every secret: one error line, no traceback,
    a non-zero exit, and the stored launch error is masked too."""
    echoing_422(cloud, "scraping-job", method="POST")
    result = CliRunner().invoke(main, ["launch", "products", "--window", "2026-12-02"])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert result.output.startswith("error: ")
    assert len(result.output.strip().splitlines()) == 1
    assert leaked(result.output) == []
    assert leaked(stored_text(guarded)) == []
