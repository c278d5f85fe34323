"""What torch.compile did while the doctor watched: frames, graphs, graph breaks and
recompilations, read from dynamo's own records (its counters, its per-compilation
metrics and its guard failures), compared before and after the run. Nothing is
installed in dynamo: it keeps these records for every compilation anyway.
"""
import re
import sys

_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")


def snapshot():
    """dynamo's records so far; {} before torch._dynamo was ever imported (nothing compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return {}
    c = utils.counters
    return {"frames": c["frames"]["total"], "frames_ok": c["frames"]["ok"], "graphs": c["stats"]["unique_graphs"],
            "graph_breaks": dict(c["graph_break"]),
            # the records themselves (dynamo keeps its last 64): kept to tell the new ones by identity
            "metrics": list(utils.get_compilation_metrics()),
            "guard_failures": {code: len(reasons) for code, reasons in utils.guard_failures.items()}}


def delta(before, after):
    """What torch.compile did between two snapshots, None if it compiled nothing:
    frames compiled (recompilations included), graphs, graph breaks by reason (the first
    line of dynamo's explanation), ``compiles`` (one per compilation: the function, its
    file and first line, seconds, and for the code after a graph break the function and
    line of the break), ``break_sites`` (lines that break a compiled function) and ``recompiles`` (per function: the guard failures that made
    dynamo compile it again)."""
    if not after or after["frames"] == before.get("frames", 0):
        return None
    breaks = {}
    for reason, n in after["graph_breaks"].items():
        n -= before.get("graph_breaks", {}).get(reason, 0)
        if n > 0:
            first = reason.strip().splitlines()[0]
            breaks[first] = breaks.get(first, 0) + n
    from ._monitor import _is_internal
    seen = {id(m) for m in before.get("metrics", ())}
    compiles = []
    for m in after["metrics"]:   # frames of torch and torch_npu compiled on the way are not the user's
        if id(m) in seen or not m.co_filename or _is_internal(m.co_filename):
            continue
        resume = _RESUME.match(m.co_name or "")
        compiles.append({"function": resume.group("fn") if resume else m.co_name, "file": m.co_filename,
                         "line": int(resume.group("line")) if resume else m.co_firstlineno,
                         "after_break": bool(resume), "compile_id": m.compile_id,
                         "seconds": m.entire_frame_compile_time_s or 0.0})
    recompiles = {}
    old = before.get("guard_failures", {})
    utils = sys.modules["torch._dynamo.utils"]
    for code, reasons in list(utils.guard_failures.items()):
        new = [r.split(": ", 1)[-1] for r in reasons[old.get(code, 0):]]
        if not new or _is_internal(code.co_filename):
            continue
        resume = _RESUME.match(code.co_name)
        key = (code.co_filename, int(resume.group("line")) if resume else code.co_firstlineno,
               resume.group("fn") if resume else code.co_name)
        recompiles.setdefault(key, []).extend(new)
    # Lines that break a compiled function, from the code dynamo compiled after each (its
    # counter misses some kinds, a branch on a tensor's value among them).
    sites = {(c["file"], c["line"]) for c in compiles if c["after_break"]}
    return {"frames": after["frames"] - before.get("frames", 0),
            "frames_ok": after["frames_ok"] - before.get("frames_ok", 0),
            "graphs": after["graphs"] - before.get("graphs", 0), "graph_breaks": breaks,
            "break_sites": len(sites), "compiles": compiles,
            "recompiles": [{"file": f, "line": n, "function": fn, "reasons": r}
                           for (f, n, fn), r in recompiles.items()]}
