"""``analyse(prof)``: is the run host-bound or device-bound, launch-bound, and
does npu memory grow across steps? Numbers from the profiler's own events.

Under a device profile with a cost model (``NPU_EMU_PROFILE=ascend910b2``), it
also answers for the chip: the projected time of each kernel, copy and CPU
fallback the profiler session kept (csrc/profiler), against the host's own
dispatch time as the emulator measured it."""
from collections import namedtuple
from dataclasses import dataclass, field

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
Projection = namedtuple("Projection", "correlation device stream start_ns projected_ns kind name measured_start_ns")


def cost_profile():
    """The profile kernels are projected onto: the projection target when one is set
    (set_projection_target, the doctor's --target), else the active device profile when
    it has a cost model; None under generic without a target."""
    from .. import _C, _profiles
    name = _C._projection_profile()
    return None if name is None else _profiles.load(name)


def set_projection_target(name):
    """Projects kernels onto chip profile ``name`` while profiling, whatever chip the npu
    emulates (None: the active profile's own cost model, if any)."""
    from .. import _C, _profiles
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
    projected_kernels: int = 0
    projected_copies: int = 0         # copies and CPU fallbacks
    projected_device_us: float = 0.0  # projected kernel, copy and fallback times, launch overhead included
    projected_launch_us: float = 0.0  # of which launch overhead: one per kernel or copy
    projected_host_us: float = 0.0    # the host's dispatch: wall_us less the device work it waited for inline

    @property
    def device_idle_share(self):
        return self.device_idle_us / self.wall_us if self.wall_us > 0 else 0.0

    @property
    def bound(self):
        """"host" when the device idles more than half of the run, else "device"."""
        return "host" if self.device_idle_share > 0.5 else "device"

    @property
    def projected_bound(self):
        """"host" when the chip would wait for the host: when the host's dispatch and the
        launch overhead take longer than the chip's own work; "device" otherwise; "" when
        nothing was projected (no cost model)."""
        if not self.profile:
            return ""
        work = self.projected_device_us - self.projected_launch_us
        return "device" if work > self.projected_host_us + self.projected_launch_us else "host"

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
        lines = [
            f"npu profile: {self.wall_us / 1e3:.3f} ms of host ops, device busy {self.device_busy_us / 1e3:.3f} ms",
            f"  {self.bound}-bound: the device idled {self.device_idle_us / 1e3:.3f} ms "
            f"({100 * self.device_idle_share:.0f}%) waiting for the host; the host waited "
            f"{self.host_wait_us / 1e3:.3f} ms for the device",
            f"  kernels: {self.kernels}, of which {self.short_kernels} ({100 * self.short_kernel_share:.0f}%) "
            f"shorter than {self.short_kernel_us:g} us ({self.short_kernel_time_us / 1e3:.3f} ms in all)"
            + ("; launch-bound: batch the work or use torch.compile" if self.launch_bound else ""),
        ]
        if self.fallbacks:
            lines.append(f"  {self.fallbacks} ops ran through the CPU fallback")
        if self.profile:
            copies = self.projected_copies
            copies = f" and {copies:,} cop{'y' if copies == 1 else 'ies'}" if copies else ""
            lines.append(
                f"  on {self.profile} (projected, estimate): {self.projected_kernels:,} "
                f"kernel{'' if self.projected_kernels == 1 else 's'}{copies}, "
                f"{self.projected_device_us / 1e3:.3f} ms of device time, launch overhead alone "
                f"{self.projected_launch_us / 1e3:.3f} ms: {self.projected_bound}-bound "
                f"(the host dispatches for {self.projected_host_us / 1e3:.3f} ms)")
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


def analyse(prof, short_kernel_us=10.0):
    """Answers the three questions for a finished ``profile`` (torch_npu's or
    torch's, with ProfilerActivity.NPU requested)."""
    results = prof.profiler.kineto_results if hasattr(prof, "profiler") else prof.kineto_results
    if results is None:
        raise RuntimeError("torch_npu.profiler.analyse: the profile has no results; analyse it after it stopped")
    npu = torch._C._autograd.DeviceType.PrivateUse1
    host, device = [], []
    ops = {}  # correlation id -> the host op's span
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
            if event.correlation_id() != 0:
                ops.setdefault(event.correlation_id(), (start, stop))
    if host:
        begin, end = min(s for s, _ in host), max(e for _, e in host)
        analysis.wall_us = end - begin
        analysis.device_busy_us = _union_length([(max(s, begin), min(e, end)) for s, e, _, _ in device
                                                 if e > begin and s < end])
        analysis.device_idle_us = max(0.0, analysis.wall_us - analysis.device_busy_us)
    _project(analysis, prof, results, device, ops)
    return analysis


def _project(analysis, prof, results, device, ops):
    """The chip's side, under a profile with a cost model: the projected times, and the
    host's dispatch time on the real system, which is the emulator's host time less
    the emulated device work the host waited for (kernels and copies that ended before
    the op that launched them returned, such as those run at once on the caller's
    thread) and less its waits for the device. CPU fallbacks stay host work."""
    profile = cost_profile()
    found = projections(prof, results) if profile is not None else []
    if not found:
        return
    analysis.profile = profile.device_name
    analysis.projected_kernels = sum(p.kind == "kernel" for p in found)
    analysis.projected_copies = len(found) - analysis.projected_kernels
    analysis.projected_device_us = sum(p.projected_ns for p in found) / 1e3
    analysis.projected_launch_us = len(found) * profile.cost["launch_us"]   # every projection has one launch
    waited = 0.0
    for start, stop, correlation, name in device:
        op = ops.get(correlation) if correlation != 0 else None
        if op is not None and op[0] <= start and stop <= op[1] and not name.startswith("cpu_fallback: "):
            waited += stop - start
    analysis.projected_host_us = max(0.0, analysis.wall_us - waited - analysis.host_wait_us)
