"""The Text export of the Ascend adapter's profiler, written from a finished npu profile
(the Db export, ``ExportType.Db``, is ``_ascend_db.py``, from the same collected data):

    <dir>/<worker>_<timestamp>_ascend_pt/
        profiler_info.json                (profiler_info_<rank>.json under torch.distributed)
        profiler_metadata.json
        ASCEND_PROFILER_OUTPUT/
            trace_view.json               host ops, kernels per stream ("Ascend Hardware"), flows, overlap
            kernel_details.csv            one row per kernel, copy and CPU fallback
            op_statistic.csv              kernels by type
            operator_details.csv          one row per host op: host and device self/total times
            step_trace_time.csv           per ProfilerStep: computing and free device time
            memory_record.csv             npu allocator totals over time (profile_memory=True)
            operator_memory.csv           each npu allocation: the op that made it, size, lifetime

in the column layouts the adapter documents and msprof-analyze reads. Times are the
profiler's measured ones (host: PyTorch's op events; device: the emulator's kernel,
copy and fallback activities, csrc/profiler), in microseconds since the epoch. Under a
chip profile with a cost model (``NPU_EMU_PROFILE=ascend910b2``) kernel_details.csv and
op_statistic.csv get the chip's projected times beside them ("Projected Duration(us)",
"Projected Total Time(us)"), and trace_view.json a projected track per stream; these
are estimates. Where the emulator has nothing to report (AI-core counters, block dims,
communication) no column is written or the column is 0, never a made-up figure.
"""
import bisect
import csv
import gc
import gzip
import json
import os
import socket
import time
from collections import defaultdict
from types import SimpleNamespace

import torch
from torch.autograd import DeviceType

from .._core.version import __version__
from . import _analyse, _ascend_db
from .experimental_config import ExportType, ProfilerLevel, _ExperimentalConfig

OUTPUT = "ASCEND_PROFILER_OUTPUT"
SUFFIX = "_ascend_pt"

_MARKERS = {"npuLaunchKernel", "npuMemcpy", "npuCpuFallback", "[memory]"}
# The runtime's host calls under their CANN names, on the "CANN" track at Level1 and up
# (as the adapter shows AscendCL): kernel launches and the host's waits for a stream.
_CANN_NAMES = {"npuLaunchKernel": "Node@launch", "npuStreamSynchronize": "AscendCL@aclrtSynchronizeStream"}
_NPU = DeviceType.PrivateUse1
_HOST_PID_LABEL = "Python"
_NO_MODEL = 4294967295        # the adapter's Model ID of a kernel launched eagerly (no graph)
_HW_PID_LABEL = "Ascend Hardware"
_OVERLAP_PID_LABEL = "Overlap Analysis"

KERNEL_DETAILS = ["Step Id", "Device_id", "Model ID", "Task ID", "Stream ID", "Name", "Type", "Accelerator Core",
                  "Start Time(us)", "Duration(us)",
                  "Wait Time(us)", "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
                  "Output Data Types", "Output Formats"]
OP_STATISTIC = ["OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)", "Avg Time(us)", "Max Time(us)",
                "Ratio(%)"]
OPERATOR_DETAILS = ["Name", "Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
                    "Device Self Duration(us)", "Device Total Duration(us)", "Device Self Duration With AICore(us)",
                    "Device Total Duration With AICore(us)"]
STEP_TRACE_TIME = ["Step", "Computing", "Communication(Not Overlapped)", "Overlapped", "Communication", "Free",
                   "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)", "Preparing"]
OPERATOR_MEMORY = ["Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Active Release Time(us)",
                   "Duration(us)", "Active Duration(us)", "Allocation Total Allocated(MB)",
                   "Allocation Total Reserved(MB)", "Allocation Total Active(MB)", "Release Total Allocated(MB)",
                   "Release Total Reserved(MB)", "Release Total Active(MB)", "Stream Ptr", "Device Type"]
MEMORY_RECORD = ["Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)", "Total Active(MB)",
                 "Stream Ptr", "Device Type"]


def _core(name):
    """The adapter's "Accelerator Core" for one of the npu's activities."""
    if name.startswith("cpu_fallback:"):
        return "AI_CPU"          # ran on the host's CPU, as AI-CPU operators do on the chip
    if name.startswith("Memcpy") or name.startswith("Memset"):
        return "MEMCPY_ASYNC"
    return "AI_CORE"


# The Ascend operator type that runs an aten op where msprof-analyze sorts kernels by it
# (matmul, convolution, flash attention are its "cube" categories); other ops keep their name.
_ASCEND_TYPES = {"mm": "MatMulV2", "addmm": "MatMulV2", "matmul": "MatMulV2", "linear": "MatMulV2",
                 "bmm": "BatchMatMulV2", "baddbmm": "BatchMatMulV2",
                 "convolution": "Conv2D", "_convolution": "Conv2D", "conv2d": "Conv2D",
                 "convolution_backward": "Conv2DBackpropInput",
                 "_scaled_dot_product_flash_attention": "FlashAttentionScore",
                 "_scaled_dot_product_flash_attention_backward": "FlashAttentionScoreGrad",
                 "npu_fusion_attention": "FlashAttentionScore"}


def _op_type(name):
    """The kernel's type: the Ascend operator type for the matmul, convolution and attention
    families, else its op without the namespace ("aten::relu" -> "relu")."""
    name = name.split(":", 1)[1].strip() if name.startswith("cpu_fallback:") else name
    base = name.rsplit("::", 1)[-1].split(".", 1)[0]
    return _ASCEND_TYPES.get(base, base)


def _us(value):
    return f"{value:.3f}"


def _shapes(shapes):
    return ";".join(",".join(str(d) for d in s) for s in shapes) if shapes else ""


_DTYPES = {"float": "FLOAT", "double": "DOUBLE", "c10::Half": "FLOAT16", "c10::BFloat16": "BF16",
           "long int": "INT64", "int": "INT32", "short int": "INT16", "signed char": "INT8",
           "unsigned char": "UINT8", "bool": "BOOL", "Scalar": "SCALAR"}


def _dtypes(dtypes):
    return ";".join(_DTYPES.get(str(d), str(d).upper()) for d in dtypes) if dtypes else ""


class _Kernel:
    __slots__ = ("name", "core", "device", "stream", "start_us", "dur_us", "correlation", "projected_us", "op",
                 "shapes", "dtypes", "step", "wait_us", "task_id", "nbytes")


def _collect(prof):
    """The profile's ops, kernels and steps, in absolute microseconds."""
    autograd_prof = _analyse._autograd_profile(prof)
    results = getattr(autograd_prof, "kineto_results", None)
    if results is None:
        raise RuntimeError("torch_npu.profiler: this profile has no results to export; export after it stopped "
                           "(in on_trace_ready, or after the `with profile(...)` block)")
    base_us = results.trace_start_ns() / 1000
    kineto = list(results.events())
    function_events = autograd_prof.function_events or []

    cpu_inputs, steps = {}, []
    for e in kineto:
        if e.device_type() == DeviceType.CPU and e.name() not in _MARKERS:
            cpu_inputs.setdefault(e.correlation_id(), (e.shapes(), e.dtypes()))
            if e.name().startswith("ProfilerStep#"):
                steps.append((e.name().split("#", 1)[1], e.start_ns() / 1000, e.end_ns() / 1000))
    steps.sort(key=lambda s: s[1])

    ops, op_by_id, api = [], {}, []
    for evt in function_events:
        if evt.device_type == DeviceType.CPU and evt.name in _CANN_NAMES:
            api.append(evt)
        if evt.device_type != DeviceType.CPU or evt.is_async or evt.name in _MARKERS:
            continue
        if evt.name.startswith("ProfilerStep"):    # "ProfilerStep#N", or "ProfilerStep*" as PyTorch folds them
            continue
        ops.append(evt)
        op_by_id.setdefault(evt.id, evt)

    projected = {(p.correlation, p.measured_start_ns): p.projected_ns / 1e3 for p in _analyse.projections(prof)}

    kernels = []
    for e in kineto:
        if e.device_type() != _NPU or e.name() == "[memory]":
            continue
        k = _Kernel()
        k.name, k.core = e.name(), _core(e.name())
        k.device, k.stream = e.device_index(), e.device_resource_id()
        k.start_us, k.dur_us = e.start_ns() / 1000, e.duration_ns() / 1000
        k.correlation = e.correlation_id()
        k.projected_us = projected.get((k.correlation, e.start_ns()))
        k.op = op_by_id.get(k.correlation)
        k.shapes, k.dtypes = cpu_inputs.get(k.correlation, ([], []))
        k.nbytes = e.nbytes()
        launch_us = base_us + k.op.time_range.start if k.op is not None else k.start_us
        k.step = next((s for s, a, b in steps if a <= launch_us <= b), "")
        kernels.append(k)
    kernels.sort(key=lambda k: (k.device, k.stream, k.start_us))
    last_end = {}
    for task_id, k in enumerate(kernels):
        end = last_end.get((k.device, k.stream))
        k.wait_us = max(0.0, k.start_us - end) if end is not None else 0.0
        last_end[(k.device, k.stream)] = k.start_us + k.dur_us
        k.task_id = task_id
    kernels.sort(key=lambda k: k.start_us)
    return base_us, kineto, ops, steps, kernels, api, cpu_inputs


class GcRecorder:
    """Python's garbage collections while a profile runs (``gc_detect_threshold``): each
    collection at least ``threshold_ms`` long, as (start us, end us, generation, collected),
    on the epoch clock of the profiler's events."""

    def __init__(self, threshold_ms):
        self.threshold_ns = threshold_ms * 1e6
        self.events = []
        self._start = None

    def _callback(self, phase, info):
        now = time.time_ns()
        if phase == "start":
            self._start = now
        elif self._start is not None:
            if now - self._start >= self.threshold_ns:
                self.events.append((self._start / 1000, now / 1000, info.get("generation"), info.get("collected")))
            self._start = None

    def start(self):
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self):
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


def _write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _kernel_details(path, kernels, chip):
    header = KERNEL_DETAILS + (["Projected Duration(us)"] if chip else [])
    rows = []
    for k in kernels:
        row = [k.step, k.device, _NO_MODEL, k.task_id, k.stream, k.name, _op_type(k.name), k.core,
               _us(k.start_us) + "\t", _us(k.dur_us),
               _us(k.wait_us), _shapes(k.shapes), _dtypes(k.dtypes), ";".join(["ND"] * len(k.shapes)),
               "", "", ""]   # outputs: PyTorch's profiler records the inputs only
        if chip:
            row.append("" if k.projected_us is None else _us(k.projected_us))
        rows.append(row)
    _write_csv(path, header, rows)


def _op_statistic(path, kernels, chip):
    groups = defaultdict(list)
    for k in kernels:
        groups[(_op_type(k.name), k.core)].append(k)
    total = sum(k.dur_us for k in kernels) or 1.0
    rows = []
    for (op_type, core), ks in groups.items():
        durs = [k.dur_us for k in ks]
        row = [op_type, core, len(ks), _us(sum(durs)), _us(min(durs)), _us(sum(durs) / len(durs)), _us(max(durs)),
               f"{100 * sum(durs) / total:.2f}"]
        if chip:
            row.append(_us(sum(k.projected_us or 0.0 for k in ks)))
        rows.append(row)
    rows.sort(key=lambda r: -float(r[3]))
    _write_csv(path, OP_STATISTIC + (["Projected Total Time(us)"] if chip else []), rows)


def _operator_details(path, ops, kernels):
    own, own_aicore = defaultdict(float), defaultdict(float)
    for k in kernels:
        if k.op is not None:
            own[id(k.op)] += k.dur_us
            if k.core == "AI_CORE":
                own_aicore[id(k.op)] += k.dur_us
    memo = {}

    def totals(evt):
        if id(evt) not in memo:
            t, ta = own[id(evt)], own_aicore[id(evt)]
            for child in evt.cpu_children:
                ct, cta = totals(child)
                t, ta = t + ct, ta + cta
            memo[id(evt)] = (t, ta)
        return memo[id(evt)]

    rows = []
    for evt in sorted(ops, key=lambda e: e.time_range.start):
        total, total_aicore = totals(evt)
        rows.append([evt.name, str(evt.input_shapes) if evt.input_shapes else "",
                     ";\r\n".join(evt.stack) if evt.stack else "",
                     _us(evt.self_cpu_time_total), _us(evt.cpu_time_total), _us(own[id(evt)]), _us(total),
                     _us(own_aicore[id(evt)]), _us(total_aicore)])
    _write_csv(path, OPERATOR_DETAILS, rows)


def _union(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def _clip(intervals, lo, hi):
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _step_ranges(steps, ops, kernels, base_us):
    if steps:
        return steps
    starts = [base_us + e.time_range.start for e in ops] + [k.start_us for k in kernels]
    ends = [base_us + e.time_range.end for e in ops] + [k.start_us + k.dur_us for k in kernels]
    return [("", min(starts), max(ends))] if starts else []


def _step_times(ranges, kernels):
    """(step, start us, end us, computing us, free us) per step range: the device's time
    in kernels and fallbacks, and its time in nothing."""
    compute = [(k.start_us, k.start_us + k.dur_us) for k in kernels if k.core != "MEMCPY_ASYNC"]
    busy = [(k.start_us, k.start_us + k.dur_us) for k in kernels]
    return [(step, lo, hi, _union(_clip(compute, lo, hi)), max(0.0, (hi - lo) - _union(_clip(busy, lo, hi))))
            for step, lo, hi in ranges]


def _step_trace_time(path, step_times):
    _write_csv(path, STEP_TRACE_TIME, [[step, _us(computing), _us(0), _us(0), _us(0), _us(free), _us(0), _us(0),
                                        _us(0), _us(0)] for step, _, _, computing, free in step_times])


def _memory_samples(chrome_trace, kineto):
    """The npu allocator's samples in the Chrome trace: (us since the epoch, args), in time
    order. The trace has its own clock: its offset is read off the ops it shares with the
    profile's results (same name and correlation id)."""
    starts = {(e.name(), e.correlation_id()): e.start_ns() / 1000 for e in kineto
              if e.device_type() == DeviceType.CPU}
    offsets, samples = [], []
    for e in chrome_trace.get("traceEvents", []):
        args = e.get("args") if isinstance(e, dict) else None
        if not isinstance(args, dict) or not isinstance(e.get("ts"), (int, float)):
            continue
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            start = starts.get((e.get("name"), args.get("External id")))
            if start is not None:
                offsets.append(start - e["ts"])
        elif e.get("name") == "[memory]" and args.get("Device Type") == int(_NPU):
            samples.append((e["ts"], args))
    if not offsets:
        return []
    offset = sorted(offsets)[len(offsets) // 2]
    return sorted(((ts + offset, args) for ts, args in samples), key=lambda s: s[0])


def _mb(value):
    return f"{value / 2**20:.6f}"


def _memory_record(path, samples):
    rows = [["PTA", _us(t), _mb(a.get("Total Allocated", 0)), _mb(a.get("Total Reserved", 0)),
             _mb(a.get("Total Allocated", 0)), "", f"NPU:{a.get('Device Id', 0)}"] for t, a in samples]
    _write_csv(path, MEMORY_RECORD, rows)


def _allocations(samples, ops, base_us):
    """One dict per npu allocation: the innermost op that made it (name), its size (bytes),
    when it was allocated and released (alloc_us, release_us: None while still held when
    the profile stopped), the allocator's totals then (bytes) and its device."""
    ranges = sorted(((base_us + e.time_range.start, base_us + e.time_range.end, e.name) for e in ops))
    starts = [r[0] for r in ranges]

    def owner(t):
        i = bisect.bisect_right(starts, t) - 1
        while i >= 0:
            if ranges[i][1] >= t:
                return ranges[i][2]
            i -= 1
        return ""

    live, allocations = {}, []
    for t, a in samples:
        size = a.get("Bytes", 0)
        if size > 0:
            m = dict(name=owner(t), size=size, alloc_us=t, release_us=None, device=a.get("Device Id", 0),
                     alloc_allocated=a.get("Total Allocated", 0), alloc_reserved=a.get("Total Reserved", 0),
                     release_allocated=None, release_reserved=None)
            live[a.get("Addr")] = m
            allocations.append(m)
        elif size < 0 and a.get("Addr") in live:
            m = live.pop(a.get("Addr"))
            m.update(release_us=t, release_allocated=a.get("Total Allocated", 0),
                     release_reserved=a.get("Total Reserved", 0))
    return allocations


def _operator_memory(path, allocations):
    rows = []
    for m in allocations:
        held = m["release_us"] is not None
        release = _us(m["release_us"]) if held else ""
        duration = _us(m["release_us"] - m["alloc_us"]) if held else ""
        released = [_mb(m["release_allocated"]), _mb(m["release_reserved"]), _mb(m["release_allocated"])] \
            if held else ["", "", ""]
        rows.append([m["name"], f"{m['size'] / 1024:.2f}", _us(m["alloc_us"]), release, release, duration, duration,
                     _mb(m["alloc_allocated"]), _mb(m["alloc_reserved"]), _mb(m["alloc_allocated"]), *released, "",
                     f"NPU:{m['device']}"])
    _write_csv(path, OPERATOR_MEMORY, rows)


def _trace_view(path, ops, steps, kernels, ranges, base_us, device_activities, chip, gc_events=(), api=()):
    host_pid = os.getpid()
    hw_pid, overlap_pid = host_pid * 100 + 1, host_pid * 100 + 2   # distinct from the host's, as the adapter's
    events = [
        {"ph": "M", "name": "process_name", "pid": host_pid, "tid": 0, "args": {"name": _HOST_PID_LABEL}},
        {"ph": "M", "name": "process_sort_index", "pid": host_pid, "tid": 0, "args": {"sort_index": 0}},
    ]
    threads = set()
    for evt in ops:
        threads.add(evt.thread)
        args = {"Sequence number": evt.sequence_nr, "Fwd thread id": evt.fwd_thread}
        if evt.input_shapes:
            args["Input Dims"] = evt.input_shapes
        if evt.stack:
            args["Call stack"] = ";\r\n".join(evt.stack)
        events.append({"ph": "X", "cat": "cpu_op", "name": evt.name, "pid": host_pid, "tid": evt.thread,
                       "ts": _us(base_us + evt.time_range.start), "dur": _us(evt.time_range.elapsed_us()),
                       "args": args})
    for step, lo, hi in steps:
        events.append({"ph": "X", "cat": "cpu_op", "name": f"ProfilerStep#{step}", "pid": host_pid,
                       "tid": next(iter(threads), 0), "ts": _us(lo), "dur": _us(hi - lo), "args": {}})
    for tid in sorted(threads):
        events.append({"ph": "M", "name": "thread_name", "pid": host_pid, "tid": tid,
                       "args": {"name": f"Thread {tid}"}})
    if api:
        cann_pid = host_pid * 100 + 4
        events += [{"ph": "M", "name": "process_name", "pid": cann_pid, "tid": 0, "args": {"name": "CANN"}},
                   {"ph": "M", "name": "thread_name", "pid": cann_pid, "tid": 0, "args": {"name": "AscendCL"}}]
        for evt in api:
            events.append({"ph": "X", "cat": "cann_api", "name": _CANN_NAMES[evt.name], "pid": cann_pid, "tid": 0,
                           "ts": _us(base_us + evt.time_range.start), "dur": _us(evt.time_range.elapsed_us()),
                           "args": {"npu runtime": evt.name}})
    if gc_events:
        gc_pid = host_pid * 100 + 3
        events += [{"ph": "M", "name": "process_name", "pid": gc_pid, "tid": 0, "args": {"name": "GC"}},
                   {"ph": "M", "name": "thread_name", "pid": gc_pid, "tid": 0, "args": {"name": "GC"}}]
        for start, end, generation, collected in gc_events:
            events.append({"ph": "X", "cat": "GC", "name": "GC", "pid": gc_pid, "tid": 0, "ts": _us(start),
                           "dur": _us(end - start), "args": {"generation": generation, "collected": collected}})
    if device_activities:
        events += [{"ph": "M", "name": "process_name", "pid": hw_pid, "tid": 0, "args": {"name": _HW_PID_LABEL}},
                   {"ph": "M", "name": "process_labels", "pid": hw_pid, "tid": 0, "args": {"labels": "NPU"}},
                   {"ph": "M", "name": "process_sort_index", "pid": hw_pid, "tid": 0, "args": {"sort_index": 1}},
                   {"ph": "M", "name": "process_name", "pid": overlap_pid, "tid": 0,
                    "args": {"name": _OVERLAP_PID_LABEL}},
                   {"ph": "M", "name": "process_sort_index", "pid": overlap_pid, "tid": 0,
                    "args": {"sort_index": 2}}]
        streams = sorted({k.stream for k in kernels})
        for stream in streams:
            events.append({"ph": "M", "name": "thread_name", "pid": hw_pid, "tid": stream,
                           "args": {"name": f"Stream {stream}"}})
        for k in kernels:
            args = {"Model Id": _NO_MODEL, "Task Type": k.core, "Stream Id": k.stream, "Task Id": k.task_id,
                    "Batch Id": 0, "Subtask Id": 4294967295, "connection_id": k.correlation}
            if k.shapes:
                args["Input Shapes"] = _shapes(k.shapes)
            if k.core == "MEMCPY_ASYNC":
                args["size(Byte)"] = k.nbytes
            if k.projected_us is not None:
                args["projected_us"] = round(k.projected_us, 3)
            events.append({"ph": "X", "name": k.name, "pid": hw_pid, "tid": k.stream, "ts": _us(k.start_us),
                           "dur": _us(k.dur_us), "args": args})
            if k.op is not None:
                events.append({"ph": "s", "bp": "e", "cat": "async_npu", "name": "torch_to_npu", "id": k.correlation,
                               "pid": host_pid, "tid": k.op.thread, "ts": _us(base_us + k.op.time_range.start)})
                events.append({"ph": "f", "bp": "e", "cat": "async_npu", "name": "torch_to_npu", "id": k.correlation,
                               "pid": hw_pid, "tid": k.stream, "ts": _us(k.start_us)})
        # Overlap Analysis: the device computing, and free, within each step.
        for tid, label in ((0, "Computing"), (1, "Communication"), (2, "Communication(Not Overlapped)"), (3, "Free")):
            events.append({"ph": "M", "name": "thread_name", "pid": overlap_pid, "tid": tid, "args": {"name": label}})
        for k in kernels:
            if k.core != "MEMCPY_ASYNC":
                events.append({"ph": "X", "name": "Computing", "pid": overlap_pid, "tid": 0, "ts": _us(k.start_us),
                               "dur": _us(k.dur_us), "args": {}})
        busy = sorted((k.start_us, k.start_us + k.dur_us) for k in kernels)
        for _, lo, hi in ranges:
            cursor = lo
            for a, b in _clip(busy, lo, hi) + [(hi, hi)]:
                if a > cursor:
                    events.append({"ph": "X", "name": "Free", "pid": overlap_pid, "tid": 3, "ts": _us(cursor),
                                   "dur": _us(a - cursor), "args": {}})
                cursor = max(cursor, b)
        if chip:
            # The chip's projected layout, per stream: an estimate beside the measured streams.
            offset = 1_000_000
            for stream in streams:
                events.append({"ph": "M", "name": "thread_name", "pid": hw_pid, "tid": offset + stream,
                               "args": {"name": f"Stream {stream}: projected on {chip} (estimate)"}})
            found = [k for k in kernels if k.projected_us is not None]
            cursor = {}
            for k in sorted(found, key=lambda k: k.start_us):
                start = max(k.start_us, cursor.get(k.stream, k.start_us))
                cursor[k.stream] = start + k.projected_us
                events.append({"ph": "X", "cat": "npu_projected", "name": k.name, "pid": hw_pid,
                               "tid": offset + k.stream, "ts": _us(start), "dur": _us(k.projected_us),
                               "args": {"estimate": f"{chip} cost model", "connection_id": k.correlation}})
    with open(path, "w", encoding="utf-8") as f:
        json.dump(events, f)


def _common_config(prof):
    autograd_prof = _analyse._autograd_profile(prof)
    activities = getattr(prof, "activities", None)
    names = sorted(str(a) for a in activities) if activities else ["ProfilerActivity.CPU"]
    return {"activities": [n.replace("PrivateUse1", "NPU") for n in names],
            "schedule": repr(getattr(prof, "schedule", None)),
            "record_shapes": bool(getattr(prof, "record_shapes", getattr(autograd_prof, "record_shapes", False))),
            "profile_memory": bool(getattr(prof, "profile_memory", getattr(autograd_prof, "profile_memory", False))),
            "with_stack": bool(getattr(prof, "with_stack", getattr(autograd_prof, "with_stack", False))),
            "with_flops": bool(getattr(prof, "with_flops", False)),
            "with_modules": bool(getattr(prof, "with_modules", False))}


def _rank():
    """The process's rank (torch.distributed's, else $RANK as torchrun sets it), None alone."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    rank = os.environ.get("RANK", "")
    return int(rank) if rank.isdigit() else None


def _worker_dir(dir_name, worker_name):
    worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
    now = time.time()
    stamp = time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
    path = os.path.join(dir_name, f"{worker}_{stamp}{SUFFIX}")
    n = 1
    while os.path.exists(path):      # two exports within a millisecond
        path = os.path.join(dir_name, f"{worker}_{stamp}_{n}{SUFFIX}")
        n += 1
    return worker, path


def export_ascend(prof, dir_name, worker_name=None, chrome_trace=None, config=None):
    """Writes the Ascend adapter's export of the finished profile ``prof`` under ``dir_name``
    (``<worker>_<timestamp>_ascend_pt/``) and returns that directory: the Text export, the
    Db export (``_ascend_db.py``) or both, as the config's ``export_type`` asks.
    ``chrome_trace``: the path of the profile's exported Chrome trace, if it was exported
    (its npu memory samples go into the memory records); else one is written inside the
    directory for that. ``config``: the ``_ExperimentalConfig`` (default: the profile's,
    else the adapter's defaults)."""
    config = config or getattr(prof, "npu_experimental_config", None) or _ExperimentalConfig()
    text, db = ExportType.Text in config.export_type, ExportType.Db in config.export_type
    os.makedirs(dir_name, exist_ok=True)
    worker, root = _worker_dir(dir_name, worker_name)
    out = os.path.join(root, OUTPUT)
    os.makedirs(out)
    base_us, kineto, ops, steps, kernels, api, inputs = _collect(prof)
    if config.profiler_level in (ProfilerLevel.Level_none, ProfilerLevel.Level0):
        api = []
    activities = getattr(prof, "activities", None)   # None: torch.autograd.profiler.profile(use_device="npu")
    device_activities = config.device_activities and (
        activities is None or torch.profiler.ProfilerActivity.PrivateUse1 in activities)
    if not device_activities:
        kernels = []
    profile = _analyse.cost_profile()
    chip = profile.device_name if profile is not None and any(k.projected_us is not None for k in kernels) else None

    if chrome_trace is None:
        chrome_trace = os.path.join(root, f"{worker}.pt.trace.json")
        prof.export_chrome_trace(chrome_trace)
    with (gzip.open if chrome_trace.endswith(".gz") else open)(chrome_trace, "rt", encoding="utf-8") as f:
        trace = json.load(f)

    ranges = _step_ranges(steps, ops, kernels, base_us)
    recorder = getattr(prof, "npu_gc_recorder", None)
    lo = min((a for _, a, _ in ranges), default=0.0)
    hi = max((b for _, _, b in ranges), default=0.0)
    gc_events = [e for e in recorder.events if lo <= e[0] <= hi] if recorder is not None else []
    step_times = _step_times(ranges, kernels) if device_activities else []
    samples = _memory_samples(trace, kineto) if device_activities else []
    allocations = _allocations(samples, ops, base_us)
    rank = _rank()
    if text:
        _trace_view(os.path.join(out, "trace_view.json"), ops, steps, kernels, ranges, base_us,
                    device_activities, chip, gc_events, api)
        _operator_details(os.path.join(out, "operator_details.csv"), ops, kernels)
        if device_activities:
            _kernel_details(os.path.join(out, "kernel_details.csv"), kernels, chip)
            _op_statistic(os.path.join(out, "op_statistic.csv"), kernels, chip)
            _step_trace_time(os.path.join(out, "step_trace_time.csv"), step_times)
            _memory_record(os.path.join(out, "memory_record.csv"), samples)
            if samples:
                _operator_memory(os.path.join(out, "operator_memory.csv"), allocations)
    if db:
        _ascend_db.write(out, rank, base_us=base_us, ops=ops, kernels=kernels, steps=steps, step_times=step_times,
                         op_inputs=inputs, allocations=allocations, samples=samples,
                         formats=SimpleNamespace(op_type=_op_type, shapes=_shapes, dtypes=_dtypes), meta=[("device", "npu (emulated)"), ("projected_on", chip or ""),
                                                   ("torch_npu_version", __version__)])

    info = {"config": {"common_config": _common_config(prof), "experimental_config": config.to_dict()},
            "start_info": {"syscnt_enable": False, "collectionTimeBegin": str(int(base_us))},
            "end_info": {"collectionTimeEnd": str(int(time.time() * 1e6))},
            "torch_npu_version": __version__,
            "device": "npu (emulated)", "projected_on": chip or ""}
    name = "profiler_info.json" if rank is None else f"profiler_info_{rank}.json"
    with open(os.path.join(root, name), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
    with open(os.path.join(root, "profiler_metadata.json"), "w", encoding="utf-8") as f:
        json.dump({"ENV_VARIABLES": {k: v for k, v in os.environ.items() if k.startswith(("NPU_EMU", "ASCEND"))},
                   "profiler_level": config.profiler_level}, f, indent=2)
    return root


def tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True, async_mode=False, *,
                              use_gzip=False):
    """The Ascend adapter's ``on_trace_ready`` handler (its arguments, in its order): per
    finished cycle, PyTorch's Chrome trace ``<dir>/<worker>.<ms>.pt.trace.json`` (``.gz`` with
    PyTorch's ``use_gzip=True``; TensorBoard's profiler plugin reads it) and, with
    ``analyse_flag``, the Text export ``<dir>/<worker>_<timestamp>_ascend_pt/`` next to it.
    ``async_mode`` is accepted and the export written synchronously."""
    if dir_name is None:
        dir_name = os.environ.get("ASCEND_WORK_PATH") or "./"
    if not isinstance(dir_name, (str, os.PathLike)):
        raise TypeError(f"tensorboard_trace_handler: dir_name must be a path, got {dir_name!r}")
    dir_name = os.fspath(dir_name)

    def handler_fn(prof):
        os.makedirs(dir_name, exist_ok=True)
        worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        trace = os.path.join(dir_name, f"{worker}.{time.time_ns() // 1_000_000}.pt.trace.json"
                             + (".gz" if use_gzip else ""))
        prof.export_chrome_trace(trace)
        if analyse_flag:
            prof.npu_ascend_output = export_ascend(prof, dir_name, worker, chrome_trace=trace)
    return handler_fn


__all__ = ["export_ascend", "tensorboard_trace_handler", "OUTPUT", "ProfilerLevel"]
