"""``analyse(prof)``: is the run host-bound or device-bound, launch-bound, and
does npu memory grow across steps? Numbers from the profiler's own events.

Under a device profile with a cost model (``NPU_EMU_PROFILE=ascend910b2``), it
also answers for the chip: the window replayed on the chip's timeline
(profiler/_projection.py): the Python measured here, the adapter's dispatch per
launch, each kernel's, copy's and CPU fallback's projected time (csrc/profiler)
and the host's waits, each figure from the profile with its source."""
from collections import namedtuple
from dataclasses import dataclass, field

from . import _projection

import torch
from torch._C._profiler import _ProfilerEvent  # noqa: F401  (the events' type, for readers)

# Host waits for the device that the runtime records (runtime/tracing.h).
_WAIT_NAMES = ("npuStreamSynchronize", "npuStreamWait")
# The host side of each launch (zero-length markers that start the flow arrows).
_LAUNCH_NAMES = ("npuLaunchKernel", "npuMemcpy", "npuCpuFallback")

# A kernel ("kernel"), copy ("memcpy") or CPU fallback ("fallback") as the chip
# of the device profile would run it: from start_ns for projected_ns on its
# stream's timeline there (laid out in stream order, none before its launch).
# measured_start_ns is where the emulator ran it: its event's start_ns().
Projection = namedtuple("Projection", "correlation device stream start_ns projected_ns kind name measured_start_ns "
                                     "flops bytes matrix bits known in_graph crosses_link host_ns host_synchronous")


def cost_profile():
    """The profile kernels are projected onto: the projection target when one is set
    (set_projection_target, the doctor's --target), else the active device profile when
    it has a cost model; None under generic without a target."""
    from .. import _C
    from .._emu import profiles as _profiles
    name = _C._projection_profile()
    return None if name is None else _profiles.load(name)


def set_projection_target(name):
    """Projects kernels onto chip profile ``name`` while profiling, whatever chip the npu
    emulates (None: the active profile's own cost model, if any)."""
    from .. import _C
    from .._emu import profiles as _profiles
    if name is None:
        _C._set_projection_target("")
    else:
        _profiles.define(name)
        _C._set_projection_target(name)


def last_session_projections():
    """What the runtime kept of the last profiler session (csrc/profiler): [] under a
    profile without a cost model, or when the extension predates projections."""
    from .. import _C
    fetch = getattr(_C, "_profiler_projections", None)
    if fetch is None or cost_profile() is None:
        return []
    return [Projection(*p) for p in fetch()]


def _autograd_profile(prof):
    """torch.autograd.profiler.profile under a torch.profiler.profile (or itself)."""
    return prof.profiler if hasattr(prof, "profiler") else prof


def held_projections(autograd_prof):
    """The projections of ``autograd_prof``'s latest session. Taken from the runtime the
    first time they are asked for after that session stopped (torch_npu.profiler does in
    ``__exit__``), then held by the profile with the results they belong to."""
    results = getattr(autograd_prof, "kineto_results", None)
    if results is None:
        return []
    held = vars(autograd_prof).get("_npu_projections")
    if held is None or held[0] is not results:
        held = (results, last_session_projections())
        autograd_prof._npu_projections = held
    return held[1]


def projections(prof, results=None):
    """The projections of a finished profile (torch's or torch_npu's ``profile``, or
    ``torch.autograd.profiler.profile``) that belong to its npu events: only those whose
    kernel, copy or fallback is in ``results`` (its kineto results) by correlation id and
    start. [] under a profile without a cost model."""
    autograd_prof = _autograd_profile(prof)
    found = held_projections(autograd_prof)
    if not found:
        return []
    results = autograd_prof.kineto_results if results is None else results
    npu = torch._C._autograd.DeviceType.PrivateUse1
    measured = {(e.correlation_id(), e.start_ns()) for e in results.events() if e.device_type() == npu}
    return [p for p in found if (p.correlation, p.measured_start_ns) in measured]


@dataclass
class Analysis:
    """The answers, in microseconds and bytes."""

    wall_us: float = 0.0           # first to last profiled host op
    device_busy_us: float = 0.0    # union of kernel and copy intervals
    device_idle_us: float = 0.0    # the device waited for the host
    host_wait_us: float = 0.0      # the host waited for the device (syncs)
    kernels: int = 0
    short_kernels: int = 0         # shorter than short_kernel_us
    short_kernel_us: float = 10.0
    short_kernel_time_us: float = 0.0
    fallbacks: int = 0
    step_memory: list = field(default_factory=list)  # (step, allocated, reserved)
    # On the chip of the device profile (set only under a profile with a cost model):
    profile: str = ""                 # the chip's device name ("Ascend910B2")
    projection: object = None         # the window on the chip's timeline (_projection.ChipProjection)

    @property
    def device_idle_share(self):
        return self.device_idle_us / self.wall_us if self.wall_us > 0 else 0.0

    @property
    def bound(self):
        """"host" when the device idles more than half of the run, else "device"."""
        return "host" if self.device_idle_share > 0.5 else "device"

    @property
    def projected_bound(self):
        """"host" when the chip would idle more than half of the window (waiting for the
        host's launches and work), "device" otherwise; "" when nothing was projected."""
        return self.projection.bound if self.projection is not None else ""

    @property
    def projected_kernels(self):
        return self.projection.kernels if self.projection is not None else 0

    @property
    def projected_copies(self):
        return self.projection.copies + self.projection.fallbacks if self.projection is not None else 0

    @property
    def projected_device_us(self):
        """The chip's device work in the window (kernels, copies; overheads included)."""
        return self.projection.device_us if self.projection is not None else 0.0

    @property
    def projected_host_us(self):
        """The host's busy time on the real system: Python, dispatch, host-side ops and fallbacks."""
        return self.projection.host_us if self.projection is not None else 0.0

    @property
    def projected_step_us(self):
        """The window on the chip, start to end."""
        return self.projection.step_us if self.projection is not None else 0.0

    @property
    def short_kernel_share(self):
        return self.short_kernels / self.kernels if self.kernels else 0.0

    @property
    def launch_bound(self):
        """Most kernels are shorter than the threshold: per-launch overhead dominates."""
        return self.kernels >= 10 and self.short_kernel_share > 0.5

    @property
    def memory_growth_per_step(self):
        """Average growth of allocated npu memory per step, in bytes (0 with < 3 samples)."""
        if len(self.step_memory) < 3:
            return 0
        # The first step warms caches and optimizer state up: measure after it.
        first, last = self.step_memory[1], self.step_memory[-1]
        steps = len(self.step_memory) - 2
        return (last[1] - first[1]) / steps

    @property
    def memory_grows(self):
        samples = [m[1] for m in self.step_memory[1:]]
        return len(samples) >= 2 and all(b > a for a, b in zip(samples, samples[1:]))

    def __str__(self):
        return self.text()

    def text(self, chip=True):
        """The analysis in words; ``chip=False`` leaves out the projection onto the chip."""
        if self.bound == "host":
            bound = (f"  host-bound: the device idled {self.device_idle_us / 1e3:.3f} ms "
                     f"({100 * self.device_idle_share:.0f}% of the time) waiting for the host")
        else:
            bound = (f"  device-bound: the device was busy {100 * (1 - self.device_idle_share):.0f}% of the time "
                     f"(idle {self.device_idle_us / 1e3:.3f} ms)")
        lines = [
            f"npu profile: {self.wall_us / 1e3:.3f} ms of host ops, device busy {self.device_busy_us / 1e3:.3f} ms",
            bound + f"; the host waited {self.host_wait_us / 1e3:.3f} ms for the device",
            f"  kernels: {self.kernels}, of which {self.short_kernels} ({100 * self.short_kernel_share:.0f}%) "
            f"shorter than {self.short_kernel_us:g} us ({self.short_kernel_time_us / 1e3:.3f} ms in all)"
            + ("; launch-bound: batch the work or use torch.compile" if self.launch_bound else ""),
        ]
        if self.fallbacks:
            lines.append(f"  {self.fallbacks} ops ran through the CPU fallback")
        if chip and self.projection is not None:
            lines += ["  " + line for line in projection_lines(self.projection)]
        if self.step_memory:
            growth = self.memory_growth_per_step
            verdict = ("grows every step: tensors kept across iterations?" if self.memory_grows
                       else "steady")
            lines.append(f"  npu memory over {len(self.step_memory)} steps: "
                         f"{self.step_memory[0][1]} -> {self.step_memory[-1][1]} bytes allocated, "
                         f"{growth:+.0f} bytes/step, {verdict}")
        return "\n".join(lines)


def _union_length(intervals):
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def analyse(prof, short_kernel_us=10.0, op_host_us=None, not_python=()):
    """Answers the three questions for a finished ``profile`` (torch_npu's or
    torch's, with ProfilerActivity.NPU requested). ``op_host_us``: per op name, its
    host time without an observer's overhead (the doctor's), and ``not_python``: the
    observer's own time between ops ((start, end) ns), for the chip's side."""
    results = prof.profiler.kineto_results if hasattr(prof, "profiler") else prof.kineto_results
    if results is None:
        raise RuntimeError("torch_npu.profiler.analyse: the profile has no results; analyse it after it stopped")
    npu = torch._C._autograd.DeviceType.PrivateUse1
    host, device = [], []
    analysis = Analysis(short_kernel_us=short_kernel_us, step_memory=list(getattr(prof, "step_memory", [])))
    for event in results.events():
        start, stop = event.start_ns() / 1e3, (event.start_ns() + event.duration_ns()) / 1e3
        name = event.name()
        if name == "[memory]" or name in _LAUNCH_NAMES:
            continue
        if event.device_type() == npu:
            device.append((start, stop, event.correlation_id(), name))
            if name.startswith("cpu_fallback: "):
                analysis.fallbacks += 1
                continue
            analysis.kernels += 1
            if stop - start < short_kernel_us:
                analysis.short_kernels += 1
                analysis.short_kernel_time_us += stop - start
        elif name in _WAIT_NAMES:
            analysis.host_wait_us += stop - start
        else:
            host.append((start, stop))
    if host:
        begin, end = min(s for s, _ in host), max(e for _, e in host)
        analysis.wall_us = end - begin
        analysis.device_busy_us = _union_length([(max(s, begin), min(e, end)) for s, e, _, _ in device
                                                 if e > begin and s < end])
        analysis.device_idle_us = max(0.0, analysis.wall_us - analysis.device_busy_us)
    _project(analysis, prof, results, op_host_us, not_python)
    return analysis


def _project(analysis, prof, results, op_host_us=None, not_python=()):
    """The chip's side, under a profile with a cost model: the window on the chip's
    timeline (_projection.project)."""
    profile = cost_profile()
    found = projections(prof, results) if profile is not None else []
    if not found:
        return
    analysis.profile = profile.device_name
    analysis.projection = _projection.project(results, found, profile, op_host_us, not_python=not_python)


def projection_lines(p):
    """The chip's side of a window in words, each figure with its source."""
    steps = []
    host = [f"Python {p.python_us / 1e3:.3f} ms (measured here)"]
    if p.launches:
        host.append(f"dispatch of {p.launches:,.0f} launch{'es' if p.launches != 1 else ''} "
                    f"{p.dispatch_us / 1e3:.3f} ms (host_dispatch_us {p.terms['host_dispatch_us']})")
    if p.host_ops_us:
        host.append(f"ops without device work {p.host_ops_us / 1e3:.3f} ms (measured here)")
    if p.fallbacks:
        host.append(f"{p.fallbacks:,.0f} CPU fallback{'s' if p.fallbacks != 1 else ''} {p.fallback_host_us / 1e3:.3f} ms")
    steps.append(f"on {p.device_name} (projected, an estimate): {p.step_us / 1e3:.3f} ms, {p.bound}-bound "
                 f"(the chip idles {100 * p.device_idle_us / p.step_us if p.step_us else 0:.0f}% of it)")
    steps.append("  host: " + " + ".join(host)
                 + (f"; it waits {p.wait_us / 1e3:.3f} ms for the device ({p.waits:,.0f} wait"
                    f"{'s' if p.waits != 1 else ''}, sync_us {p.terms['sync_us']})" if p.waits else ""))
    if p.kernels or p.copies:
        graph = f", {p.graph_kernels:,.0f} of them replayed from a graph" if p.graph_kernels else ""
        steps.append(f"  device: {p.kernels:,.0f} kernel{'s' if p.kernels != 1 else ''}{graph} and "
                     f"{p.copies:,.0f} cop{'y' if p.copies == 1 else 'ies'}, {p.device_us / 1e3:.3f} ms, of which "
                     f"per-kernel overhead {p.overhead_us / 1e3:.3f} ms (kernel_overhead_us "
                     f"{p.terms['kernel_overhead_us']})")
    return steps
