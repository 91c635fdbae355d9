"""Cloud's API rate limit: a fixed window of N calls per token, as Laravel's throttle counts it.

The window opens at a token's first counted call and lasts ``window`` seconds of the state's
clock. A call refused with 429 is not counted. Only requests with a valid token reach this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Verdict:
    """The throttle's answer for one call: allowed or not, calls left, when the window ends."""

    allowed: bool
    remaining: int
    reset_at: float

    def retry_after(self, now: float) -> int:
        """Return whole seconds until the window ends (Retry-After)."""
        return max(0, math.ceil(self.reset_at - now))


@dataclass
class Throttle:
    """Per-token fixed-window call counters."""

    windows: dict[str, tuple[float, int]] = field(default_factory=dict)

    def _window(self, token: str, now: float, window: float) -> tuple[float, int]:
        """Return the token's current (start, used) window, opening a fresh one if it ended."""
        start, used = self.windows.get(token, (now, 0))
        if now >= start + window:
            start, used = now, 0
        return start, used

    def peek(self, token: str, now: float, limit: int, window: float) -> Verdict:
        """Report the token's standing without counting a call."""
        start, used = self._window(token, now, window)
        return Verdict(used < limit, max(0, limit - used), start + window)

    def hit(self, token: str, now: float, limit: int, window: float) -> Verdict:
        """Count one call if the window allows it."""
        start, used = self._window(token, now, window)
        if used >= limit:
            self.windows[token] = (start, used)
            return Verdict(False, 0, start + window)
        self.windows[token] = (start, used + 1)
        return Verdict(True, limit - used - 1, start + window)
