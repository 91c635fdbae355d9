"""A log line that carries an exception is written whole, secrets masked, even when its
traceback cannot be rendered the usual way (on Python 3.11, two threads rendering at once can
fail inside ``ast.parse``)."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from sync import logs, secrecy

SECRET = "render-secret-5c1d9e"


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """What a library's logger (Flask's, which scrapesync scrubs) writes, as the JSON formatter
    renders it."""
    logs.configure()
    secrecy.register(SECRET)
    sink = io.StringIO()
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logs.JsonFormatter())
    flask = logging.getLogger("webhooks")
    flask.addHandler(handler)
    yield sink
    flask.removeHandler(handler)


def failing_render(self: logging.Formatter, exc_info: object) -> str:
    """What Python 3.11 raises when another thread's parse overlaps this one's."""
    raise SystemError("AST constructor recursion depth mismatch (before=204, after=36)")


def fail_to_fetch() -> str:
    """A failure whose message quotes a secret."""
    raise ConnectionError(f"could not reach https://cloud.example/?token={SECRET}")


def assert_whole(line: str) -> None:
    """The line names its event, the exception with its message (masked), and the frame the
    exception came from."""
    entry = json.loads(line)
    assert entry["event"] == "notification.database_unavailable"
    assert "ConnectionError: could not reach https://cloud.example/?token=***" in entry["exception"]
    assert ", in fail_to_fetch" in entry["exception"]
    assert SECRET not in line


def test_a_scrapesync_line_whose_traceback_cannot_be_rendered_is_written_whole(
    lines: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scrapesync's own lines: the JSON formatter renders the traceback without its markers."""
    monkeypatch.setattr(logging.Formatter, "formatException", failing_render)
    try:
        fail_to_fetch()
    except ConnectionError:
        record = logs.get("intake").makeRecord(
            "scrapesync.intake",
            logging.ERROR,
            __file__,
            1,
            "notification.database_unavailable",
            (),
            sys.exc_info(),
        )
    assert_whole(logs.JsonFormatter().format(record))


def test_a_library_line_whose_traceback_cannot_be_rendered_is_written_whole(
    lines: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library's lines pass the scrubbing filter, which renders the traceback: the logging
    call returns instead of raising out of the code that logged."""
    monkeypatch.setattr(logging.Formatter, "formatException", failing_render)
    try:
        fail_to_fetch()
    except ConnectionError:
        logging.getLogger("webhooks").error("notification.database_unavailable", exc_info=True)
    assert_whole(lines.getvalue().splitlines()[-1])


def test_a_traceback_rendered_as_usual_keeps_its_markers(lines: io.StringIO) -> None:
    """Nothing failing: the line's traceback is Python's own, position markers included."""
    try:
        assert len(fail_to_fetch())  # the failing call is part of its line: Python marks it
    except ConnectionError:
        logging.getLogger("webhooks").error("request.failed", exc_info=True)
    exception = json.loads(lines.getvalue().splitlines()[-1])["exception"]
    assert "^^^^" in exception
    assert exception.endswith("ConnectionError: could not reach https://cloud.example/?token=***")
