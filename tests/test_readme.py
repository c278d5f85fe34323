"""The documentation runs as written.

Each page (README.md, docs/guide/*.md, docs/design/*.md) runs every ```python block,
in order, in one namespace, in a fresh interpreter of its own: a page's blocks share
state, pages do not. A block fenced as ```py (or ```bash, ```text) is shown, not run.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))
DESIGN = sorted((ROOT / "docs" / "design").glob("*.md"))

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
