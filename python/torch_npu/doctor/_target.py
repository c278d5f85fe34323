"""The real chip's verdict: what the run would meet on a target chip.

Whatever device profile the run used, the report ends with a section for a
target chip profile (``--target``, default ascend910b2): the ops that would
fall back there (from the registry's answer for that profile, with the lines
and calls this run made), the dtypes it refuses, the projected device time per
iteration against the host's launching time (the profiled steps are projected
onto the target, csrc/core/profile.h), and the findings re-ranked by their
projected cost on the chip, where a sync drains a deep queue and every launch
costs the chip's launch overhead. Every projected figure is an estimate of
the profile's cost model.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

DEFAULT_TARGET = "ascend910b2"


@dataclass
class TargetFallback:
    op: str
    calls: int
    sites: List[Tuple[str, int, int]]   # (file, line, calls), most calls first
    here: str                           # how it ran in this run: "npu", "composite" or "cpu"


@dataclass
class RankedFinding:
    index: int            # 1-based, in the report's own order
    kind: str
    title: str
    where: str
    projected_s: float    # its cost on the target, per the cost model


@dataclass
class Verdict:
    target: str                      # profile name
    device_name: str                 # "Ascend910B2"
    fallbacks: List[TargetFallback] = field(default_factory=list)
    refused_dtypes: List[str] = field(default_factory=list)
    steps: int = 0                   # profiled steps the projection covers (0: none)
    kernels_per_step: float = 0.0
    device_ms_per_step: float = 0.0
    launch_ms_per_step: float = 0.0
    host_ms_per_step: float = 0.0
    bound: Optional[str] = None      # "host" or "device" on the target
    ranked: List[RankedFinding] = field(default_factory=list)
    overflow_sites: List[Tuple[str, int, int]] = field(default_factory=list)   # float16 results that were inf

    @property
    def remedy(self):
        if self.bound == "host":
            return ("the chip would wait for the host's launches: torch.compile the step (fused kernels, fewer "
                    "launches), capture it as a graph, or use fewer, larger ops (batch the Python loops)")
        if self.bound == "device":
            return ("the chip's own work dominates: look at the largest kernels (the profiler's 'NPU projected' "
                    "column) and at float32 matmuls that could run in bfloat16 or float16")
        return ""

    def lines(self):
        out = [f"On {self.device_name} (target '{self.target}'; projected with its cost model, an estimate):"]
        if self.steps:
            out.append(f"  {self.bound}-bound on {self.device_name}: {self.kernels_per_step:,.0f} kernels per step, "
                       f"{self.device_ms_per_step:.1f} ms of device work, {self.launch_ms_per_step:.1f} ms of "
                       f"launches; the host spends {self.host_ms_per_step:.1f} ms launching them")
            out.append(f"  fix: {self.remedy}")
        else:
            out.append("  no profiled steps to project (run without --no-profile, with at least 5 iterations)")
        if self.fallbacks:
            n = len(self.fallbacks)
            out.append(f"  would fall back to the CPU there ({n} op{'s' if n != 1 else ''}):")
            for f in self.fallbacks[:10]:
                where = ", ".join(f"{_short(path)}:{line} ({n})" for path, line, n in f.sites[:3])
                note = " (falls back in this run too)" if f.here == "cpu" else ""
                out.append(f"    {f.op}: {f.calls} calls{note}, at {where}")
        else:
            out.append("  no op of this run would fall back there")
        for dtype in self.refused_dtypes:
            out.append(f"  {dtype}")
        if self.ranked:
            out.append("  the findings above are ranked by their cost projected there")
        return out

    def as_dict(self):
        return {"target": self.target, "device_name": self.device_name,
                "fallbacks": [{"op": f.op, "calls": f.calls, "here": f.here,
                               "sites": [{"file": p, "line": n, "calls": c} for p, n, c in f.sites]}
                              for f in self.fallbacks],
                "refused_dtypes": list(self.refused_dtypes), "steps": self.steps,
                "float16_overflows": [{"file": p, "line": n, "calls": c} for p, n, c in self.overflow_sites],
                "kernels_per_step": self.kernels_per_step, "device_ms_per_step": self.device_ms_per_step,
                "launch_ms_per_step": self.launch_ms_per_step, "host_ms_per_step": self.host_ms_per_step,
                "bound": self.bound,
                "ranked": [{"index": r.index, "kind": r.kind, "projected_s": r.projected_s} for r in self.ranked]}


def _short(path):
    from ._findings import shown_path
    return shown_path(path)


def _projected_cost(finding, cost, backlog_s=0.0, iterations=0):
    """A finding's cost on the chip, seconds: each launch, copy or sync pays the chip's
    launch overhead; bytes cross the host link or device memory at their speed. A host
    read also drains the chip's queue: the chip then idles through the host's time until
    its next launch (measured here, ``host_gap_s``), where without the wait it would have
    worked through its backlog (``backlog_s`` per step: the chip's time per step beyond the
    host's, from the profiled steps; none when the chip keeps up with the host)."""
    launch = cost["launch_us"] * 1e-6
    link = cost["link_gbps"] * 1e9
    memory = cost["memory_gbps"] * 1e9
    n, nbytes = max(finding.count, 0), max(finding.bytes, 0)
    gap = finding.details.get("host_gap_s", 0.0) if finding.kind == "hidden_sync" else 0.0
    waits = min(gap, min(n, iterations) * backlog_s) if iterations else 0.0
    if finding.kind == "hidden_sync":
        return n * 2 * launch + waits              # the queue drains, then the launches restart
    if finding.kind in ("cpu_fallback", "float64"):
        return n * 2 * launch + 2 * nbytes / link           # a sync, copies both ways
    if finding.kind == "host_to_device_copy":
        return n * launch + nbytes / link
    if finding.kind == "launch_bound":
        return n * launch
    if finding.kind == "strided_copy":
        return n * launch + 2 * nbytes / memory
    if finding.kind == "compile":
        return finding.seconds                     # compiling is host work, the same there
    return 0.0


def verdict(run, target):
    """The section for chip profile ``target`` of a finished run."""
    from .. import _ops_registry, _profiles
    chip = _profiles.load(target)
    out = Verdict(target=target, device_name=chip.device_name)
    # Ops the target lacks, with the lines that called them.
    calls_at = {}
    for site in run.sites:
        for op, n in site.op_names.items():
            calls_at.setdefault(op, []).append((site.file, site.line, n))
    for summary in run.ops:
        if not summary.op.startswith("aten::"):
            continue
        there = _ops_registry.get(summary.op, profile=target)
        if there is None or there.backend != "cpu":
            continue
        here = _ops_registry.get(summary.op)
        sites = sorted(calls_at.get(summary.op, []), key=lambda s: -s[2])
        out.fallbacks.append(TargetFallback(summary.op, summary.calls, sites,
                                            "cpu" if summary.fallbacks else (here.backend if here else "npu")))
    out.fallbacks.sort(key=lambda f: -f.calls)
    # Dtypes: bfloat16 on a chip without it; float16 overflow there saturates.
    if not chip.bfloat16:
        bf16 = [s for s in run.sites if getattr(s, "bf16_ops", 0)]
        if bf16:
            s = max(bf16, key=lambda s: s.bf16_ops)
            out.refused_dtypes.append(
                f"bfloat16 is refused there ({chip.device_name} has no bfloat16 units): {sum(x.bf16_ops for x in bf16)} "
                f"ops used it, first at {_short(s.file)}:{s.line}; use float16 (autocast dtype=torch.float16)")
    f16 = [s for s in run.sites if getattr(s, "f16_ops", 0)]
    if not chip.inf_nan and f16:
        overflowed = sorted(((s, int(s.f16_overflows.item())) for s in f16 if s.f16_overflows is not None),
                            key=lambda sn: -sn[1])
        overflowed = [(s, n) for s, n in overflowed if n]
        out.overflow_sites = [(s.file, s.line, n) for s, n in overflowed]
        if overflowed:
            where = ", ".join(f"{_short(s.file)}:{s.line} ({n})" for s, n in overflowed[:3])
            out.refused_dtypes.append(
                f"float16 results overflowed to inf in {sum(n for _, n in overflowed)} op calls of this run, at "
                f"{where}; {chip.device_name} saturates them to +-65504 instead, so what is inf here is a wrong "
                f"finite number there: scale the values down (GradScaler for gradients, a smaller init or a "
                f"clamp for activations) or compute that part in float32")
        else:
            s = max(f16, key=lambda s: s.f16_ops)
            out.refused_dtypes.append(
                f"float16 overflow saturates to +-65504 there instead of giving inf; no float16 result of this run "
                f"overflowed ({sum(x.f16_ops for x in f16)} float16 ops, first at {_short(s.file)}:{s.line})")
    # The profiled steps, projected onto the target.
    analysis = (run.profile or {}).get("analysis")
    projected = getattr(analysis, "projected_device_us", None)
    if analysis is not None and projected and getattr(analysis, "profile", None) == chip.device_name:
        steps = max(run.profile.get("steps", 1), 1)
        out.steps = steps
        out.kernels_per_step = analysis.projected_kernels / steps
        out.device_ms_per_step = analysis.projected_device_us / steps / 1e3
        out.launch_ms_per_step = analysis.projected_launch_us / steps / 1e3
        out.host_ms_per_step = analysis.projected_host_us / steps / 1e3
        out.bound = analysis.projected_bound
    return out


def rank(run, findings, target):
    """The verdict for ``target``, and ``findings`` re-ranked in place by their projected cost
    there (``Finding.projected_s``): a finding is minor only when it is minor both in this run
    and on the chip (under _MINOR_SHARE of the projected time of the run's iterations)."""
    from ._findings import _MINOR_SHARE, _UNFLOORED, emulated_cost, emulated_floor, rank_key
    out = verdict(run, target)
    from .. import _profiles
    chip_cost = _profiles.load(target).cost
    if not chip_cost:
        return out
    iterations = run.steps if out.steps else 0
    backlog_s = max(out.device_ms_per_step - out.host_ms_per_step, 0.0) / 1e3
    step_s = max(out.host_ms_per_step, out.device_ms_per_step) / 1e3
    floor, chip_floor = emulated_floor(run), _MINOR_SHARE * step_s * iterations
    for f in findings:
        f.projected_s = _projected_cost(f, chip_cost, backlog_s, iterations)
        if f.kind not in _UNFLOORED and chip_floor > 0:
            f.minor = emulated_cost(f) < floor and f.projected_s < chip_floor
    findings.sort(key=rank_key)
    out.ranked = [RankedFinding(i, f.kind, f.title, f.where, f.projected_s)
                  for i, f in enumerate(findings, 1) if f.projected_s]
    return out

