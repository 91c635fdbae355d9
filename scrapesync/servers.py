"""Private PostgreSQL and Redis servers of a drill's own, on free loopback ports, that it may
stop at once, kill, flush, pause and start again without touching anybody else's data."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
from pathlib import Path

from redis import Redis
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from scrapesync.processes import free_port, wait_until
from sync import db
from sync.db import UnitOfWork
from sync.models import Base


class ServerError(Exception):
    """A private server could not be found or started; the message names the program."""


class PrivateRedis:
    """A redis-server of the drill's own, that it may kill and restart empty."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start an empty server (nothing saved, nothing loaded) and wait for it to answer."""
        program = shutil.which("redis-server")
        if program is None:
            raise ServerError("redis-server is not installed")
        self.process = subprocess.Popen(  # noqa: S603 - a fixed argv, no shell
            [
                program,
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no"),
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

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open and nothing answers (a hung Redis)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def running(self) -> bool:
        """Whether the server process is alive."""
        return self.process is not None and self.process.poll() is None

    def client(self) -> Redis:
        """A connection to it."""
        return Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=5)


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    program = shutil.which(name)
    if program is None:
        raise ServerError(f"PostgreSQL's {name} is not installed")
    return program


class PrivatePostgres:
    """A PostgreSQL cluster of the drill's own (as the ``postgres`` user when run as root) that
    it may stop at once and start again."""

    def __init__(self, folder: Path, *, max_connections: int = 10) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.port = free_port()
        self.max_connections = max_connections
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/drill"

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(  # noqa: S603 - PostgreSQL's own programs, no shell
            [*prefix, *argv],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
        )

    def create(self, *, migrate: bool = True) -> None:
        """initdb, start, create the database and (unless told not to) migrate it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        self._run(
            _pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"
        )
        self.start()
        self._run(
            _pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "drill"
        )
        if migrate:
            db.upgrade(self.url)

    def start(self) -> None:
        """Start the cluster and wait until it accepts connections."""
        options = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1 "
            f"-c max_connections={self.max_connections} "
            f"-c unix_socket_directories={self.folder} -c fsync=off -c full_page_writes=off"
        )
        self._run(
            _pg_bin("pg_ctl"),
            *("-D", str(self.data), "-o", options, "-w", "-t", "60"),
            *("-l", str(self.folder / "server.log"), "start"),
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the cluster (``immediate``: as a crash, no checkpoint, sessions cut)."""
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

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
