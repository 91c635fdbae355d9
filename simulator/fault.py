"""Injected faults: the ways real Cloud misbehaves, armed for the next matching API requests.

Kinds and where they strike:

- ``status``: answer ``params["status"]`` (e.g. 500, 503, 401, 403) with the JSON error
  envelope, before the handler runs.
- ``slow``: sleep ``params["seconds"]``, then handle the request normally.
- ``rate_limit``: answer 429 as if the window were spent (``params["retry_after"]`` seconds
  overrides the wait; default: until the current window ends).
- ``reset``: drop the connection without a response. Over a socket the server closes it and
  httpx raises ``httpx.RemoteProtocolError``; through ``httpx.WSGITransport`` the app raises
  ``ConnectionResetError``, which the client call re-raises as is (not an ``httpx`` exception).
- ``cut``: downloads only; stream ``params.get("after_bytes", 1024)`` bytes of the body, then drop
  the connection. A body shorter than that loses its last byte, so the cut always shows. Over a
  socket httpx raises ``httpx.RemoteProtocolError`` (incomplete chunked body); in-process the body
  read (``response.read()``, ``iter_bytes()``, or ``client.get()`` itself) raises
  ``ConnectionResetError``.
- ``create_then_slow``: ``POST scraping-job`` only; create the job, then sleep
  ``params["seconds"]`` before answering (a create that times out after Cloud created the job).

A fault fires on at most ``times`` requests (``None``: until cleared); the optional
``params["method"]`` narrows it to one HTTP method.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

FAULT_KINDS = ("status", "slow", "cut", "rate_limit", "reset", "create_then_slow")
DOWNLOAD_SUFFIXES = ("/json", "/csv", "/xlsx")


@dataclass
class Fault:
    """One armed fault and how many more requests it will strike."""

    kind: str
    path_contains: str = ""
    times: int | None = 1
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {FAULT_KINDS}")
        if self.kind == "status" and not isinstance(self.params.get("status"), int):
            raise ValueError("a status fault needs an integer params['status']")
        if self.kind in ("slow", "create_then_slow") and "seconds" not in self.params:
            raise ValueError(f"a {self.kind} fault needs params['seconds']")

    def applies_to(self, method: str, path: str) -> bool:
        """Tell whether this fault targets a request with this method and path."""
        if self.times is not None and self.times <= 0:
            return False
        wanted = self.params.get("method")
        if wanted is not None and str(wanted).upper() != method.upper():
            return False
        if self.path_contains not in path:
            return False
        if self.kind == "cut":
            return path.endswith(DOWNLOAD_SUFFIXES)
        if self.kind == "create_then_slow":
            return method.upper() == "POST" and path.rstrip("/").endswith("/scraping-job")
        return True

    def spend(self) -> None:
        """Count one strike against the fault's budget."""
        if self.times is not None:
            self.times -= 1

    def describe(self) -> dict[str, Any]:
        """Return the fault as plain JSON-able data."""
        return {
            "kind": self.kind,
            "path_contains": self.path_contains,
            "times": self.times,
            **self.params,
        }


@dataclass
class FaultPlan:
    """The armed faults, struck in the order they were injected."""

    faults: list[Fault] = field(default_factory=list)

    def arm(self, fault: Fault) -> None:
        """Add a fault to the plan."""
        self.faults.append(fault)

    def clear(self) -> None:
        """Disarm every fault."""
        self.faults.clear()

    def take(self, kinds: tuple[str, ...], method: str, path: str) -> Fault | None:
        """Spend and return the first armed fault of these kinds that targets the request."""
        for fault in self.faults:
            if fault.kind in kinds and fault.applies_to(method, path):
                fault.spend()
                self.faults = [f for f in self.faults if f.times is None or f.times > 0]
                return fault
        return None


def cut_stream(chunks: Iterable[bytes], after_bytes: int) -> Iterator[bytes]:
    """Pass through at most after_bytes of a body, then drop the connection mid-stream.

    A body that ends before after_bytes loses its last byte instead, so the client always sees
    an incomplete body rather than a clean end.
    """
    sent = 0
    held: bytes | None = None
    for chunk in chunks:
        if held is not None:
            room = after_bytes - sent
            if len(held) >= room:
                if room > 0:
                    yield held[:room]
                raise ConnectionResetError(f"simulated cut after {after_bytes} bytes")
            sent += len(held)
            yield held
        held = chunk
    if held is not None:
        keep = min(after_bytes - sent, len(held) - 1)
        if keep > 0:
            yield held[:keep]
    raise ConnectionResetError(f"simulated cut after at most {after_bytes} bytes")
