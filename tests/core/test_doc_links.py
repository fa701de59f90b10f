"""CPU: every relative link in README.md and docs/ resolves to a file or folder of the tree (result folders
leave the tree as new runs replace them; a page must not point at one that is gone)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(page: Path) -> list[str]:
    text, out, fenced = page.read_text(), [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out += _LINK.findall(re.sub(r"`[^`]*`", "", line))
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s), mailto, an anchor in the page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_checker_sees_links():
    assert "docs/architecture.md" in links(ROOT / "README.md")
