"""The web process as the Procfile starts it (gunicorn), fed broken HTTP on a real socket."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import BIN, WEBHOOK_TOKEN, write_datasets

pytestmark = [pytest.mark.slow, pytest.mark.redis]

PATH = f"/webhooks/webscraper/{WEBHOOK_TOKEN}"


def _web_line() -> str:
    procfile = Path(__file__).resolve().parents[2] / "Procfile"
    for line in procfile.read_text().splitlines():
        if line.startswith("web:"):
            return line.removeprefix("web:").strip()
    raise AssertionError("the Procfile has no web line")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def web_process(database_url: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The Procfile's web line running on a free port, with its own home folder."""
    from tests.conftest import REDIS_URL

    port = _free_port()
    home = tmp_path / "home"
    home.mkdir()
    datasets = write_datasets(
        tmp_path, '[datasets.products]\nsitemap = "products"\nentity_key = ["sku"]\n'
    )
    env = {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "PORT": str(port),
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
        "WEBHOOK_TOKEN": WEBHOOK_TOKEN,
        "SCRAPESYNC_DATASETS": str(datasets),
    }
    web = subprocess.Popen(
        ["sh", "-c", f"exec {_web_line()}"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(150):
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield port, home
    finally:
        web.terminate()
        web.wait(timeout=15)


def _exchange(port: int, request: bytes) -> int:
    """Send raw bytes, half-close, and return the answer's status code."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        try:
            conn.sendall(request)
            conn.shutdown(socket.SHUT_WR)
        except OSError:  # the server may answer and close before it has read everything
            pass
        answer = b""
        while b"\r\n" not in answer:
            piece = conn.recv(4096)
            if not piece:
                break
            answer += piece
    return int(answer.split(b" ", 2)[1])


def _chunked(body_chunks: list[bytes], *, raw_tail: bytes = b"0\r\n\r\n") -> bytes:
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: localhost\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in body_chunks)
    return head + chunks + raw_tail


def test_the_web_process_takes_chunked_notifications_and_refuses_broken_or_oversize_ones(
    web_process: tuple[int, Path], uow: object
) -> None:
    """A chunked notification is accepted; broken chunked encoding is a 400 and a chunked body
    over the limit a 413, never a 5xx."""
    port, _home = web_process
    good = _chunked([b"scrapingjob_id=77&", b"status=finished"])
    assert _exchange(port, good) == 200
    broken = _chunked([b"scrapingjob_id=78"], raw_tail=b"zz\r\nnot a chunk\r\n")
    assert _exchange(port, broken) == 400
    oversize = _chunked([b"scrapingjob_id=79&pad=", *[b"x" * 8192] * 10])
    assert _exchange(port, oversize) == 413


def test_the_web_process_creates_no_control_socket(web_process: tuple[int, Path]) -> None:
    """gunicorn's control socket would be shared by every app of the user: none is made."""
    port, home = web_process
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    made = [p for p in home.rglob("*") if p.is_socket() or p.suffix == ".ctl"]
    assert made == []
