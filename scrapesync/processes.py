"""The Procfile's processes started for real on one machine, and killed as production kills
them: every descendant at once, as a crashed dyno dies (a drill's ground; the recovery tests use
it too)."""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SOURCE_TREE = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # where this Python's gunicorn, rq and scrapesync live


class DeadlineError(Exception):
    """Something a drill waits for did not happen in time; the message says what."""


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
            raise DeadlineError(f"not within {timeout:.0f} s: {what}\n{detail}")
        time.sleep(every)


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


def procfile_command(
    name: str, env: Mapping[str, str], *, procfile: Path = SOURCE_TREE / "Procfile"
) -> list[str]:
    """The Procfile's command for process ``name``, with its variables filled in and its
    program taken from this Python's environment; it listens on loopback only."""
    for line in procfile.read_text().splitlines():
        key, _, command = line.partition(":")
        if key.strip() == name:
            argv = shlex.split(string.Template(command.strip()).substitute(env))
            if (BIN / argv[0]).exists():
                argv[0] = str(BIN / argv[0])
            return [a.replace("0.0.0.0:", "127.0.0.1:") for a in argv]
    raise KeyError(f"{procfile} has no process {name!r}")


@dataclass
class Deployment:
    """Starts the Procfile's processes in ``folder`` (each one's output in a log there) and
    stops whatever is left at the end."""

    folder: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    procfile: Path = SOURCE_TREE / "Procfile"

    def start(self, name: str, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """Start process ``name`` of the Procfile."""
        log = open(self.folder / f"{name}-{len(self.processes)}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(  # noqa: S603 - the Procfile's own command, no shell
            procfile_command(name, env, procfile=self.procfile),
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.procfile.parent,
        )
        log.close()
        self.processes.append(process)
        return process

    def run(self, name: str, env: Mapping[str, str], *, timeout: float = 300) -> None:
        """Run a one-off process of the Procfile (``release``) to its end; it must succeed."""
        process = self.start(name, env)
        if process.wait(timeout=timeout) != 0:
            raise RuntimeError(f"the {name} process failed:\n{self.logs()}")

    def start_web(self, env: Mapping[str, str], port: int | None = None) -> str:
        """Start the web process and wait for it to answer; returns its base URL."""
        port = port or free_port()
        self.start("web", {**env, "PORT": str(port)})
        url = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: httpx.get(f"{url}/healthz", timeout=2).status_code < 600,
            timeout=30,
            what="the web process answers",
            report=self.logs,
        )
        return url

    def logs(self) -> str:
        """The end of every process's output so far (for a failing drill's message)."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.folder.glob("*.log"))
        )

    def stop_all(self) -> None:
        """Kill whatever is still running."""
        for process in self.processes:
            if process.poll() is None:
                kill_tree(process)


class Supervisor:
    """A process manager for a drill: keeps each slot (a name and the Procfile process it runs)
    running, starting it again whenever it ends, sooner or later as it lived long or died at
    once; the web slot keeps its port, where Cloud sends the notifications."""

    def __init__(
        self, deployment: Deployment, env: Mapping[str, str], slots: Mapping[str, str]
    ) -> None:
        self.deployment = deployment
        self.env = dict(env)
        self.slots = dict(slots)
        self.web_port = free_port()
        self.restarts: dict[str, int] = dict.fromkeys(slots, 0)
        self._running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
        self._pause: dict[str, float] = dict.fromkeys(slots, 0.5)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="drill-supervisor", daemon=True)

    @property
    def web_url(self) -> str:
        """Where the web process listens."""
        return f"http://127.0.0.1:{self.web_port}"

    def start(self) -> None:
        """Start every slot (the web one first, answering before the others start), then watch."""
        for slot in sorted(self.slots, key=lambda s: self.slots[s] != "web"):
            self._launch(slot)
            if self.slots[slot] == "web":
                wait_until(
                    lambda: httpx.get(f"{self.web_url}/healthz", timeout=2).status_code < 600,
                    timeout=30,
                    what="the web process answers",
                    report=self.deployment.logs,
                )
        self._thread.start()

    def _launch(self, slot: str) -> None:
        name = self.slots[slot]
        env = {**self.env, "PORT": str(self.web_port)} if name == "web" else self.env
        with self._lock:
            self._running[slot] = (self.deployment.start(name, env), time.monotonic())

    def process(self, slot: str) -> subprocess.Popen[bytes]:
        """The process running in ``slot`` now."""
        with self._lock:
            return self._running[slot][0]

    def kill(self, slot: str) -> None:
        """SIGKILL the slot's process with every descendant; it is started again."""
        kill_tree(self.process(slot))

    def terminate(self, slot: str, grace: float = 30.0) -> None:
        """SIGTERM every process of the slot, as a platform stopping it does, and SIGKILL what
        is left after ``grace`` seconds; it is started again."""
        process = self.process(slot)
        signal_tree(process, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            kill_tree(process)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            for slot in self.slots:
                with self._lock:
                    process, since = self._running[slot]
                    if process.poll() is None:
                        continue
                    lived = time.monotonic() - since
                    pause = 0.5 if lived > 10 else min(self._pause[slot] * 2, 10.0)
                    self._pause[slot] = pause
                if self._stop.wait(pause):
                    return
                self.restarts[slot] += 1
                self._launch(slot)

    def running(self) -> bool:
        """Whether every slot's process runs now."""
        with self._lock:
            return all(p.poll() is None for p, _ in self._running.values())

    def stop(self) -> None:
        """Stop watching and kill every process."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        self.deployment.stop_all()
