"""What the operator sees: one-line errors with secrets masked, masked output, progress bars."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click
from redis.exceptions import RedisError
from sqlalchemy.exc import OperationalError

from config.datasets import DatasetsFileError
from config.settings import ConfigError
from sync import secrecy
from sync.cloud.errors import CloudError


class CommandError(click.ClickException):
    """An expected failure: one ``error:`` line (secrets masked) and a non-zero exit status."""

    def __init__(self, message: str) -> None:
        super().__init__(secrecy.scrub(message))

    def show(self, file: Any = None) -> None:
        """Print the one line on standard error."""
        click.echo(f"error: {self.format_message()}", err=True)


class SetupError(CommandError):
    """The deployment cannot start the command: settings, datasets file or database."""

    exit_code = 2


def failure_of(exc: BaseException) -> CommandError | None:
    """The one-line error an expected failure becomes, or None for a bug (which keeps its
    traceback)."""
    if isinstance(exc, ConfigError | DatasetsFileError):
        return SetupError(str(exc))
    if isinstance(exc, OperationalError):
        reason = str(exc.orig or exc).strip().splitlines()[0]
        return SetupError(f"cannot reach the database: {reason}")
    if isinstance(exc, RedisError):
        return CommandError(f"cannot reach Redis: {type(exc).__name__}: {exc}")
    if isinstance(exc, CloudError):
        return CommandError(f"Web Scraper Cloud refused or failed: {exc}")
    return None


def echo(text: str, *, err: bool = False) -> None:
    """Print a line of output with every secret masked."""
    click.echo(secrecy.scrub(text), err=err)


def echo_json(values: object) -> None:
    echo(json.dumps(values, indent=2, default=str, sort_keys=False))


class Progress:
    """One progress bar at a time on stderr, for long foreground work that a person watches;
    does nothing when disabled (output piped, or ``--json``)."""

    LABELS = {
        "records": "reading the job's records",
        "scraping-jobs": "listing Cloud jobs (pages)",
        "checks": "checking Cloud jobs",
        "export": "writing records",
    }

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._kind: str | None = None
        self._done = 0

    def __call__(self, kind: str, done: int, total: int | None) -> None:
        """``done`` of ``total`` units of work of this kind are behind us."""
        if not self.enabled or kind not in self.LABELS or not total:
            return
        if self._bar is None or kind != self._kind or done < self._done:
            self.close()
            self._bar = click.progressbar(length=total, label=self.LABELS[kind], file=sys.stderr)
            self._bar.__enter__()
            self._kind, self._done = kind, 0
        self._bar.update(done - self._done)
        self._done = done

    def reporter(self, kind: str) -> Callable[[int, int], None]:
        """A ``(done, total)`` callback that moves this kind's bar."""
        return lambda done, total: self(kind, done, total)

    def close(self) -> None:
        """End the bar on screen, if one is drawn."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        self._bar, self._kind, self._done = None, None, 0
