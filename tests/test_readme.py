"""The README fits on a few screens and hands the depth to platform/ulorl/docs/: every page it links
exists, and every docs page is reachable from it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "platform" / "ulorl" / "docs"
MAX_LINES = 300
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _links(text: str) -> list[str]:
    """Relative link targets of a markdown text, without #anchors (web links left out)."""
    return [t.split("#", 1)[0] for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]


def test_readme_stays_within_a_few_screens():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}): move the depth to {DOCS.relative_to(ROOT)}/"


def test_every_page_the_readme_links_exists():
    targets = _links(README.read_text(encoding="utf-8"))
    assert any(t.startswith("platform/ulorl/docs/") for t in targets)        # the check sees the docs links
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links missing files: {missing}"


def test_every_docs_page_is_reachable_from_the_readme():
    linked = {(ROOT / t).resolve() for t in _links(README.read_text(encoding="utf-8"))}
    pages = [p for p in sorted(DOCS.glob("*.md")) if p.name != "README.md"]  # the docs folder's index page, not a guide
    assert len(pages) >= 10
    unlinked = [p.name for p in pages if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_docs_pages_link_existing_files():
    broken = []
    for page in sorted(DOCS.glob("*.md")):
        for t in _links(page.read_text(encoding="utf-8")):
            if not (page.parent / t).exists():
                broken.append(f"{page.name} -> {t}")
    assert not broken, broken
