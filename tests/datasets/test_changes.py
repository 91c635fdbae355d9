"""Comparing two published states of a dataset: added, removed and changed entities."""

from __future__ import annotations

from decimal import Decimal

from config.columns import Watch
from sync.datasets.change_feed import event_payload
from sync.datasets.changes import ChangeSet, compare


def test_added_removed_and_changed_within_tolerance() -> None:
    """Only watched columns count, and a price move within its tolerance is not a change."""
    before = {
        "a": {"price": Decimal("10.00"), "title": "A"},
        "b": {"price": Decimal("10.00"), "title": "B"},
        "c": {"price": Decimal("10.00"), "title": "C"},
        "gone": {"price": Decimal("1"), "title": "G"},
    }
    after = {
        "a": {"price": Decimal("10.50"), "title": "A"},  # 5 percent: counts
        "b": {"price": Decimal("10.05"), "title": "B"},  # half a percent: within tolerance
        "c": {"price": Decimal("10.00"), "title": "C, new"},
        "new": {"price": Decimal("2"), "title": "N"},
    }
    watch = {"price": Watch("price", percent=1), "title": Watch("title")}
    changes = compare("products", "r2", "r1", before, after, watch)
    assert changes.counts() == {"added": 1, "removed": 1, "changed": 2}
    body = changes.as_dict()
    assert body["added"] == [{"entity_key": "new", "values": {"price": 2, "title": "N"}}]
    assert body["removed"] == [{"entity_key": "gone", "values": {"price": 1, "title": "G"}}]
    assert body["changed"] == [
        {"entity_key": "a", "columns": {"price": {"before": 10, "after": 10.5}}},
        {"entity_key": "c", "columns": {"title": {"before": "C", "after": "C, new"}}},
    ]


def test_with_no_watch_every_column_counts() -> None:
    """With no watch table, any column whose value differs is a change."""
    changes = compare(
        "d", "r2", "r1", {"a": {"x": "1", "y": None}}, {"a": {"x": "2", "y": "3"}}, {}
    )
    assert [c.column for c in changes.changed[0].columns] == ["x", "y"]


def test_a_baseline_reports_counts_only() -> None:
    """A dataset's first publication is everything new: its counts, not 100,000 entries."""
    changes = compare("d", "r1", None, {}, {"a": {"x": 1}, "b": {"x": 2}}, {}, baseline=True)
    assert changes.as_dict()["counts"] == {"added": 2, "removed": 0, "changed": 0}
    assert changes.as_dict()["added"] == []
    assert event_payload(changes, revision=1, limit=1000)["inline"] is False
    assert changes.added == ()  # nothing listed, so nothing kept


def test_the_event_carries_the_changes_inline_only_while_they_fit() -> None:
    """At most ``limit`` entries travel in the event, in a stable order; more travel as a
    summary with the counts and where to fetch them; nothing changed is still announced."""
    after = {f"k{i:02}": {"x": i} for i in range(5)}
    changes = compare("d", "r2", "r1", {"old": {"x": 0}}, after, {})
    inline = event_payload(changes, revision=3, limit=6)
    assert inline["inline"] is True
    assert [e["entity_key"] for e in inline["added"]] == ["k00", "k01", "k02", "k03", "k04"]
    assert [e["entity_key"] for e in inline["removed"]] == ["old"]
    summary = event_payload(changes, revision=3, limit=5)
    assert (summary["inline"], summary["counts"]) == (
        False,
        {"added": 5, "removed": 1, "changed": 0},
    )
    assert "added" not in summary
    assert "removed" not in summary
    assert summary["changes_path"] == "/api/changes?dataset=d&run=r2&revision=3"
    nothing = event_payload(ChangeSet("d", "r2", "r1"), revision=1, limit=10)
    assert (nothing["inline"], nothing["counts"]["added"]) == (True, 0)
