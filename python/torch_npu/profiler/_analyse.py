"""``analyse(prof)``: is the run host-bound or device-bound, launch-bound, and
does npu memory grow across steps? Numbers from the profiler's own events."""
from dataclasses import dataclass, field

import torch
from torch._C._profiler import _ProfilerEvent  # noqa: F401  (the events' type, for readers)

# Host waits for the device that the runtime records (runtime/tracing.h).
_WAIT_NAMES = ("npuStreamSynchronize", "npuStreamWait")
# The host side of each launch (zero-length markers that start the flow arrows).
_LAUNCH_NAMES = ("npuLaunchKernel", "npuMemcpy", "npuCpuFallback")


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

    @property
    def device_idle_share(self):
        return self.device_idle_us / self.wall_us if self.wall_us > 0 else 0.0

    @property
    def bound(self):
        """"host" when the device idles more than half of the run, else "device"."""
        return "host" if self.device_idle_share > 0.5 else "device"

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
    analysis = Analysis(short_kernel_us=short_kernel_us, step_memory=list(getattr(prof, "step_memory", [])))
    for event in results.events():
        start, stop = event.start_ns() / 1e3, (event.start_ns() + event.duration_ns()) / 1e3
        name = event.name()
        if name == "[memory]" or name in _LAUNCH_NAMES:
            continue
        if event.device_type() == npu:
            device.append((start, stop))
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
        analysis.device_busy_us = _union_length([(max(s, begin), min(e, end)) for s, e in device
                                                 if e > begin and s < end])
        analysis.device_idle_us = max(0.0, analysis.wall_us - analysis.device_busy_us)
    return analysis
