"""The Web Scraper Cloud API budget, shared by every process that uses one account's token.

Cloud allows 200 calls per 15 minutes per account (downloads included) and counts them in a
fixed window that opens with the first call, the way Laravel's throttle does. The budget
mirrors that window locally so that all web, worker and CLI processes together stay under it:

- `acquire()` takes one call before every request, or raises `ApiBudgetExhaustedError` with
  `retry_after` = seconds until the window frees.
- `observe()` reconciles with Cloud's `X-RateLimit-*` headers: when Cloud reports fewer calls
  remaining than we think, Cloud is right (someone else spends the same account); when Cloud
  sends `X-RateLimit-Reset` (only once its limit is hit), its reset time replaces ours.

Accounts are keyed by `account_key_for(token)`, a hash: the token itself never reaches Redis.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from redis import Redis

from sync.cloud.errors import ApiBudgetExhaustedError

DEFAULT_LIMIT: Final = 200
DEFAULT_WINDOW: Final = 900.0
KEY_PREFIX: Final = "scrapesync:api-budget:"


def account_key_for(token: str) -> str:
    """The account's budget key: sha256 of the API token, first 16 hex digits."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:16]


class ApiBudget(Protocol):
    """Calls left in the account's Cloud rate-limit window, shared by whoever holds it."""

    def acquire(self) -> None:
        """Take one API call, or raise ApiBudgetExhaustedError with retry_after."""

    def observe(self, *, remaining: int | None, limit: int | None, reset_at: float | None) -> None:
        """Reconcile with Cloud's X-RateLimit-Remaining, -Limit and -Reset headers."""

    def remaining(self) -> int:
        """Calls left in the current window."""


def _exhausted(
    limit: int, window: float, retry_after: float, account: str
) -> ApiBudgetExhaustedError:
    return ApiBudgetExhaustedError(
        f"API budget of account {account} spent ({limit} calls per {window:.0f} s); "
        f"next call in {retry_after:.1f} s",
        retry_after=retry_after,
    )


class MemoryApiBudget:
    """The API budget for one process (and for tests): same rules, kept in memory."""

    def __init__(
        self,
        *,
        limit: int = DEFAULT_LIMIT,
        window: float = DEFAULT_WINDOW,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._limit = limit
        self._window = window
        self._clock = clock
        self._used = 0
        self._reset_at = 0.0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryApiBudget(limit={self._limit}, window={self._window})"

    def _roll(self, now: float) -> None:
        if self._reset_at <= now:
            self._used = 0
            self._reset_at = now + self._window

    def acquire(self) -> None:
        """Take one API call, or raise ApiBudgetExhaustedError with retry_after."""
        with self._lock:
            now = self._clock()
            self._roll(now)
            if self._used >= self._limit:
                retry_after = max(0.0, self._reset_at - now)
            else:
                self._used += 1
                return
        raise _exhausted(self._limit, self._window, retry_after, "local")

    def observe(self, *, remaining: int | None, limit: int | None, reset_at: float | None) -> None:
        """Reconcile with Cloud's X-RateLimit-Remaining, -Limit and -Reset headers."""
        # `limit` is informational: Cloud's `remaining` alone says how many calls are left.
        with self._lock:
            now = self._clock()
            self._roll(now)
            if remaining is not None:
                self._used = max(self._used, self._limit - max(0, remaining))
            if reset_at is not None and reset_at > now:
                self._reset_at = reset_at

    def remaining(self) -> int:
        """Calls left in the current window."""
        with self._lock:
            if self._reset_at <= self._clock():
                return self._limit
            return max(0, self._limit - self._used)


# One hash per account: `used` and `reset_at` (unix seconds). Every change happens inside one
# script so that concurrent processes never lose an update. Times come from the caller's clock,
# so the key expires relative to now (PEXPIRE), never at an absolute time.
_ROLL: Final = """
local used = tonumber(redis.call('HGET', KEYS[1], 'used') or '0')
local reset_at = tonumber(redis.call('HGET', KEYS[1], 'reset_at') or '0')
local now = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
if reset_at <= now then
  used = 0
  reset_at = now + window
end
"""

_SAVE: Final = """
redis.call('HSET', KEYS[1], 'used', used, 'reset_at', string.format('%.6f', reset_at))
redis.call('PEXPIRE', KEYS[1], math.ceil((reset_at - now) * 1000) + 60000)
"""

_ACQUIRE: Final = (
    _ROLL
    + """
if used >= limit then
  return {0, string.format('%.6f', reset_at - now)}
end
used = used + 1
"""
    + _SAVE
    + """
return {1, tostring(limit - used)}
"""
)

_OBSERVE: Final = (
    _ROLL
    + """
if ARGV[4] ~= '' then
  local floor_used = limit - math.max(0, tonumber(ARGV[4]))
  if floor_used > used then used = floor_used end
end
if ARGV[5] ~= '' and tonumber(ARGV[5]) > now then
  reset_at = tonumber(ARGV[5])
end
"""
    + _SAVE
)

_REMAINING: Final = """
local used = tonumber(redis.call('HGET', KEYS[1], 'used') or '0')
local reset_at = tonumber(redis.call('HGET', KEYS[1], 'reset_at') or '0')
if reset_at <= tonumber(ARGV[1]) then return tonumber(ARGV[2]) end
return math.max(0, tonumber(ARGV[2]) - used)
"""


class RedisApiBudget:
    """The API budget shared by every process through one Redis hash per account."""

    def __init__(
        self,
        redis: Redis,
        *,
        account_key: str,
        limit: int = DEFAULT_LIMIT,
        window: float = DEFAULT_WINDOW,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = KEY_PREFIX + account_key
        self._account_key = account_key
        self._limit = limit
        self._window = window
        self._clock = clock
        self._acquire = redis.register_script(_ACQUIRE)
        self._observe = redis.register_script(_OBSERVE)
        self._remaining = redis.register_script(_REMAINING)

    def __repr__(self) -> str:
        return f"RedisApiBudget(account_key={self._account_key!r}, limit={self._limit})"

    @property
    def key(self) -> str:
        """The Redis key holding this account's window."""
        return self._key

    def _args(self, *extra: str) -> list[str]:
        return [repr(self._clock()), str(self._limit), repr(self._window), *extra]

    def acquire(self) -> None:
        """Take one API call, or raise ApiBudgetExhaustedError with retry_after."""
        granted, detail = self._run(self._acquire, self._args())
        if int(granted) != 1:
            raise _exhausted(self._limit, self._window, float(detail), self._account_key)

    def observe(self, *, remaining: int | None, limit: int | None, reset_at: float | None) -> None:
        """Reconcile with Cloud's X-RateLimit-Remaining, -Limit and -Reset headers."""
        # `limit` is informational: Cloud's `remaining` alone says how many calls are left.
        self._run(
            self._observe,
            self._args(
                "" if remaining is None else str(remaining),
                "" if reset_at is None else repr(float(reset_at)),
            ),
        )

    def remaining(self) -> int:
        """Calls left in the current window."""
        return int(self._run(self._remaining, [repr(self._clock()), str(self._limit)]))

    def _run(self, script: Any, args: list[str]) -> Any:
        return script(keys=[self._key], args=args)
