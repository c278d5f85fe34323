"""The doctor's report: text for the terminal, JSON for tools, HTML with plots.

``Run`` is everything a finished run measured (what the rules read); ``Report``
presents a run. The JSON follows ``report.schema.json`` (schema "torch_npu.doctor/1").
"""
import datetime
import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from ..fallback import OpFallbackStats
from . import _html
from ._findings import shown_path
from ._text import CLEAN, CLEAN_ON, _size, cost_text, other_locations_text

SCHEMA = "torch_npu.doctor/1"
SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.schema.json")


@dataclass
class OpSummary:
    op: str
    calls: int
    host_s: float            # time of the calls on the host, as the doctor saw them
    fallbacks: int           # calls that ran on the CPU
    profiled_host_us: Optional[float] = None     # in the profiled steps, per torch_npu.profiler
    profiled_device_us: Optional[float] = None

    @property
    def backend(self):
        if self.fallbacks >= self.calls:
            return "cpu fallback"
        if self.fallbacks:
            return "npu + cpu fallback"
        if not self.op.startswith("aten::"):
            return "custom npu op"
        # Under a chip profile an op the chip lacks may decompose into native kernels.
        from ..ops import registry as _ops_registry
        info = _ops_registry.get(self.op)
        return "decomposed" if info is not None and info.backend == "composite" else "npu kernel"


@dataclass
class Run:
    script: str
    started: str
    wall_s: float
    device: str
    steps: int
    total_ops: int
    op_ns: int
    ops: List[OpSummary]
    sites: list                      # _monitor.Site
    fallback_stats: Dict[str, object]   # base op name -> fallback.OpFallbackStats of this run
    memory: List[tuple]              # (seconds, allocated, reserved), sampled over time
    step_memory: List[tuple]         # (step, seconds, allocated, reserved) after each step
    peak_allocated: int
    profile: Optional[dict]
    compared: Optional[int]          # ops compared with the cpu (None without --compare)
    mismatches: list
    error: Optional[str]
    findings: list = field(default_factory=list)
    target: Optional[str] = None     # the chip profile of the verdict (the CLI's --target), None: no verdict
    verdict: object = None           # _target.Verdict for target, made when the Doctor stops
    clock: Optional[str] = None      # what the steps are: "optimizer", "loop", "manual" (step()), "line" (steps_at)
    loop: object = None              # _monitor.Loop whose iterations are the steps (clock "loop")
    compile: Optional[dict] = None   # what torch.compile did during the run (doctor/__init__.py), None: nothing
    target_name: Optional[str] = None      # the target chip's device name
    saturating_chip: Optional[str] = None  # the target's device name when it saturates float16 overflow
    refusal: Optional[tuple] = None        # (file, line, message): the script stopped on the chip's refusal
    also: list = field(default_factory=list)   # _target.Verdict of each --also-target

    @classmethod
    def collect(cls, doctor, wall, stats_after, profile, error):
        monitor = doctor.monitor
        # This run's fallbacks per op, all overloads together ("aten::mul.Tensor" is "aten::mul").
        delta = {}
        for sign, stats in ((1, stats_after), (-1, doctor._stats_before)):
            for name, s in stats.ops.items():
                base = name.split(".")[0]
                total = delta.get(base, (0, 0, 0.0, 0, 0))
                delta[base] = tuple(t + sign * v for t, v in zip(total, (
                    s.count, s.kernel_error_retries, s.seconds, s.bytes_to_cpu, s.bytes_to_npu)))
        delta = {name: OpFallbackStats(*v) for name, v in delta.items() if v[0] > 0}
        profiled = (profile or {}).get("per_op_us", {})
        ops = []
        for op, calls in monitor.op_calls.items():
            fell = delta.get(op.split(".")[0])
            host_us, device_us, _ = profiled.get(op, (None, None, 0))
            ops.append(OpSummary(op, calls, monitor.op_ns[op] / 1e9, min(calls, fell.count) if fell else 0,
                                 host_us, device_us))
        ops.sort(key=lambda o: -o.host_s)
        comparator = doctor._comparator
        mismatches = []
        if comparator is not None:
            for m in comparator.mismatches.values():
                m.calls = comparator.calls.get(m.op, m.bad_calls)
                mismatches.append(m)
        try:
            device = f"npu:{torch.npu.current_device()} ({torch.npu.get_device_name()})"
            peak = torch.npu.max_memory_allocated()
        except Exception:  # noqa: BLE001  a broken device still gets a report
            device, peak = "npu", 0
        samples = [m[1] for m in doctor._sampler.memory] + [m[2] for m in monitor.step_memory]
        return cls(
            script=doctor.script, started=datetime.datetime.now().isoformat(timespec="seconds"), wall_s=wall,
            device=device, steps=monitor.step, total_ops=monitor.total_ops, op_ns=sum(monitor.op_ns.values()),
            ops=ops, sites=list(monitor.sites.values()), fallback_stats=delta, memory=list(doctor._sampler.memory),
            step_memory=list(monitor.step_memory), peak_allocated=max([peak] + samples),
            profile=profile, compared=comparator.compared if comparator is not None else None,
            mismatches=mismatches, error=_error_text(error),
            refusal=_refusal(error))

    @property
    def fallback_calls(self):
        """Calls that ran on the CPU: the user's ops', and those of ops reached inside them."""
        return sum(s.count for s in self.fallback_stats.values())


def _error_text(error):
    if error is None:
        return None
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _refusal(error):
    """(file, line, message) when ``error`` is a chip's refusal of a dtype (a TypeError naming
    the chip): the user's line it raised at, from its traceback."""
    if not isinstance(error, TypeError) or "is not supported by" not in str(error):
        return None
    from ._monitor import _is_internal, is_library
    where = None
    tb = error.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not _is_internal(name) and not is_library(name) and not name.startswith("<"):
            where = (name, tb.tb_lineno)
        tb = tb.tb_next
    return None if where is None else (*where, str(error))


class Report:
    """A finished run presented: ``str(report)``, ``report.as_dict()``, ``.to_json(path)``, ``.to_html(path)``."""

    def __init__(self, run: Run):
        self.run = run

    @property
    def findings(self):
        return self.run.findings

    # ---- text ----

    def header_lines(self):
        r = self.run
        native = 1 - r.fallback_calls / r.total_ops if r.total_ops else 1.0
        lines = [f"torch_npu doctor: {r.script}",
                 f"  ran {r.wall_s:.1f} s on {r.device}: {self.steps_text()}, {r.total_ops:,} npu ops "
                 f"({len(r.ops)} distinct)",
                 f"  {100 * native:.1f}% of op calls ran npu kernels, {r.fallback_calls:,} fell back to the CPU; "
                 f"peak npu memory {_size(r.peak_allocated)}"]
        if r.compile:
            c = r.compile
            breaks = max(sum(c["graph_breaks"].values()), c.get("break_sites", 0))
            recompiled = sum(1 for x in c.get("compiles", ()) if x["compile_id"] and not x["compile_id"].endswith("/0"))
            names = sorted({x["function"] for x in c.get("compiles", ())})
            line = (f"  torch.compile: {c['frames']} frame{'s' if c['frames'] != 1 else ''} compiled into "
                    f"{c['graphs']} graph{'s' if c['graphs'] != 1 else ''}, {breaks} graph break"
                    f"{'s' if breaks != 1 else ''}, {recompiled} recompilation{'s' if recompiled != 1 else ''}")
            if names:
                line += f"; functions: {', '.join(names[:6])}" + (", ..." if len(names) > 6 else "")
            if c["graph_breaks"]:
                reason, n = max(c["graph_breaks"].items(), key=lambda kv: kv[1])
                line += f" (most frequent break: {reason[:80]}, {n}x)"
            lines.append(line)
        if r.error:
            lines.append(f"  the script stopped with {r.error}")
        return lines

    def steps_text(self):
        r = self.run
        if r.clock == "loop" and r.loop is not None:
            return f"{r.steps} iterations of the loop at {shown_path(r.loop.file)}:{r.loop.line}"
        if r.clock == "line":
            return f"{r.steps} iterations (--steps-at)"
        if r.clock == "manual":
            return f"{r.steps} steps (Doctor.step())"
        if r.clock is None and not r.steps:
            return "no loop found"
        return f"{r.steps} optimizer steps"

    def __str__(self):
        r = self.run
        lines = self.header_lines() + [""]
        major = [f for f in r.findings if not getattr(f, "minor", False)]
        minor = [f for f in r.findings if getattr(f, "minor", False)]
        verdict = self.verdict
        if not major:
            lines.append(CLEAN_ON.format(chip=verdict.device_name) if verdict is not None else CLEAN)
        else:
            on = f" (on {verdict.device_name})" if verdict is not None else ""
            lines.append(f"{len(major)} finding{'s' if len(major) > 1 else ''}{on}, costliest first:")
            for i, f in enumerate(major, 1):
                lines += ["", f"{i}. [{f.kind}] {f.title}", f"   at {f.where}" + (f"    {f.code}" if f.code else "")]
                inside = f.details.get("inside")
                if inside:
                    lines.append(f"   inside {shown_path(inside['file'])}:{inside['line']} (an installed package)")
                chip = r.verdict.device_name if r.verdict is not None else None
                if cost_text(f, chip):
                    lines.append(f"   cost: {cost_text(f, chip)}")
                if f.other_locations:
                    lines.append(f"   also at: {other_locations_text(f)}")
                lines.append(f"   fix: {f.remedy}")
        if minor:
            where = (f"under 1% of the steps' time projected on {r.verdict.device_name}" if r.verdict is not None
                     else "under 1% of the npu time")
            lines += ["", f"Minor ({where} each; fix them last): "
                          + "; ".join(f"[{f.kind}] {f.title} at {f.where}" for f in minor)]
        lines += ["", self.ops_table()]
        profile = r.profile
        if profile and "analysis" in profile:
            lines += ["", f"Profile of {profile['steps']} steps here, on the emulated npu (torch_npu.profiler):",
                      profile["analysis"].text(chip=False)]
        elif profile and "error" in profile:
            lines += ["", f"The profiler failed: {profile['error']}"]
        if r.compared is not None:
            lines += ["", f"--compare: {r.compared:,} npu op calls compared with the cpu; "
                          f"{len(r.mismatches)} op{'s' if len(r.mismatches) != 1 else ''} differ"]
        if verdict is not None:
            lines += [""] + verdict.lines()
        for other in r.also:
            lines += [""] + other.lines()
        return "\n".join(lines)

    @property
    def verdict(self):
        """The target chip's section (doctor/_target.py), or None without a target."""
        if self.run.target is None:
            return None
        return self.run.verdict

    def ops_table(self, k=12):
        rows = [f"Top npu ops by host time ({len(self.run.ops)} distinct):",
                f"  {'op':<36} {'calls':>8} {'host ms':>9} {'device us*':>10}  backend"]
        for o in self.run.ops[:k]:
            device = f"{o.profiled_device_us:.0f}" if o.profiled_device_us is not None else "-"
            rows.append(f"  {o.op[:36]:<36} {o.calls:>8} {o.host_s * 1e3:>9.2f} {device:>10}  {o.backend}")
        if any(o.profiled_device_us is not None for o in self.run.ops):
            rows.append("  * device time in the profiled steps")
        return "\n".join(rows)

    # ---- data ----

    def as_dict(self):
        r = self.run
        return {
            "schema": SCHEMA,
            "script": r.script,
            "started": r.started,
            "device": r.device,
            "wall_s": r.wall_s,
            "steps": r.steps,
            "npu_ops": r.total_ops,
            "fallback_calls": r.fallback_calls,
            "peak_allocated_bytes": r.peak_allocated,
            "error": r.error,
            "findings": [f.as_dict() for f in r.findings],
            "ops": [{"op": o.op, "calls": o.calls, "host_s": o.host_s, "fallbacks": o.fallbacks,
                     "backend": o.backend, "profiled_host_us": o.profiled_host_us,
                     "profiled_device_us": o.profiled_device_us} for o in r.ops],
            "fallbacks": {op: {"count": s.count, "seconds": s.seconds, "bytes_copied": s.bytes_copied}
                          for op, s in r.fallback_stats.items()},
            "memory": [{"t": t, "allocated": a, "reserved": rv} for t, a, rv in r.memory],
            "step_memory": [{"step": n, "t": t, "allocated": a, "reserved": rv} for n, t, a, rv in r.step_memory],
            "profile": None if not r.profile or "analysis" not in r.profile else _analysis_dict(r.profile),
            "compare": None if r.compared is None else {"compared": r.compared, "mismatches": [
                {"op": m.op, "bad_calls": m.bad_calls, "calls": m.calls, "max_abs_diff": m.max_abs_diff,
                 "dtype": m.dtype, "inputs": m.inputs} for m in r.mismatches]},
            "target": None if self.verdict is None else self.verdict.as_dict(),
            "also_targets": [v.as_dict() for v in r.also],
            "compile": r.compile,
        }

    def to_json(self, path):
        with open(path, "w") as f:
            json.dump(_finite(self.as_dict()), f, indent=1, default=str)

    # ---- html ----

    def to_html(self, path):
        with open(path, "w") as f:
            f.write(_html.render(self))


def _analysis_dict(profile):
    a = profile["analysis"]
    return {"steps": profile["steps"], "wall_us": a.wall_us, "device_busy_us": a.device_busy_us,
            "device_idle_us": a.device_idle_us, "host_wait_us": a.host_wait_us, "bound": a.bound,
            "kernels": a.kernels, "short_kernels": a.short_kernels, "launch_bound": a.launch_bound}


def _finite(value):
    """JSON has no inf or nan: they become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
