"""The chip's time of a profiled window: the cost model's host side, over the
device side that csrc/core/profile.h projects per kernel.

On a real chip a step costs the host its own Python plus the adapter's
dispatch of every op that launches device work; the device runs each kernel
in stream order, no earlier than its launch, for its per-kernel overhead plus
the longer of its compute and its memory traffic; a read of device data on the
host (``.item()``, ``.cpu()``, ``synchronize()``, a CPU fallback) waits until
the device has drained its queue, plus the latency of the wait. A replayed
graph's kernels are launched by the device (one dispatch for the replay).

The emulator's own host time is not the chip's and is not used, except for
what the real host does too: the Python between ops (the window's host time in
which no op runs), ops that launch nothing (views, work on host tensors), and
a fallback's computation on the CPU.

``project(results, projections, profile)`` replays a finished profile's window
on that timeline. Every figure it uses is the profile's, with its basis and
source (``profiles/*.toml``); the result names them (``ChipProjection.terms``).
"""
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch

# The host waits that a chip has too (a synchronize, a drain); the emulator's other wait,
# npuStreamWait (a host-run op holding a stream behind queued work), is a launch there.
_WAIT_NAMES = ("npuStreamSynchronize",)
_EMULATOR_WAITS = ("npuStreamWait",)
# PyTorch's record of a Python dispatch mode at work (an observer such as the doctor's):
# its time is the observer's.
_OBSERVER_EVENTS = ("PythonDispatchMode",)
_LAUNCH_NAMES = ("npuLaunchKernel", "npuMemcpy", "npuCpuFallback")
# The figures the host side reads from a profile's [cost].
HOST_FIGURES = ("host_dispatch_us", "sync_us")


@dataclass
class ChipProjection:
    """A profiled window as the chip of ``profile`` would run it, in microseconds."""

    profile: str                 # profile name ("ascend910b2")
    device_name: str             # "Ascend910B2"
    step_us: float = 0.0         # the window, start to end, on the chip
    python_us: float = 0.0       # the host's own Python between ops (measured here)
    host_ops_us: float = 0.0     # ops that launch nothing (views, host tensors; measured here)
    dispatch_us: float = 0.0     # the adapter's dispatch of the launches (count x host_dispatch_us)
    fallback_host_us: float = 0.0  # CPU fallbacks: their computation on the host (measured) and copies
    wait_us: float = 0.0         # the host waiting for the device (drains and the wait's latency)
    device_us: float = 0.0       # kernels and copies on the device, overheads included
    overhead_us: float = 0.0     # ... of which per-kernel overheads
    launches: int = 0            # kernels and copies the host dispatched
    kernels: int = 0             # kernels (a replayed graph's included)
    graph_kernels: int = 0       # ... of them launched by graph replays
    copies: int = 0
    fallbacks: int = 0
    waits: int = 0               # host waits for the device
    as_graph_us: float = 0.0     # the same device work replayed as one graph (no dispatch, graph overheads)
    terms: Dict[str, str] = field(default_factory=dict)   # figure -> "value (basis: source)"
    host_ops: Dict[str, float] = field(default_factory=dict)   # host_ops_us by op name

    @property
    def host_us(self):
        """The host's busy time: Python, dispatch, host-side ops and fallbacks (not its waits)."""
        return self.python_us + self.host_ops_us + self.dispatch_us + self.fallback_host_us

    @property
    def device_idle_us(self):
        return max(0.0, self.step_us - self.device_us)

    @property
    def bound(self):
        """"host" when the chip would idle more than half of the window (waiting for
        launches or for host work), else "device"."""
        return "host" if self.step_us > 0 and self.device_idle_us > 0.5 * self.step_us else "device"


def _events(results):
    """(host ops, host waits, device activities, every wait's span) of a profile's Kineto
    results: each (start_ns, end_ns, thread, correlation, name)."""
    npu = torch._C._autograd.DeviceType.PrivateUse1
    ops, waits, device, blocked = [], [], [], []
    for e in results.events():
        name = e.name()
        if name == "[memory]" or name in _LAUNCH_NAMES:
            continue
        start = e.start_ns()
        item = (start, start + e.duration_ns(), e.start_thread_id(), e.correlation_id(), name)
        if e.device_type() == npu:
            device.append(item)
        elif name in _WAIT_NAMES or name in _EMULATOR_WAITS or name in _OBSERVER_EVENTS:
            # The emulator's time waiting for its own device work is no Python of the script.
            blocked.append((item[0], item[1]))
            if name in _WAIT_NAMES:
                waits.append(item)
        elif not e.is_user_annotation():
            ops.append(item)
    return ops, waits, device, blocked


def _top_level(ops):
    """The ops no other op of their thread contains, in time order; for every op's
    correlation id the index of the top-level op it runs in; and per top-level op, the
    names of the ops it contains."""
    tops, of, inner = [], {}, []
    last_end = {}   # thread -> (end of its current top-level op, its index)
    for start, end, thread, correlation, name in sorted(ops):
        current = last_end.get(thread)
        if current is not None and start < current[0]:
            index = current[1]
            inner[index].append(name)
        else:
            index = len(tops)
            tops.append([start, end, thread, correlation, name])
            inner.append([])
            last_end[thread] = (end, index)
        of[correlation] = index
    return tops, of, inner


def _host_op_ns(name, inner, measured, pure_us):
    """What an op that launches nothing costs a real host: its own time as measured without
    an observer (``pure_us``, by op name); for an op that reaches the observer only through
    the ops it calls (a composite such as reshape, a backward node), theirs; else as measured."""
    if name in pure_us:
        return pure_us[name] * 1e3
    known = [pure_us[n] for n in inner if n in pure_us]
    if inner and known:
        return sum(known) * 1e3
    return float(measured)


def _overlap(intervals, begin, end):
    """How much of [begin, end) the (start, end) intervals cover."""
    return sum(max(0, min(e, end) - max(s, begin)) for s, e in intervals if s < end and e > begin)


class _Timeline:
    """The chip's clock: the host's time, and each stream's end of queued work."""

    def __init__(self):
        self.host = 0.0
        self.stream_end = {}

    def launch(self, stream, duration):
        start = max(self.host, self.stream_end.get(stream, 0.0))
        self.stream_end[stream] = start + duration

    def drained(self):
        return max(self.stream_end.values(), default=0.0)


def project(results, projections, profile, op_host_us: Optional[Dict[str, float]] = None, python: bool = True,
            not_python=()):
    """``ChipProjection`` of a finished profile's window (``results``: its Kineto results;
    ``projections``: the session's records, profiler/_analyse.py) onto chip profile
    ``profile`` (a ``torch_npu._emu.profiles.Profile`` with a cost model). ``op_host_us``: per
    op name, its host time without any observer's overhead, for ops that launch nothing
    (the doctor measures it; else the profile's own measurement). ``python=False``: the
    ops are called from C++ on the real system, with no Python between them.
    ``not_python``: (start, end) ns of an observer's own work between ops (the doctor's
    bookkeeping at each step), left out of the Python time."""
    from .. import _C
    from .._emu import profiles as _profiles
    _profiles.define(profile.name)   # its device side is projected in C++
    cost, figures = profile.cost, profile.cost_figures
    out = ChipProjection(profile.name, profile.device_name)
    out.terms = {k: f"{figures[k].value:g} ({figures[k].label})" for k in HOST_FIGURES + (
        "kernel_overhead_us", "graph_kernel_overhead_us", "cube_fp16_tflops", "memory_gbps", "link_gbps")}
    dispatch, sync = cost["host_dispatch_us"] * 1e3, cost["sync_us"] * 1e3
    ops, waits, device, blocked = _events(results)
    if not ops and not device:
        return out
    not_python = list(not_python) + blocked
    tops, top_of, inner = _top_level(ops)
    # Each projected activity, at the top-level op that launched it (by correlation) or, for
    # one launched outside any op, on its own; in launch order (the emulator's order).
    by_key = {(p.correlation, p.measured_start_ns): p for p in projections}
    work = [[] for _ in tops]
    loose = []
    for start, end, thread, correlation, name in sorted(device):
        p = by_key.get((correlation, start))
        if p is None:
            continue
        index = top_of.get(correlation)
        (work[index] if index is not None else loose).append(p)
    waits_in = [[] for _ in tops]   # the op's waits (one or more: the host waits once, at its end)
    loose_waits = []
    for start, end, thread, correlation, name in waits:
        index = top_of.get(correlation)
        if index is None:   # a wait outside any op (torch.npu.synchronize()): at its place in time
            loose_waits.append(start)
        else:
            waits_in[index].append(start)

    def device_ns(p):
        if profile.name == _C._projection_profile():
            return float(p.projected_ns)
        if p.kind == "kernel":
            return float(_C._project_kernel_ns(profile.name, p.flops, p.bytes, p.matrix, p.bits, p.known, p.in_graph))
        copy = float(_C._project_copy_ns(profile.name, p.bytes, p.crosses_link, p.in_graph))
        return copy + (p.host_ns if p.kind == "fallback" else 0.0)

    overhead = {False: cost["kernel_overhead_us"] * 1e3, True: cost["graph_kernel_overhead_us"] * 1e3}
    graph_overhead = overhead[True]
    t = _Timeline()
    totals = {"python": 0.0, "host_ops": 0.0, "dispatch": 0.0, "fallback": 0.0, "wait": 0.0, "device": 0.0,
              "overhead": 0.0, "as_graph": 0.0}

    def wait():
        """The host waits for the device: until its queue drains, plus the wait's latency
        (none when nothing is queued: the call returns at once)."""
        if t.drained() <= t.host:
            return
        before = t.host
        t.host = t.drained() + sync
        totals["wait"] += t.host - before
        out.waits += 1

    def run(p, dispatched):
        ns = device_ns(p)
        if p.kind == "fallback":
            # The host waits for the fallback's inputs, computes on the CPU and copies both ways.
            wait()
            t.host += ns
            totals["fallback"] += ns
            out.fallbacks += 1
            return
        if dispatched:
            t.host += dispatch
            totals["dispatch"] += dispatch
            out.launches += 1
        if p.host_synchronous:
            # A copy the host makes itself in stream order (.cpu(), .item(), from pageable
            # memory), after the work queued before it. A copy to the host then waits for the
            # device to hand the data over (the wait's latency, queued work or not); one from
            # pageable memory returns once the data is staged.
            before = t.host
            t.host = max(t.host, t.drained()) + ns
            if p.name.endswith("DtoH"):
                t.host += sync
                out.waits += 1
            totals["wait"] += t.host - before - ns
            t.stream_end[p.stream] = max(t.stream_end.get(p.stream, 0.0), t.host)
        else:
            t.launch(p.stream, ns)
        own_overhead = overhead[p.in_graph]
        totals["device"] += ns
        totals["overhead"] += own_overhead
        totals["as_graph"] += ns - own_overhead + graph_overhead
        if p.kind == "kernel":
            out.kernels += 1
            out.graph_kernels += p.in_graph
        else:
            out.copies += 1

    # Only the threads that work with the npu (the script's, autograd's): another thread's
    # host work (a data loader's) runs beside them, not on the path of a step.
    npu_threads = {tops[i][2] for i in range(len(tops)) if work[i] or waits_in[i]}
    kept = [i for i in range(len(tops)) if tops[i][2] in npu_threads]
    loose.sort(key=lambda p: p.measured_start_ns)
    loose_at = [p.measured_start_ns for p in loose]
    loose_waits.sort()
    next_loose = next_wait = 0
    covered_until = tops[kept[0]][0] if kept else 0

    def catch_up(until):
        """What happened outside any op before ``until``: loose launches and waits, in order."""
        nonlocal next_loose, next_wait
        while True:
            a = loose_at[next_loose] if next_loose < len(loose) else None
            b = loose_waits[next_wait] if next_wait < len(loose_waits) else None
            if (a is None or a >= until) and (b is None or b >= until):
                return
            if b is None or (a is not None and a <= b):
                run(loose[next_loose], dispatched=not loose[next_loose].in_graph)
                next_loose += 1
            else:
                wait()
                next_wait += 1

    for index in kept:
        start, end, thread, correlation, name = tops[index]
        catch_up(start)
        gap = max(0.0, start - covered_until) if python else 0.0   # no op ran: the script's own Python
        if gap and not_python:
            gap = max(0.0, gap - _overlap(not_python, covered_until, start))
        t.host += gap
        totals["python"] += gap
        covered_until = max(covered_until, end)
        launched = work[index]
        if not launched and not waits_in[index]:
            ns = _host_op_ns(name, inner[index], end - start, op_host_us or {})
            t.host += ns
            totals["host_ops"] += ns
            out.host_ops[name] = out.host_ops.get(name, 0.0) + ns / 1e3
            continue
        # A graph replay (its kernels launched by the device): one dispatch for the replay.
        replay = bool(launched) and all(p.in_graph for p in launched)
        if replay:
            t.host += dispatch
            totals["dispatch"] += dispatch
            out.launches += 1
        for p in launched:
            run(p, dispatched=not replay)
        if waits_in[index]:   # a synchronize inside the op
            wait()
    catch_up(float("inf"))
    out.step_us = max(t.host, t.drained()) / 1e3
    out.python_us = totals["python"] / 1e3
    out.host_ops_us = totals["host_ops"] / 1e3
    out.dispatch_us = totals["dispatch"] / 1e3
    out.fallback_host_us = totals["fallback"] / 1e3
    out.wait_us = totals["wait"] / 1e3
    out.device_us = totals["device"] / 1e3
    out.overhead_us = totals["overhead"] / 1e3
    out.as_graph_us = (totals["as_graph"] + dispatch) / 1e3 if out.kernels else 0.0
    return out


def per_step(projection: ChipProjection, steps: int) -> ChipProjection:
    """The projection of one step of a window of ``steps``."""
    steps = max(1, steps)
    scaled = ChipProjection(projection.profile, projection.device_name, terms=dict(projection.terms))
    for name in ("step_us", "python_us", "host_ops_us", "dispatch_us", "fallback_host_us", "wait_us", "device_us",
                 "overhead_us", "as_graph_us"):
        setattr(scaled, name, getattr(projection, name) / steps)
    for name in ("launches", "kernels", "graph_kernels", "copies", "fallbacks", "waits"):
        setattr(scaled, name, getattr(projection, name) / steps)
    return scaled
