"""The documentation holds together: its links resolve, the modules it names exist, and the
README stays a front door."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MOST_LINES = 200
MANUALS = (
    "README.md",
    "architecture.md",
    "configuration.md",
    "datasets-file.md",
    "acceptance-and-delivery.md",
    "querying.md",
    "operations.md",
    "deploying-on-heroku.md",
    "simulator.md",
    "security.md",
    "development.md",
)

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # the link text, one level of brackets inside
    r"\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"  # the target, an optional title
)
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.MULTILINE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
CODE_FOLDERS = "sync|tests|bench|config|webhooks|simulator|scrapesync"
CODE_PATH = re.compile(rf"^(?:{CODE_FOLDERS})/[\w./-]*(?:\.py|/)$")


def _documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]


def _prose(text: str) -> str:
    """The text outside fenced code blocks (fence lines and their contents blanked)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else line)
    return "\n".join(lines)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(document: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(document.read_text(encoding="utf-8")).splitlines():
        match = HEADING.match(line)
        if not match:
            continue
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(document: Path) -> list[str]:
    prose = INLINE_CODE.sub("", _prose(document.read_text(encoding="utf-8")))
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def _broken_link(document: Path, target: str) -> str | None:
    """Why a relative link of the document does not resolve, or None when it does."""
    path_part, _, anchor = target.partition("#")
    resolved = (document.parent / unquote(path_part)).resolve() if path_part else document
    if not resolved.exists():
        return f"{target}: no such file {os.path.relpath(resolved, ROOT)}"
    if anchor and resolved.suffix == ".md" and unquote(anchor) not in _anchors(resolved):
        return f"{target}: no heading #{anchor} in {os.path.relpath(resolved, ROOT)}"
    return None


def test_every_manual_the_index_promises_is_there() -> None:
    """The README, each manual under docs/ and the benchmarks' history exist."""
    expected = [README, *(ROOT / "docs" / name for name in MANUALS), ROOT / "bench" / "README.md"]
    missing = [str(path.relative_to(ROOT)) for path in expected if not path.is_file()]
    assert missing == []


def test_every_relative_link_in_the_docs_resolves() -> None:
    """Every relative link reaches a file, and every #anchor into Markdown a heading."""
    broken = []
    for document in _documents():
        for target in _links(document):
            if SCHEME.match(target):
                continue
            reason = _broken_link(document, target)
            if reason:
                broken.append(f"{document.relative_to(ROOT)}: {reason}")
    assert broken == []


def test_every_module_path_the_docs_name_exists() -> None:
    """Every sync/ (or tests/, bench/...) path in backticks names a module or folder of the repo."""
    missing = []
    for document in _documents():
        prose = _prose(document.read_text(encoding="utf-8"))
        for _, code in INLINE_CODE.findall(prose):
            path = code.strip()
            if CODE_PATH.match(path) and not (ROOT / path).exists():
                missing.append(f"{document.relative_to(ROOT)}: {path}")
    assert missing == []


def test_the_readme_stays_short() -> None:
    """The README is a front door of at most 200 lines; the manuals live in docs/."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MOST_LINES


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("How it stays correct", "how-it-stays-correct"),
        ("The operator's day: launch, watch", "the-operators-day-launch-watch"),
        ("Sync: `bench/sync_bench.py`", "sync-benchsync_benchpy"),
        ("Limits on Cloud's exports", "limits-on-clouds-exports"),
        ("What changed, checked side by side", "what-changed-checked-side-by-side"),
    ],
)
def test_headings_get_the_anchors_github_gives_them(heading: str, slug: str) -> None:
    """The anchor of a heading is the one GitHub would link to."""
    assert _slug(heading) == slug
