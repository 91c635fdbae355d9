"""The drill ground's fixtures: the Procfile's processes started for real and killed as
production kills them, and private PostgreSQL and Redis servers that a drill may stop, kill,
flush and start again (``scrapesync.processes`` and ``scrapesync.servers``, which the user's
drill, ``python -m scrapesync.drill``, runs on too)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scrapesync.processes import Deployment
from scrapesync.servers import PrivatePostgres, PrivateRedis


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """The processes a drill starts; all killed at the end."""
    plant = Deployment(tmp_path)
    yield plant
    plant.stop_all()


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A private, empty Redis; stopped at the end."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (.ci/run installs it)")
    server = PrivateRedis()
    server.start()
    yield server
    if server.running():
        server.resume()  # a paused server dies only once it runs again
        server.kill()


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL cluster with max_connections = 10, shared by a module's drills."""
    folder = Path(tempfile.mkdtemp(prefix="scrapesync-pg-"))
    cluster = PrivatePostgres(folder)
    try:
        cluster.create()
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            cluster.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)
