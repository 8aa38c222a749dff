"""The docs' links between themselves resolve: every relative link names a file of the
repository, and every #anchor a heading of its target (GitHub's slugs). Headings get renamed
when a section is rewritten; a README sentence that points into results.md must not then
point nowhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted({REPO / "README.md", REPO / "outsource/README.md", REPO / "vm/README.md",
               *(REPO / "docs").glob("*.md")})
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"#{1,6} (.+)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.fullmatch(line)):
            out.add(slug(m[1]))
    return out


def test_slug_is_githubs() -> None:
    assert slug("Softirq-lock inversion measured") == "softirq-lock-inversion-measured"
    assert slug("Socket outsourcing: an RT server's requests (timings emulated)") == \
        "socket-outsourcing-an-rt-servers-requests-timings-emulated"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(doc: Path) -> None:
    bad = []
    for m in LINK.finditer(doc.read_text()):
        target = m[1]
        if re.match(r"[a-z]+:", target):        # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no such heading in {dest.relative_to(REPO)}")
    assert not bad, bad
