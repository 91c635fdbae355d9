"""The drill ground: the Procfile's processes started for real, killed as production kills them
(every descendant at once), and private PostgreSQL and Redis servers that a drill may stop,
kill, flush and start again."""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import signal
import socket
import string
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from redis import Redis
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from sync import db
from sync.db import UnitOfWork
from sync.models import Base
from tests.harness import BIN

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    condition: Callable[[], object],
    *,
    timeout: float,
    every: float = 0.05,
    what: str = "",
    report: Callable[[], str] | None = None,
) -> float:
    """Poll ``condition`` until it is true; returns the seconds it took (fails after
    ``timeout``, with ``report()`` in the message)."""
    started = time.monotonic()
    while True:
        with contextlib.suppress(Exception):  # a server coming back may refuse a poll or two
            if condition():
                return time.monotonic() - started
        if time.monotonic() - started > timeout:
            detail = report() if report is not None else ""
            raise AssertionError(f"not within {timeout:.0f} s: {what}\n{detail}")
        time.sleep(every)


# --- processes ----------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.split("/")[2])
        tree.setdefault(int(fields[1]), []).append(pid)
    return tree


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (RQ's work horse calls setpgrp, so process groups miss it)."""
    tree = _children()
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_tree(process: subprocess.Popen[bytes], sig: signal.Signals) -> list[int]:
    """Send ``sig`` to ``process`` and every descendant; returns the pids signalled."""
    pids = [process.pid, *descendants(process.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process with all its descendants at once, as a crashed dyno dies: stop them
    all first, so none can fork or commit while the others die."""
    stopped = signal_tree(process, signal.SIGSTOP)
    for pid in {*stopped, *descendants(process.pid)}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=10)


def procfile_command(name: str, env: Mapping[str, str]) -> list[str]:
    """The Procfile's command for process ``name``, with its variables filled in."""
    for line in (ROOT / "Procfile").read_text().splitlines():
        key, _, command = line.partition(":")
        if key.strip() == name:
            argv = shlex.split(string.Template(command.strip()).substitute(env))
            argv[0] = str(BIN / argv[0])
            # a drill listens on loopback only
            return [a.replace("0.0.0.0:", "127.0.0.1:") for a in argv]
    raise KeyError(name)


@dataclass
class Deployment:
    """Starts the Procfile's processes for one drill and stops whatever is left at the end."""

    folder: Path
    processes: list[subprocess.Popen[bytes]]

    def start(self, name: str, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """Start process ``name`` of the Procfile (its output goes to a log in the folder)."""
        log = open(self.folder / f"{name}-{len(self.processes)}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(
            procfile_command(name, env),
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        log.close()
        self.processes.append(process)
        return process

    def start_web(self, env: Mapping[str, str]) -> str:
        """Start the web process and wait for it to answer; returns its base URL."""
        port = free_port()
        self.start("web", {**env, "PORT": str(port)})
        url = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: httpx.get(f"{url}/healthz", timeout=2).status_code < 600,
            timeout=30,
            what="the web process answers",
        )
        return url

    def logs(self) -> str:
        """Every process's output so far (for a failing drill's message)."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.folder.glob("*.log"))
        )

    def stop_all(self) -> None:
        """Kill whatever is still running."""
        for process in self.processes:
            if process.poll() is None:
                kill_tree(process)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """The processes a drill starts; all killed at the end."""
    plant = Deployment(tmp_path, [])
    yield plant
    plant.stop_all()


# --- a private Redis ----------------------------------------------------------------------------


class PrivateRedis:
    """A redis-server of the drill's own, on a free port, that it may kill and restart empty."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start an empty server and wait for it to answer."""
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self.client().ping, timeout=10, what="the private Redis answers")

    def kill(self) -> None:
        """SIGKILL the server: everything it held is gone."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def client(self) -> Redis:
        """A connection to it."""
        return Redis.from_url(self.url, socket_timeout=5)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A private, empty Redis; stopped at the end."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (.ci/run installs it)")
    server = PrivateRedis()
    server.start()
    yield server
    if server.process is not None and server.process.poll() is None:
        server.kill()


# --- a private PostgreSQL -----------------------------------------------------------------------


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    return shutil.which(name) or pytest.fail(f"PostgreSQL's {name} is not installed")


class PrivatePostgres:
    """A PostgreSQL cluster of the drill's own (run as the ``postgres`` user, on a free port,
    ``max_connections = 10``) that it may stop at once and start again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/drill"

    def _as_postgres(self, *argv: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
        )

    def create(self) -> None:
        """initdb, start, create the database and migrate it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.folder, "postgres")
        self._as_postgres(
            _pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"
        )
        self.start()
        self._as_postgres(
            _pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "drill"
        )
        db.upgrade(self.url)

    def start(self) -> None:
        """Start the cluster and wait until it accepts connections."""
        options = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1 -c max_connections=10 "
            f"-c unix_socket_directories={self.folder} -c fsync=off -c full_page_writes=off"
        )
        self._as_postgres(
            _pg_bin("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "-l",
            str(self.folder / "server.log"),
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the cluster (``immediate``: as a crash, no checkpoint, sessions cut)."""
        self._as_postgres(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def empty(self) -> None:
        """Delete every row, so that each drill starts from nothing."""
        engine = db.make_engine(self.url, poolclass=NullPool)
        names = ", ".join(t.name for t in Base.metadata.sorted_tables)
        with engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
        engine.dispose()

    def uow(self) -> UnitOfWork:
        """A unit of work that holds no idle connection (the drills count connections)."""
        return UnitOfWork(db.make_engine(self.url, poolclass=NullPool))


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
