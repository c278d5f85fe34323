"""The README's tour runs as written: every ```python block, in order, in one namespace."""
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run(run_python):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 4, "the README lost its API tour"
    script = "\n".join(blocks) + "\nprint('README OK')\n"
    proc = run_python(script, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("README OK")
