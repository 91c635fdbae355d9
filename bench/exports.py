"""Realistic Cloud exports for the benchmarks, rendered once and served from memory.

A record carries what a product scrape usually yields: ``sku``, a ``title`` and a
``description`` (the two text fields), ``price``, ``retailer`` and two URLs, about 500 bytes as
a JSON Lines line with Cloud's two meta fields. Each export is rendered and gzipped once, before
any timing starts; the download is then served from those bytes, so the timed importer pays for
reading the socket, gunzip and everything after it, never for rendering the export.

The rest of the Cloud API (the job, its status and counters) is the simulator's.
"""

from __future__ import annotations

import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

PARTITIONS = ("alpha.example", "beta.example", "gamma.example")
ORDER_TIME = 1_764_000_000
CHUNK_BYTES = 256 * 1024
_MASK64 = (1 << 64) - 1
_WORDS = (
    "compact", "durable", "quiet", "bright", "stainless", "modular", "wireless", "foldable",
    "rechargeable", "ergonomic", "lightweight", "weatherproof", "adjustable", "premium", "classic",
    "portable",
)  # fmt: skip
_NOUNS = (
    "Kettle", "Lamp", "Backpack", "Blender", "Headphones", "Toaster", "Drill", "Speaker",
    "Monitor", "Keyboard", "Camera", "Heater", "Router", "Watch", "Grinder", "Tent",
)  # fmt: skip
_SENTENCES = tuple(
    f"The {a} {n.lower()} comes with a {b} case and a two-year warranty."
    for a in _WORDS[:8]
    for b, n in zip(_WORDS[8:], _NOUNS[:8], strict=True)
)


def _mix(seed: int, index: int) -> int:
    """A well-spread 64-bit hash of (seed, index) (splitmix64 finaliser)."""
    z = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


_SKU_MODULUS = 2_147_483_647  # a prime: index -> SKU below is one to one for any export size
_SKU_FACTOR = 1_327_217_885  # about the prime over the golden ratio: neighbours land far apart


def sku_of(index: int) -> str:
    """The SKU of a record: unique, and in no particular order along the export (as a crawl
    finds products), so the tables keyed by it are written the way real exports write them."""
    return f"SKU-{(index * _SKU_FACTOR + 12_345) % _SKU_MODULUS:010d}"


def record_line(index: int, seed: int, order: int) -> str:
    """One product record as Cloud's JSON Lines spell it (meta fields first, slashes escaped)."""
    h = _mix(seed, index)
    host = PARTITIONS[index % len(PARTITIONS)]
    cents = 199 + (h >> 16) % 99_800
    s = _SENTENCES
    description = f"{s[h & 63]} {s[(h >> 6) & 63]} {s[(h >> 24) & 63]}"
    noun = _NOUNS[(h >> 36) & 15]
    return (
        f'{{"web-scraper-order":"{ORDER_TIME}-{order}",'
        f'"web-scraper-start-url":"https:\\/\\/{host}\\/",'
        f'"sku":"{sku_of(index)}",'
        f'"title":"{_WORDS[(h >> 40) & 15].capitalize()} {noun} {index} by {host}",'
        f'"description":"{description}",'
        f'"price":"{cents // 100}.{cents % 100:02d}",'
        f'"retailer":"{host}",'
        f'"url":"https:\\/\\/{host}\\/p\\/{index}",'
        f'"image_url":"https:\\/\\/img.{host}\\/{noun.lower()}\\/{index}.jpg"}}\n'
    )


@dataclass(frozen=True)
class RenderedExport:
    """A job's whole gzip JSON Lines export held in memory."""

    chunks: tuple[bytes, ...]
    records: int
    raw_bytes: int

    @property
    def gzip_bytes(self) -> int:
        """Size of the body on the wire."""
        return sum(len(c) for c in self.chunks)

    @property
    def record_bytes(self) -> float:
        """Average size of one record's JSON Lines line."""
        return self.raw_bytes / self.records if self.records else 0.0


def render(n: int, *, changed: Callable[[int], bool] = lambda _: False) -> RenderedExport:
    """Render and gzip an export of ``n`` records; a record for which ``changed(index)`` holds
    comes from another seed (same SKU, other title, description and price)."""
    return render_lines(
        (record_line(index, 1 if changed(index) else 0, index + 1) for index in range(n)), n
    )


def render_lines(lines: Iterable[str], n: int) -> RenderedExport:
    """Gzip ``n`` JSON Lines lines (each ending in a line break) into an export."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)  # nginx gzip_comp_level default
    chunks: list[bytes] = []
    parts: list[str] = []
    size = raw = 0
    for line in lines:
        parts.append(line)
        size += len(line)
        if size >= CHUNK_BYTES:
            data = "".join(parts).encode()
            raw += len(data)
            chunks.append(compressor.compress(data))
            parts, size = [], 0
    data = "".join(parts).encode()
    raw += len(data)
    chunks.append(compressor.compress(data))
    chunks.append(compressor.flush())
    return RenderedExport(tuple(c for c in chunks if c), n, raw)


class MemoryExports:
    """WSGI middleware: a job's JSON download comes from a rendered export when one is set,
    everything else from the wrapped simulator app. A served download counts as an API call.
    ``latency`` (seconds) is waited before every answer: the round trip to a Cloud that is not
    on the same machine."""

    def __init__(self, app: Any, prefix: str, on_call: Callable[[], None]) -> None:
        self.app = app
        self.on_call = on_call
        self.latency = 0.0
        self._path = re.compile(re.escape(prefix) + r"/scraping-job/([0-9]+)/json")
        self._exports: dict[int, RenderedExport] = {}
        self._lock = threading.Lock()

    def set(self, job_id: int, export: RenderedExport | None) -> None:
        """Serve ``export`` as the job's download (None: back to the simulator's own)."""
        with self._lock:
            if export is None:
                self._exports.pop(job_id, None)
            else:
                self._exports[job_id] = export

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        """Answer one request."""
        if self.latency:
            time.sleep(self.latency)
        match = self._path.fullmatch(environ.get("PATH_INFO", ""))
        export = None
        if match is not None:
            with self._lock:
                export = self._exports.get(int(match[1]))
        if export is None:
            result: Iterable[bytes] = self.app(environ, start_response)
            return result
        self.on_call()
        start_response(
            "200 OK",
            [
                ("Content-Type", "application/json"),
                ("Content-Encoding", "gzip"),
                ("Content-Length", str(export.gzip_bytes)),
                ("Vary", "Accept-Encoding"),
            ],
        )
        return iter(export.chunks)


class _QuietHandler(WSGIRequestHandler):
    """No access log."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Log nothing."""


class ExportServer:
    """The simulated Cloud with in-memory downloads, on a loopback socket in a daemon thread."""

    def __init__(self, app: MemoryExports, prefix: str) -> None:
        self.exports = app
        self._server: BaseWSGIServer = make_server(
            "127.0.0.1", 0, app, threaded=True, request_handler=_QuietHandler
        )
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self.api_url = f"{self.url}{prefix}/"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()


def iter_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The lines of a gzip JSON Lines body, as bytes without their line break."""
    gunzip = zlib.decompressobj(31)
    pending = b""
    for chunk in chunks:
        data = pending + gunzip.decompress(chunk)
        lines = data.split(b"\n")
        pending = lines.pop()
        yield from lines
    pending += gunzip.flush()
    if pending:
        yield pending
