"""An export's body as lines: gunzipped piece by piece, never held whole, never cut short.

A download yields complete lines only. A line longer than the limit is streamed past and comes
as a SkippedLine (so is one that is not UTF-8); a body that ends early (Content-Length not
reached, a gzip stream without its trailer, a connection lost, a last line cut short) raises
DownloadIncompleteError instead of yielding a truncated dataset.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Protocol

import httpx

from sync.cloud.errors import CloudError, DownloadIncompleteError

INFLATE_PIECE: Final = 1 << 20
DEFAULT_MAX_LINE_BYTES: Final = 4 << 20


@dataclass(frozen=True, slots=True)
class SkippedLine:
    """A line of an export that was not kept: longer than the limit (streamed past, never held
    whole) or not UTF-8. ``size`` is its length in bytes, line break included."""

    size: int
    reason: str


Line = bytes | SkippedLine  # a line of an export as a download hands it on, without its break
BOM: Final = "\ufeff".encode()  # a byte order mark, which the first line of an export may have


@dataclass(frozen=True, slots=True)
class InvalidRecord:
    """A line of a scraping job's export that cannot be stored: its line number, a stable
    reason code and what was wrong."""

    line: int
    reason: str
    detail: str
    partition: str | None = None


KNOWN_RUN: Final = 1000  # known lines handed on together, at most


@dataclass(frozen=True, slots=True)
class KnownLines:
    """Consecutive lines of an export (blank lines aside) that the caller recognised and that
    were not parsed, at most KNOWN_RUN of them: ``indexes`` is what the caller's recognition
    said about each, in order."""

    indexes: list[int]


class PieceTap(Protocol):
    """Sees a download's body as it comes, gunzipped, piece by piece; told to start over when
    the download is tried again (only ever before a line of it was handed on)."""

    def restart(self) -> None:
        """Forget the pieces seen so far."""

    def feed(self, data: bytes) -> None:
        """See the next piece of the body."""


class _Gunzip:
    """Incremental gzip decoder that can tell a complete stream from one cut short."""

    def __init__(self) -> None:
        self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 16)
        self._started = False

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """Decompress one chunk of the wire body (members may follow one another) in pieces of
        at most INFLATE_PIECE bytes, so a small chunk that inflates to gigabytes (a gzip bomb)
        never sits in memory at once."""
        while chunk:
            if self._decoder.eof:  # a second gzip member follows the first
                self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 16)
            self._started = True
            piece = self._decoder.decompress(chunk, INFLATE_PIECE)
            if piece:
                yield piece
            if self._decoder.eof:
                chunk = self._decoder.unused_data
            else:
                chunk = self._decoder.unconsumed_tail

    def complete(self) -> bool:
        """Whether the stream ended on a gzip member's trailer (or never started)."""
        return not self._started or self._decoder.eof


def _split_block(block: bytes, limit: int) -> list[bytes | SkippedLine]:
    """The complete lines of ``block``, which ends in a line break, each without its break; a
    line over ``limit`` bytes or not UTF-8 becomes a SkippedLine. (Lines stay bytes: the JSON
    parser reads them as they are, and a line's digest is taken of them.)"""
    lines = block.split(b"\n")
    lines.pop()
    try:  # a block that ends on a line break never splits a UTF-8 character
        block.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        if len(block) <= limit or max(map(len, lines)) <= limit:  # no line is over the limit
            return lines  # type: ignore[return-value]  # list is invariant: these are all bytes
    found: list[bytes | SkippedLine] = []
    for raw in lines:  # find the lines that are too long or not UTF-8
        if len(raw) > limit:
            found.append(SkippedLine(len(raw) + 1, "line_too_long"))
            continue
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            found.append(SkippedLine(len(raw) + 1, "not_utf8"))
        else:
            found.append(raw)
    return found


def is_json(line: str) -> bool:
    """Whether a line parses as JSON: the last line of a JSON Lines export is whole."""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def body_blocks(
    response: httpx.Response,
    path: str,
    *,
    final_line_ok: Callable[[str], bool],
    limit: int,
    scrub: Callable[[str], str],
    tap: Callable[[bytes], None] | None = None,
) -> Iterator[list[Line]]:
    """The lines of a streamed export response, each bytes (valid UTF-8, its line break cut
    off) or a SkippedLine, handed on a gunzipped piece at a time (a list of the piece's complete
    lines, never empty); DownloadIncompleteError if the body turns out cut short. ``tap`` gets
    every piece of the body as it comes, gunzipped, before its lines are handed on."""
    body = _Body(response, path, scrub)
    lines = _Lines(limit)
    for piece in body.pieces():
        if tap is not None:
            tap(piece)
        yield from lines.feed(piece)
    body.check_complete()
    yield from lines.rest(path, final_line_ok)


class _Body:
    """An export response's body as it comes off the wire, gunzipped, its bytes counted."""

    def __init__(self, response: httpx.Response, path: str, scrub: Callable[[str], str]) -> None:
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("gzip", "identity", ""):
            raise CloudError(f"GET {path}: unexpected Content-Encoding {encoding!r}")
        self._response = response
        self._path = path
        self._scrub = scrub
        self._gunzip = _Gunzip() if encoding == "gzip" else None
        length = response.headers.get("Content-Length")
        self._expected = int(length) if length is not None and length.isdigit() else None
        self._received = 0

    def pieces(self) -> Iterator[bytes]:
        """The body's pieces, gunzipped; DownloadIncompleteError if the connection is lost."""
        chunks = self._response.iter_raw()
        while True:
            failure: CloudError | None = None
            try:
                chunk = next(chunks, None)
            except (httpx.HTTPError, OSError) as exc:
                failure = DownloadIncompleteError(
                    f"GET {self._path}: connection lost after {self._received} bytes: "
                    f"{type(exc).__name__}: {self._scrub(str(exc))}"
                )
            if failure is not None:  # raised here, not in the handler: no httpx exception chained
                raise failure
            if chunk is None:
                return
            self._received += len(chunk)
            yield from self._inflate(chunk)

    def _inflate(self, chunk: bytes) -> Iterator[bytes]:
        """One chunk off the wire as the pieces it inflates to; DownloadIncompleteError if the
        gzip stream is corrupt."""
        gunzip = self._gunzip
        pieces: Iterator[bytes] = iter((chunk,)) if gunzip is None else gunzip.feed(chunk)
        while True:
            failure: CloudError | None = None
            try:
                data = next(pieces, None)
            except zlib.error:
                failure = DownloadIncompleteError(f"GET {self._path}: gzip stream is corrupt")
            if failure is not None:
                raise failure
            if data is None:
                return
            yield data

    def check_complete(self) -> None:
        """DownloadIncompleteError if the body ended before its Content-Length or gzip trailer."""
        failure: CloudError | None = None
        if self._expected is not None and self._received < self._expected:
            failure = DownloadIncompleteError(
                f"GET {self._path}: body has {self._received} of {self._expected} bytes "
                "(Content-Length)"
            )
        elif self._gunzip is not None and not self._gunzip.complete():
            failure = DownloadIncompleteError(f"GET {self._path}: gzip stream ends early")
        if failure is not None:
            raise failure


class _Lines:
    """Cuts a body's pieces into complete lines, streaming past a line longer than the limit."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pending = bytearray()
        self._skipping = -1  # bytes of an over-long line streamed past so far; -1: not skipping

    def feed(self, data: bytes) -> Iterator[list[Line]]:
        """The lines a piece completes, as a list (none when it completes no line)."""
        if self._skipping >= 0:  # inside an over-long line: drop bytes up to its line break
            end = data.find(b"\n")
            if end < 0:
                self._skipping += len(data)
                return
            yield [SkippedLine(self._skipping + end + 1, "line_too_long")]
            self._skipping = -1
            data = data[end + 1 :]
        pending = self._pending
        pending += data
        cut = pending.rfind(b"\n")
        if cut >= 0:
            with memoryview(pending) as view:  # one copy of the lines, not two
                lines = _split_block(bytes(view[: cut + 1]), self._limit)
            del pending[: cut + 1]
            yield lines
        if len(pending) > self._limit:  # the line under way is already too long
            self._skipping = len(pending)
            pending.clear()

    def rest(self, path: str, final_line_ok: Callable[[str], bool]) -> Iterator[list[Line]]:
        """The line the body ends on without a break; DownloadIncompleteError if it is cut
        short."""
        failure: CloudError | None = None
        last = ""
        if self._pending:
            try:
                last = self._pending.decode("utf-8")
            except UnicodeDecodeError:
                failure = DownloadIncompleteError(f"GET {path}: last line ends mid-character")
        if failure is None and last and not final_line_ok(last):
            failure = DownloadIncompleteError(f"GET {path}: last line is cut short")
        if failure is not None:
            raise failure
        if self._skipping >= 0:
            yield [SkippedLine(self._skipping, "line_too_long")]
        if last:
            yield [bytes(self._pending)]
