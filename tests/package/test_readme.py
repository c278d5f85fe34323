"""The documentation runs as written and its links lead somewhere.

Each page (README.md, docs/guide/*.md, docs/design/*.md) runs every ```python block,
in order, in one namespace, in a fresh interpreter of its own: a page's blocks share
state, pages do not. A block fenced as ```py (or ```bash, ```text) is shown, not run.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))
DESIGN = sorted((ROOT / "docs" / "design").glob("*.md"))
ALL_DOCS = [README] + sorted((ROOT / "docs").rglob("*.md"))

PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", flags=re.S)


def python_blocks(page):
    return PYTHON_BLOCK.findall(page.read_text())


RUNNABLE = [page for page in [README] + GUIDE + DESIGN if python_blocks(page)]


def test_the_tour_is_still_there():
    assert len(python_blocks(README)) >= 2, "the README lost its tour"
    assert sum(len(python_blocks(page)) for page in GUIDE) >= 15, "the guide lost its examples"


@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_python_blocks_run(page, run_python):
    script = "\n".join(python_blocks(page)) + "\nprint('PAGE OK')\n"
    proc = run_python(script, check=False)
    assert proc.returncode == 0, f"{page.relative_to(ROOT)}:\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip().endswith("PAGE OK")


FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", flags=re.S | re.M)
CODE_SPAN = re.compile(r"(`+)[^`].*?\1", flags=re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", flags=re.M)


def prose(text):
    """The text without fenced blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(page):
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    seen, result = {}, set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


@pytest.mark.parametrize("page", ALL_DOCS, ids=[str(p.relative_to(ROOT)) for p in ALL_DOCS])
def test_relative_links_lead_to_files(page):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):        # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"
