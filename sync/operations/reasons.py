"""A verdict's stored reasons for people: a sentence, its code and partition, and its figures
(got, baseline, allowed), whatever shape acceptance stored them in."""

from __future__ import annotations

import json
from typing import Any


def reason_text(reason: Any) -> str:
    """One reason of a verdict as a sentence, whatever shape acceptance stored it in."""
    if isinstance(reason, str):
        return reason
    if isinstance(reason, dict):
        for key in ("message", "detail", "reason", "text"):
            if isinstance(reason.get(key), str):
                code = reason.get("code") or reason.get("rule")
                return f"{code}: {reason[key]}" if isinstance(code, str) else str(reason[key])
    return json.dumps(reason, sort_keys=True, default=str)


def _figure(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def reason_figures(reason: Any) -> str | None:
    """A stored reason's numbers in one line: what the run got, the baseline it was held
    against (history rules), and what was allowed; None for a reason without numbers."""
    if not isinstance(reason, dict):
        return None
    got, baseline, expected = reason.get("got"), reason.get("baseline"), reason.get("expected")
    if got is None and baseline is None and expected is None:
        return None
    parts = [] if got is None else [f"got {_figure(got)}"]
    if baseline is not None:
        parts.append(f"baseline {_figure(baseline)}")
    if expected is not None:
        numbers = all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in (got, expected)
        )
        # A failed reason's figure lies beyond its bound, which says which way the bound faces.
        bound = ("<= " if got > expected else ">= ") if numbers else ""
        parts.append(f"allowed {bound}{_figure(expected)}")
    return ", ".join(parts)


def reason_detail(reason: Any) -> dict[str, Any]:
    """One stored reason for display: its sentence, its code and partition, and its figures
    (got, baseline, allowed) apart and as one line."""
    shaped = reason if isinstance(reason, dict) else {}
    return {
        "text": reason_text(reason),
        "code": shaped.get("code"),
        "partition": shaped.get("partition"),
        "got": shaped.get("got"),
        "baseline": shaped.get("baseline"),
        "allowed": shaped.get("expected"),
        "figures": reason_figures(reason),
    }
