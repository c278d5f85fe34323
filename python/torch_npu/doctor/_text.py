"""The report's words and numbers, shared by its text and HTML forms: sizes, times,
a finding's cost and other places, the clean verdict, and a figure as embedded PNG."""
import base64
import io

from ._findings import shown_path


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _time(s):
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s"


CLEAN = ("No problems found: no CPU fallbacks, copies or syncs in the loop, launch-bound lines, float64 or "
         "memory growth.")
CLEAN_ON = ("No problems found on {chip}: no CPU fallbacks, refused dtypes or float16 overflow there, no copies or "
            "syncs in the loop, launch-bound lines, float64 or memory growth.")


def cost_text(finding, chip=None):
    """"9.8 ms, 24.0 MiB; 31 ms projected on Ascend910B2", each part left out when zero."""
    parts = (_time(finding.seconds) if finding.seconds else "", _size(finding.bytes) if finding.bytes else "")
    text = ", ".join(p for p in parts if p)
    if chip and finding.projected_s:
        text += ("; " if text else "") + f"{_time(finding.projected_s)} projected on {chip}"
    return text


def other_locations_text(finding, k=5):
    return ", ".join(f"{shown_path(p)}:{n}" for p, n in finding.other_locations[:k])


def png_base64(figure):
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")
