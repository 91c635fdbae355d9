"""The report of ``bench/pipeline_bench.py``: medians, a markdown table per size, the targets.

Each load of a size is set beside the floor (the raw COPY of the same export) and the peer (dlt's
load of the same phase; for the next day's run, dlt's merge of the changed export): a ratio of
rates above 1 means faster than it. The targets are the issue's: at 100k records, scrapesync end
to end (with and without a ``[columns]`` table) at 0.25x the raw COPY's rate or more and at 3x
dlt's merge rate or more; a 10%-changed sync in 0.4x the first sync's time or less; the
scrapesync process's peak RSS at 1M records at most 1.5x that at 10k. The next day's run has no
target of its own: it is shown beside the first sync's time.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

TARGET_SIZE = 100_000
MIN_VS_COPY = 0.25
MIN_VS_DLT = 3.0
CHANGED_MAX_SHARE = 0.4
RSS_MAX_GROWTH = 1.5
RSS_LOW, RSS_HIGH = 10_000, 1_000_000

COPY, TEXT, TYPED, DLT = "raw COPY", "scrapesync, text columns", "scrapesync, typed columns", "dlt"
ARMS = (COPY, TEXT, TYPED, DLT)
FIRST, CHANGED = "first", "10% changed"
NEXT = "next day's run, 10% changed"  # scrapesync only; its peer is dlt's 10%-changed merge

Key = tuple[int, str, str]  # records, arm, phase


@dataclass(frozen=True)
class Load:
    """One timed load of one size, arm and phase in one run; for scrapesync, the part of it
    spent importing (to the attempt's commit) and evaluating (to the run's verdict)."""

    records: int
    arm: str
    phase: str
    seconds: float
    startup: float | None = None
    peak_rss_kib: int | None = None
    importing: float | None = None
    evaluating: float | None = None


@dataclass(frozen=True)
class Summary:
    """The median of several runs of one load (size, arm, phase)."""

    records: int
    arm: str
    phase: str
    seconds: float
    low: float
    high: float
    startup: float | None
    peak_rss_kib: int | None
    importing: float | None
    evaluating: float | None

    @property
    def rate(self) -> float:
        """Records per second at the median time."""
        return self.records / self.seconds


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarise(loads: Sequence[Load]) -> dict[Key, Summary]:
    """Medians per (size, arm, phase); the peak RSS is the highest seen."""
    out: dict[Key, Summary] = {}
    for key in sorted({(x.records, x.arm, x.phase) for x in loads}):
        group = [x for x in loads if (x.records, x.arm, x.phase) == key]
        seconds = [x.seconds for x in group]
        peaks = [x.peak_rss_kib for x in group if x.peak_rss_kib is not None]
        out[key] = Summary(
            *key,
            seconds=statistics.median(seconds),
            low=min(seconds),
            high=max(seconds),
            startup=_median([x.startup for x in group]),
            peak_rss_kib=max(peaks) if peaks else None,
            importing=_median([x.importing for x in group]),
            evaluating=_median([x.evaluating for x in group]),
        )
    return out


def _ratio(a: Summary | None, b: Summary | None) -> str:
    return f"{a.rate / b.rate:.2f}" if a is not None and b is not None else ""


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def table(summaries: dict[Key, Summary], n: int) -> str:
    """One size's results as a markdown table, each load beside the floor and the peer."""
    lines = [
        f"**{n:,} records**",
        "",
        "| load | seconds (median) | min-max | records/s | x raw COPY rate | x dlt rate "
        "| x first load's time | of which import / evaluate+publish s | start-up s (not timed) "
        "| peak RSS MiB |",
        "| --- |" + " ---: |" * 9,
    ]
    floor = summaries.get((n, COPY, FIRST))
    for arm in ARMS:
        first = summaries.get((n, arm, FIRST))
        for phase in (FIRST, CHANGED, NEXT):
            s = summaries.get((n, arm, phase))
            if s is None:
                continue
            # dlt has no runs: its merge of the changed export is the peer of both later syncs
            peer_phase = CHANGED if phase == NEXT else phase
            peer = None if arm == DLT else summaries.get((n, DLT, peer_phase))
            share = f"{s.seconds / first.seconds:.2f}" if phase != FIRST and first else ""
            parts = (
                f"{s.importing:.2f} / {s.evaluating:.2f}"
                if s.importing is not None and s.evaluating is not None
                else ""
            )
            rss = "" if s.peak_rss_kib is None else f"{s.peak_rss_kib / 1024:.0f}"
            lines.append(
                f"| {arm}{'' if arm == COPY else ', ' + phase} | {s.seconds:.2f} "
                f"| {s.low:.2f}-{s.high:.2f} | {s.rate:,.0f} | {_ratio(s, floor)} "
                f"| {_ratio(s, peer)} | {share} | {parts} | {_seconds(s.startup)} | {rss} |"
            )
    return "\n".join(lines)


Verdict = tuple[str, bool | None, str]  # target, met (None: not measured), the numbers


def verdicts(summaries: dict[Key, Summary]) -> list[Verdict]:
    """Each target of the issue, whether it was met and the numbers."""
    out: list[Verdict] = []
    get = summaries.get
    for arm in (TEXT, TYPED):
        s = get((TARGET_SIZE, arm, FIRST))
        for peer, limit in ((COPY, MIN_VS_COPY), (DLT, MIN_VS_DLT)):
            target = f"{arm}, end to end at {TARGET_SIZE:,} >= {limit}x the {peer} rate"
            other = get((TARGET_SIZE, peer, FIRST))
            if s is None or other is None:
                out.append((target, None, "size not run"))
                continue
            ratio = s.rate / other.rate
            numbers = f"{ratio:.2f}x: {s.rate:,.0f} vs {other.rate:,.0f} records/s"
            out.append((target, ratio >= limit, numbers))
    for n in sorted({key[0] for key in summaries}):
        for arm in (TEXT, TYPED):
            first, changed = get((n, arm, FIRST)), get((n, arm, CHANGED))
            if first is None or changed is None:
                continue
            share = changed.seconds / first.seconds
            target = f"{arm}, 10% changed at {n:,} <= {CHANGED_MAX_SHARE}x the first sync's time"
            out.append((target, share <= CHANGED_MAX_SHARE, f"{share:.2f}x"))
    out.append(rss_verdict(summaries))
    return out


def rss_verdict(summaries: dict[Key, Summary]) -> Verdict:
    """Peak RSS of the scrapesync process at 1M against 10k (both arms, both syncs)."""

    def peak(n: int) -> int | None:
        peaks = [
            s.peak_rss_kib
            for (size, arm, _), s in summaries.items()
            if size == n and arm in (TEXT, TYPED) and s.peak_rss_kib is not None
        ]
        return max(peaks) if peaks else None

    target = f"peak RSS of scrapesync at {RSS_HIGH:,} <= {RSS_MAX_GROWTH}x that at {RSS_LOW:,}"
    low, high = peak(RSS_LOW), peak(RSS_HIGH)
    if low is not None and high is not None:
        growth = high / low
        return (
            target,
            growth <= RSS_MAX_GROWTH,
            f"{growth:.2f}x: {high / 1024:.0f} vs {low / 1024:.0f} MiB",
        )
    largest = max((key[0] for key in summaries), default=RSS_LOW)
    at_largest = peak(largest)
    if low is None or at_largest is None or largest == RSS_LOW:
        return target, None, "sizes not run (--million)"
    return (
        target,
        None,
        f"1M not run (--million); at {largest:,}: {at_largest / 1024:.0f} vs "
        f"{low / 1024:.0f} MiB ({at_largest / low:.2f}x)",
    )


def report(summaries: dict[Key, Summary], sizes: Sequence[int], conditions: str) -> bool:
    """Print the tables, the conditions and the targets; whether a target was missed."""
    for n in sizes:
        print(table(summaries, n), end="\n\n")
    print(conditions, end="\n\n")
    missed = False
    for target, met, numbers in verdicts(summaries):
        word = "not measured" if met is None else ("met" if met else "MISSED")
        missed = missed or met is False
        print(f"- {target}: {word} ({numbers})")
    return missed
