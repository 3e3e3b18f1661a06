"""The Markdown pages link to files that exist (the docs site's `mkdocs build --strict` also
checks the anchors and the API cross-references; README.md is outside the site, so it is here)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:|#", t)]


def test_relative_links_in_readme_and_docs_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in pages
        for target in relative_links(page)
        if not (page.parent / target.split("#")[0]).exists()
    ]
    assert broken == []


def test_readme_links_every_docs_page():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    guides = {page.resolve() for page in (ROOT / "docs").glob("*.md") if page.name != "index.md"}
    assert guides - linked == set()
