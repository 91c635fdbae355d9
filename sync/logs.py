"""Structured logs: one JSON object per line on stdout, with run id, task key and attempt id."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from sync import secrecy

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line; extra fields become keys; secrets are masked."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = record.exc_text or secrecy.exception_text(record.exc_info)
        return secrecy.scrub(json.dumps(entry, default=str, ensure_ascii=False))


class StandardError(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that writes to whatever ``sys.stderr`` is when a line is logged."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        """The process's standard error now."""
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        """Kept on standard error whatever logging sets."""


def configure(level: int = logging.INFO, *, to_stderr: bool = False) -> None:
    """Send scrapesync's logs, and RQ's, to stdout as JSON lines (idempotent); a command that
    prints results on stdout sends them to stderr instead (``to_stderr``), so the first call of
    a process decides."""
    capture_rq(level, to_stderr=to_stderr)
    root = logging.getLogger("scrapesync")
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler: logging.Handler = StandardError() if to_stderr else logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    _scrub_foreign_loggers()


FOREIGN_LOGGERS = (
    "rq.worker",
    "rq.job",
    "rq.queue",
    "rq.scheduler",
    "httpx",
    "webhooks",
    "werkzeug",
)


def _scrub_foreign_loggers() -> None:
    """Libraries log through their own handlers; their lines are scrubbed of secrets too."""
    for name in FOREIGN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, secrecy.ScrubbingFilter) for f in logger.filters):
            logger.addFilter(secrecy.ScrubbingFilter())


def get(name: str) -> logging.Logger:
    """A logger under the ``scrapesync`` tree."""
    return logging.getLogger(f"scrapesync.{name}")


def capture_rq(level: int = logging.INFO, *, to_stderr: bool = False) -> None:
    """Route RQ's own log lines (worker, job, scheduler) through the JSON formatter on stdout.

    RQ gives ``rq.worker`` and ``rq.job`` plain-text handlers of their own (stdout, and stderr
    for errors), and adds them only where no handler is found up the logger tree. One JSON
    handler on ``rq`` replaces them, so the handlers RQ would add later are never added either.
    """
    parent = logging.getLogger("rq")
    if not any(isinstance(h.formatter, JsonFormatter) for h in parent.handlers):
        handler: logging.Handler = (
            StandardError() if to_stderr else logging.StreamHandler(sys.stdout)
        )
        handler.setFormatter(JsonFormatter())
        parent.addHandler(handler)
    parent.propagate = False
    if parent.level == logging.NOTSET or parent.level > level:
        parent.setLevel(level)
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("rq.") and isinstance(logger, logging.Logger):
            for own in list(logger.handlers):
                logger.removeHandler(own)
            logger.propagate = True
