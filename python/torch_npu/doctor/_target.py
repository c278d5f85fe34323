"""The real chip's verdict: what the run meets on a target chip.

The CLI runs the script as the target (``--target``, default ascend910b2: the
npu emulates that chip's support set, dtypes and numerics), so its fallbacks,
refused dtypes and float16 saturation are the chip's own, found in the run and
reported as findings. A Doctor whose npu emulates another profile (``Doctor(target=)``
in code, or ``--also-target``) answers from the ops the run saw: exact where the
two chips treat those ops alike, and saying where not.

Costs are projected with the target's cost model (profiles/*.toml, each figure
with its source; profiler/_projection.py): the profiled steps replayed on the
chip's timeline (the host's Python measured here, the adapter's dispatch per
launch, kernels at their overhead and roofline, the host's waits), and each
finding's cost from its counts: ``projected_cost``. Both use counts and the
profile's figures only, no host timing of this machine, so a finding's rank and
its major/minor split are the same from run to run.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ._findings import UNFLOORED, overflow_sites, rank_key, shown_path

DEFAULT_TARGET = "ascend910b2"
_MINOR_SHARE = 0.01       # a finding costing less than this share of the steps' projected time is minor


@dataclass
class TargetFallback:
    op: str
    calls: int
    sites: List[Tuple[str, int, int]]   # (file, line, calls), most calls first
    here: str                           # how it ran in this run: "cpu" (fell back here too), "npu", "composite"


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
    exact: bool = True               # the run emulated the target: what ran is what the chip runs
    not_exact: List[str] = field(default_factory=list)   # where the answer is derived, and why
    fallbacks: List[TargetFallback] = field(default_factory=list)
    refused_dtypes: List[str] = field(default_factory=list)
    overflow_sites: List[Tuple[str, int, int]] = field(default_factory=list)   # float16 results past its range
    steps: int = 0                   # profiled steps the projection covers (0: none)
    step: object = None              # _projection.ChipProjection of one step, or None
    ranked: List[RankedFinding] = field(default_factory=list)
    figures: Dict[str, str] = field(default_factory=dict)   # cost figure -> "value (basis: source)"

    @property
    def bound(self):
        return self.step.bound if self.step is not None else None

    @property
    def kernels_per_step(self):
        return self.step.kernels if self.step is not None else 0.0

    @property
    def device_ms_per_step(self):
        return self.step.device_us / 1e3 if self.step is not None else 0.0

    @property
    def host_ms_per_step(self):
        return self.step.host_us / 1e3 if self.step is not None else 0.0

    @property
    def step_ms(self):
        return self.step.step_us / 1e3 if self.step is not None else 0.0

    @property
    def launch_ms_per_step(self):
        """The host's dispatch of the step's launches on the real adapter."""
        return self.step.dispatch_us / 1e3 if self.step is not None else 0.0

    @property
    def graph_ms_per_step(self):
        """The step's device work replayed as one graph (no dispatch per kernel)."""
        return self.step.as_graph_us / 1e3 if self.step is not None else 0.0

    def suggestion(self):
        """What would make the step faster there (not a finding: a clean script can be host-bound)."""
        if self.step is None or not self.step.kernels:
            return ""
        if self.bound == "host":
            graph = self.graph_ms_per_step
            gain = f" (projected {graph:.3g} ms a step, {self.step_ms / graph:.1f}x faster)" if graph > 0 else ""
            blockers = [what for what, n in (("CPU fallbacks", self.step.fallbacks), ("host reads", self.step.waits))
                        if n]
            graph_text = ("capture the step as an NPUGraph" + gain if not blockers else
                          f"once its {' and '.join(blockers)} are out of the step, capture it as an NPUGraph" + gain)
            return ("the chip waits for the host's launches: " + graph_text
                    + ", torch.compile it (fewer, fused kernels), or use fewer, larger ops")
        return ("the chip's own work dominates: look at the largest kernels (the profiler's 'NPU projected' "
                "column) and at float32 matmuls that could run in bfloat16 or float16")

    def lines(self):
        how = ("the run emulated it: its support set, dtypes and numerics" if self.exact else
               "answered from a run on another profile: " + "; ".join(self.not_exact))
        out = [f"On {self.device_name} (target '{self.target}'; {how}):"]
        if self.step is not None:
            p = self.step
            out.append(f"  a step takes {p.step_us / 1e3:.2f} ms there (projected, an estimate), {p.bound}-bound: the "
                       f"chip idles {100 * p.device_idle_us / p.step_us if p.step_us else 0:.0f}% of it")
            out.append(f"    host {p.host_us / 1e3:.2f} ms: Python {p.python_us / 1e3:.2f} ms (measured here) + "
                       f"dispatch of {p.launches:,.0f} launches {p.dispatch_us / 1e3:.2f} ms "
                       f"(host_dispatch_us {self.figures.get('host_dispatch_us', '?')})"
                       + (f" + host-side ops {p.host_ops_us / 1e3:.2f} ms" if p.host_ops_us >= 5 else "")
                       + (f" + CPU fallbacks {p.fallback_host_us / 1e3:.2f} ms" if p.fallbacks else "")
                       + (f"; waits {p.wait_us / 1e3:.2f} ms for the device" if p.waits else ""))
            out.append(f"    device {p.device_us / 1e3:.2f} ms: {p.kernels:,.0f} kernels and {p.copies:,.0f} copies, "
                       f"per-kernel overhead {p.overhead_us / 1e3:.2f} ms (kernel_overhead_us "
                       f"{self.figures.get('kernel_overhead_us', '?')})")
            suggestion = self.suggestion()
            if suggestion:
                out.append(f"  to go faster there: {suggestion}")
        else:
            out.append("  no profiled steps to project (run without --no-profile, with at least 5 iterations)")
        if self.fallbacks:
            n = len(self.fallbacks)
            out.append(f"  falls back to the CPU there ({n} op{'s' if n != 1 else ''}):")
            for f in self.fallbacks[:10]:
                where = ", ".join(f"{_short(path)}:{line} ({k})" for path, line, k in f.sites[:3]) or "(no line)"
                out.append(f"    {f.op}: {f.calls} calls, at {where}")
        else:
            out.append("  no op of this run falls back to the CPU there")
        for dtype in self.refused_dtypes:
            out.append(f"  {dtype}")
        if self.ranked:
            out.append("  the findings above are ranked by their cost projected there")
        return out

    def as_dict(self):
        return {"target": self.target, "device_name": self.device_name, "exact": self.exact,
                "not_exact": list(self.not_exact),
                "fallbacks": [{"op": f.op, "calls": f.calls, "here": f.here,
                               "sites": [{"file": p, "line": n, "calls": c} for p, n, c in f.sites]}
                              for f in self.fallbacks],
                "refused_dtypes": list(self.refused_dtypes), "steps": self.steps,
                "float16_overflows": [{"file": p, "line": n, "calls": c} for p, n, c in self.overflow_sites],
                "kernels_per_step": self.kernels_per_step, "device_ms_per_step": self.device_ms_per_step,
                "launch_ms_per_step": self.launch_ms_per_step, "host_ms_per_step": self.host_ms_per_step,
                "step_ms": self.step_ms, "graph_ms_per_step": self.graph_ms_per_step,
                "python_ms_per_step": self.step.python_us / 1e3 if self.step is not None else 0.0,
                "bound": self.bound, "figures": dict(self.figures),
                "ranked": [{"index": r.index, "kind": r.kind, "projected_s": r.projected_s} for r in self.ranked]}


def _short(path):
    return shown_path(path)


# ---- what the run's ops do on another chip ------------------------------------------

def _fate(op, profile):
    """"npu", "composite" (decomposes into other ops) or "cpu" for aten op ``op`` on ``profile``;
    None for an op the registry does not know."""
    from ..ops import registry as _ops_registry
    info = _ops_registry.get(op, profile=profile)
    return None if info is None else info.backend


def _cross_fallbacks(run, target):
    """The run's ops as ``target`` would run them: (fallbacks, reasons it is not exact)."""
    from .._emu import profiles as _profiles
    here = _profiles.active().name
    calls_at = {}
    for site in run.sites:
        for op, n in site.op_names.items():
            calls_at.setdefault(op, []).append((site.file, site.line, n))
    # Fallbacks of this run, and the ops they ran inside (a decomposition's part, a backward's op).
    fell = {}
    for site in run.sites:
        for (op, reason), n in site.fallbacks.items():
            if reason in ("no_kernel", "dtype", "float64"):
                fell.setdefault(op, []).append((site, n))
    out, unsure = {}, []
    seen_here = {s.op: s for s in run.ops}
    for summary in run.ops:
        if not summary.op.startswith("aten::"):
            continue
        now, there = _fate(summary.op, here), _fate(summary.op, target)
        if there == "cpu" and now != "cpu":
            sites = sorted(calls_at.get(summary.op, []), key=lambda s: -s[2])
            out[summary.op] = TargetFallback(summary.op, summary.calls, sites, "composite" if now == "composite" else "npu")
        elif there == "composite" and now == "npu":
            unsure.append(f"{summary.op} decomposes there into ops this run did not run")
    for op, hits in fell.items():
        parents = set()
        for site, _ in hits:
            parents.update(site.fallback_parents.get(op, {}))
        # Inside an op the target runs natively, the part never runs there.
        if parents and all(_fate(p, target) == "npu" for p in parents if p in seen_here or p.startswith("aten::")):
            continue
        there = _fate(op, target)
        if there == "cpu" or there is None:
            sites = sorted(((s.file, s.line, n) for s, n in hits), key=lambda s: -s[2])
            out.setdefault(op, TargetFallback(op, sum(n for _, n in hits), sites, "cpu"))
        elif there == "composite":
            unsure.append(f"{op} falls back here and decomposes there")
    return sorted(out.values(), key=lambda f: -f.calls), sorted(set(unsure))[:5]


def _run_fallbacks(run):
    """The run's own fallbacks (it ran as the target): per op, its calls and lines."""
    by_op = {}
    for site in run.sites:
        for (op, reason), n in site.fallbacks.items():
            if reason in ("no_kernel", "dtype", "float64"):
                by_op.setdefault(op, []).append((site.file, site.line, n))
    return sorted((TargetFallback(op, sum(n for *_, n in hits), sorted(hits, key=lambda s: -s[2]), "cpu")
                   for op, hits in by_op.items()), key=lambda f: -f.calls)


def verdict(run, target, exact):
    """The section for chip profile ``target`` of a finished run; ``exact``: the npu emulated it."""
    from .._emu import profiles as _profiles
    chip = _profiles.load(target)
    out = Verdict(target=target, device_name=chip.device_name, exact=exact)
    out.figures = {k: f"{f.value:g} ({f.label})" for k, f in (chip.cost_figures or {}).items()}
    if exact:
        out.fallbacks = _run_fallbacks(run)
    else:
        out.fallbacks, unsure = _cross_fallbacks(run, target)
        here = _profiles.active()
        out.not_exact.append(f"the npu ran as '{here.name}', so the ops are that profile's")
        out.not_exact += unsure
        if here.inf_nan != chip.inf_nan:
            out.not_exact.append("float16 overflow is " + ("saturated there" if not chip.inf_nan else "inf there"))
    # Dtypes: bfloat16 on a chip without it; float16 results past its range where it saturates.
    if not chip.bfloat16:
        bf16 = [s for s in run.sites if s.bf16_ops]
        if bf16:
            s = max(bf16, key=lambda s: s.bf16_ops)
            out.refused_dtypes.append(
                f"bfloat16 is refused there ({chip.device_name} has no bfloat16 units): {sum(x.bf16_ops for x in bf16)} "
                f"ops used it, first at {_short(s.file)}:{s.line}; use float16 (autocast dtype=torch.float16)")
    if not chip.inf_nan:
        out.overflow_sites = overflow_sites(run)
        f16 = [s for s in run.sites if s.f16_ops]
        if out.overflow_sites:
            where = ", ".join(f"{_short(f)}:{n} ({k})" for f, n, k in out.overflow_sites[:3])
            out.refused_dtypes.append(
                f"float16 results past +-65504 in {sum(k for *_, k in out.overflow_sites)} op calls, at {where}: "
                f"{chip.device_name} saturates them to +-65504 instead of giving inf")
        elif f16:
            s = max(f16, key=lambda s: s.f16_ops)
            out.refused_dtypes.append(
                f"float16 overflow saturates to +-65504 there instead of giving inf; no float16 result of this run "
                f"overflowed ({sum(x.f16_ops for x in f16)} float16 ops, first at {_short(s.file)}:{s.line})")
    window = (run.profile or {}).get("projections", {}).get(target)
    if window is not None:
        from ..profiler._projection import per_step
        out.steps = max(run.profile.get("steps", 1), 1)
        out.step = per_step(window, out.steps)
    return out


# ---- each finding's cost there ----------------------------------------------------

def projected_cost(finding, cost):
    """A finding's cost on the chip, seconds, from its counts and bytes and the profile's
    figures (each event as the cost model charges it; no host timing of this run):
    a wait for the device costs the wait's latency and the dispatch that restarts the
    chip; a fallback waits, copies its bytes both ways and dispatches again; a copy in
    dispatches and crosses the link; a tiny kernel costs its dispatch."""
    dispatch = cost["host_dispatch_us"] * 1e-6
    sync = cost["sync_us"] * 1e-6
    link = cost["link_gbps"] * 1e9
    memory = cost["memory_gbps"] * 1e9
    n, nbytes = max(finding.count, 0), max(finding.bytes, 0)
    if finding.kind == "hidden_sync":
        return n * (sync + dispatch)
    if finding.kind in ("cpu_fallback", "float64"):
        return n * (sync + 2 * dispatch) + 2 * nbytes / link
    if finding.kind == "host_to_device_copy":
        return n * dispatch + nbytes / link
    if finding.kind == "launch_bound":
        return n * dispatch
    if finding.kind == "strided_copy":
        return n * dispatch + 2 * nbytes / memory
    return 0.0


def step_cost(run, verdict, cost):
    """The projected time of the run's steps there, seconds, from counts: the profiled
    steps' device work and dispatch (not the measured Python), else the launches counted
    by the doctor at the adapter's dispatch each."""
    steps = max(run.steps, 1)
    if verdict.step is not None:
        per = max(verdict.step.device_us, verdict.step.dispatch_us) * 1e-6
    else:
        per = run.total_ops / steps * cost["host_dispatch_us"] * 1e-6
    return per * steps


def rank(run, findings, target, exact):
    """The verdict for ``target``, and ``findings`` re-ranked in place by their projected
    cost there (``Finding.projected_s``); minor: under _MINOR_SHARE of the steps' projected
    time. Findings whose cost is not time (wrong results, float64, memory growth, the
    chip's refusals and saturation, compilation) are never minor."""
    from .._emu import profiles as _profiles
    out = verdict(run, target, exact)
    cost = _profiles.load(target).cost
    floor = _MINOR_SHARE * step_cost(run, out, cost)
    for f in findings:
        f.projected_s = projected_cost(f, cost)
        f.minor = f.kind not in UNFLOORED and f.projected_s < floor
    findings.sort(key=rank_key)
    out.ranked = [RankedFinding(i, f.kind, f.title, f.where, f.projected_s)
                  for i, f in enumerate(findings, 1) if f.projected_s]
    return out
