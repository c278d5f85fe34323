"""The npu in PyTorch's profiler: ``torch_npu.profiler`` is ``torch.profiler``
with the npu's device activities (csrc/profiler): kernels timed where they ran
and linked to the op that launched them, copies with their bytes, CPU
fallbacks, host waits for the device, and npu memory per op.

    from torch_npu.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU], profile_memory=True) as prof:
        model(x).sum().backward()
    print(prof.key_averages().table(sort_by="device_time_total"))
    print(torch_npu.profiler.analyse(prof))

``torch.profiler.profile(activities=[ProfilerActivity.PrivateUse1])`` and
``torch.autograd.profiler.profile(use_device="npu")`` are the same profiler.

Under a device profile with a cost model (``NPU_EMU_PROFILE=ascend910b2``) the
profiler also shows each kernel's, copy's and CPU fallback's projected time on
that chip, an estimate: ``projected_us`` in the trace's args, the "NPU
projected" column of ``table()`` (``npu_projected_time_total`` on events and
averages: the op's kernels and its children's, as "NPU total"), a track per
stream in exported Chrome traces ("Stream 0: projected on Ascend910B2
(estimate)", the kernels laid out as the chip would run them) and a line of
``analyse()``. The projections are no device activities: device totals stay
the emulator's. Under the generic profile none of it appears.

The changes to PyTorch's profiler classes (``use_device="npu"`` defaulting to Kineto,
the projections) go through :mod:`torch_npu._patches` in the group ``"profiler"``.
The Ascend adapter's ``npu_*`` names of the device columns (``npu_time_total``, ...)
are opt-in: ``enable_npu_column_aliases()`` (``_compat.py``; transfer_to_npu turns
them on too), group ``"profiler_aliases"``.
"""
import functools
import inspect
import json
import re
from collections import defaultdict

import torch
import torch.autograd.profiler as _autograd_profiler
import torch.autograd.profiler_util as _profiler_util
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent, FunctionEventAvg
from torch.profiler import (  # noqa: F401  (the public names of torch.profiler)
    ProfilerAction,
    ProfilerActivity,
    record_function,
    schedule,
    supported_activities,
)

from .._core import patches as _patches
from . import _analyse, _ascend_export
from ._analyse import Analysis, analyse, set_projection_target  # noqa: F401
from ._compat import enable_npu_column_aliases  # noqa: F401  (the npu_* column names, opt-in)
from ._ascend_export import export_ascend, tensorboard_trace_handler  # noqa: F401
from .experimental_config import (  # noqa: F401  (the Ascend adapter's names)
    AiCMetrics,
    ExportType,
    ProfilerLevel,
    _ExperimentalConfig,
    supported_ai_core_metrics,
    supported_export_type,
    supported_profiler_level,
)

GROUP = "profiler"

__all__ = ["profile", "ProfilerActivity", "ProfilerAction", "schedule", "tensorboard_trace_handler",
           "record_function", "supported_activities", "analyse", "Analysis", "set_projection_target",
           "export_ascend", "_ExperimentalConfig", "ProfilerLevel", "AiCMetrics", "ExportType",
           "supported_profiler_level", "supported_ai_core_metrics", "supported_export_type",
           "enable_npu_column_aliases"]


class profile(torch.profiler.profile):
    """``torch.profiler.profile``; also samples npu memory at each ``step()``
    (``step_memory``: (step, allocated bytes, reserved bytes)), which
    ``analyse`` reads for memory growth across steps.

    ``experimental_config`` takes PyTorch's ``torch._C._profiler._ExperimentalConfig`` or
    the Ascend adapter's ``torch_npu.profiler._ExperimentalConfig`` (held as
    ``npu_experimental_config``; its ``record_op_args`` records shapes). The Ascend
    adapter's Text export is written by ``tensorboard_trace_handler(dir)`` as
    ``on_trace_ready`` or by ``export_ascend(dir)``."""

    def __init__(self, *args, experimental_config=None, **kwargs):
        self.npu_experimental_config = None
        if isinstance(experimental_config, _ExperimentalConfig):
            self.npu_experimental_config = experimental_config
            if experimental_config.record_op_args:
                kwargs["record_shapes"] = True
            experimental_config = None
        super().__init__(*args, experimental_config=experimental_config, **kwargs)
        self.step_memory = []
        self.npu_ascend_output = None   # the last Text export's directory
        self.npu_gc_recorder = None     # Python's collections, with gc_detect_threshold

    def export_ascend(self, dir_name, worker_name=None):
        """Writes the Ascend adapter's Text export of this finished profile under ``dir_name``
        (``<worker>_<timestamp>_ascend_pt/ASCEND_PROFILER_OUTPUT/``); returns its directory."""
        self.npu_ascend_output = export_ascend(self, dir_name, worker_name)
        return self.npu_ascend_output

    def _sample_memory(self):
        # No synchronize: the allocator counts a block when an op allocates it and frees it
        # when its tensor goes (the stream orders its reuse), so the figures are current, and
        # a wait here would be the profiler's, not the script's.
        if torch.npu.is_initialized():
            self.step_memory.append((self.step_num, torch.npu.memory_allocated(), torch.npu.memory_reserved()))

    def start(self):
        self.step_memory = []
        config = self.npu_experimental_config
        if config is not None and config.with_gc:
            self.npu_gc_recorder = _ascend_export.GcRecorder(config.gc_detect_threshold)
            self.npu_gc_recorder.start()
        super().start()

    def step(self):
        self._sample_memory()
        super().step()

    def stop(self):
        if not self.step_memory:  # no step() called: one sample for the whole run
            self._sample_memory()
        try:
            super().stop()
        finally:
            if self.npu_gc_recorder is not None:
                self.npu_gc_recorder.stop()


def _profile_npu_through_kineto():
    """``torch.autograd.profiler.profile(use_device="npu")`` defaults to Kineto
    (the same device activities as torch.profiler); ``use_kineto=False`` still
    works, timing each op with npu events."""
    def defaulting_to_kineto(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            bound = signature.bind_partial(self, *args, **kwargs)
            if bound.arguments.get("use_device") == "npu" and "use_kineto" not in bound.arguments:
                kwargs["use_kineto"] = True
            original(self, *args, **kwargs)
        return __init__

    _patches.wrap(_autograd_profiler.profile, "__init__", defaulting_to_kineto, GROUP,  # once per process
                  checked=("2.13",),
                  expects="(self, enabled=True, *, use_cuda=False, use_device=None, record_shapes=False, "
                          "with_flops=False, profile_memory=False, with_stack=False, with_modules=False, "
                          "use_kineto=False, use_cpu=True, experimental_config=None, acc_events=False, "
                          "custom_trace_id_callback=None, post_processing_timeout_s=None, activity_filters=None)",
                  reason="the legacy profiler defaults to use_kineto=False, which times a PrivateUse1 device "
                         "with events per op, and has no per-device default; use_device='npu' should see the npu's "
                         "Kineto activities")


# ---- The chip's projected times ---------------------------------------------

PROJECTED = "NPU projected"                 # the table's column
PROJECTED_TID_OFFSET = 1_000_000            # a stream's projected track: its tid in the trace plus this


def _projected_time_total(self):
    """The projected time on the profile's chip of the kernels, copies and fallbacks this op
    launched and its children did (as device_time_total), or of this kernel; microseconds."""
    if self.is_async:
        return 0.0
    own = vars(self).get("_npu_projected_us", 0.0)
    if self.device_type == DeviceType.CPU:
        return own + sum(child.npu_projected_time_total for child in self.cpu_children)
    return own


def _attach(events, found, trace_start_ns):
    """Sets each event's own projected time: a kernel's (matched by correlation id and
    start) and an op's (the sum of its kernels', as PyTorch links kernels to ops)."""
    per_kernel, per_op = {}, defaultdict(float)
    for p in found:
        per_kernel[(p.correlation, (p.measured_start_ns - trace_start_ns) / 1000)] = p.projected_ns / 1e3
        per_op[p.correlation] += p.projected_ns / 1e3
    for event in events:
        if event.device_type == DeviceType.CPU:
            if not event.is_async and getattr(event, "linked_correlation_id", 0) == 0 and event.id in per_op:
                event._npu_projected_us = per_op[event.id]
        elif (event.id, event.time_range.start) in per_kernel:
            event._npu_projected_us = per_kernel[(event.id, event.time_range.start)]


def _format_us(time_us, time_unit):
    if time_unit == "s":
        return f"{time_us / 1e6:.3f}s"
    if time_unit == "ms":
        return f"{time_us / 1e3:.3f}ms"
    if time_unit == "us":
        return f"{time_us:.3f}us"
    return _profiler_util._format_time(time_us)


def _table_lines(events, sort_by, row_limit, top_level_events_only):
    """The lines _build_table prints between its header and its footer: the event of
    each row, None for a line of its stack (as _build_table selects and orders them)."""
    if sort_by is not None:
        key = sort_by.replace("cuda", "device").replace("xpu", "device").replace("privateuse1", "device")
        events = sorted(events, key=lambda evt: getattr(evt, key), reverse=True)
    has_stack = any(evt.stack is not None and len(evt.stack) > 0 for evt in events)
    lines, shown = [], 0
    for evt in events:
        if shown == row_limit:
            break
        if top_level_events_only and evt.cpu_parent is not None:
            continue
        shown += 1
        lines.append(evt)
        if has_stack:
            lines.extend([None] * (len(evt.stack[1:]) + 1))
    return lines


def _with_projected_column(table, events, device_name, sort_by, row_limit, top_level_events_only, time_unit):
    """``table`` with the "NPU projected" column after the NPU columns and its total below;
    ``table`` itself where its layout is not the one this reads."""
    lines = table.split("\n")
    seps = [i for i, line in enumerate(lines) if line.strip() and set(line) <= {"-", " "}]
    if len(seps) < 3:
        return table
    first, second, last = seps[0], seps[1], seps[-1]
    spans = [m.span() for m in re.finditer(r"-+", lines[first])]
    titles = [lines[first + 1][a:b].strip() for a, b in spans]
    if "NPU time avg" in titles:
        at = spans[titles.index("NPU time avg")][1] + 2
    elif "# of Calls" in titles:
        at = spans[titles.index("# of Calls")][0]
    else:
        return table
    rows = _table_lines(events, sort_by, row_limit, top_level_events_only)
    if len(rows) != last - second - 1:
        return table
    width = max(12, len(PROJECTED))

    def put(i, text):
        line = lines[i].ljust(at)
        lines[i] = line[:at] + text.rjust(width) + "  " + line[at:]

    for i in seps:
        put(i, "-" * width)
    put(first + 1, PROJECTED)
    for i, evt in zip(range(second + 1, last), rows):
        put(i, "" if evt is None else _format_us(evt.npu_projected_time_total, time_unit))
    for i in range(first):
        if lines[i] and set(lines[i]) == {"="}:
            lines[i] += "=" * (width + 2)
    total = sum(evt.npu_projected_time_total for evt in events if evt.device_type != DeviceType.CPU)
    if total > 0:
        footer = f"NPU projected time total: {_format_us(total, time_unit)} (on {device_name}, estimate)"
        end = len(lines) - 1 if lines[-1] == "" else len(lines)
        lines.insert(end, footer)
    return "\n".join(lines)


def _add_projected_track(path, found, device_name):
    """Adds to the Chrome trace at ``path`` a track per stream with ``found`` laid out
    as the chip would run them: events of category "npu_projected" on thread
    PROJECTED_TID_OFFSET + stream of the device's row. Kineto's trace is left as it
    is where it is not JSON this can read."""
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, ValueError):
        return
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        return
    # The trace's clock: where it put a projected activity's own event (else its base time).
    measured = {}
    for e in events:
        args = e.get("args") if isinstance(e, dict) else None
        if e.get("ph") == "X" and isinstance(args, dict) and "projected_us" in args:
            measured.setdefault((args.get("correlation"), e.get("name")), e.get("ts"))
    offset_ns = -int(trace.get("baseTimeNanoseconds", 0))
    for p in found:
        ts = measured.get((p.correlation, p.name))
        if isinstance(ts, (int, float)):
            offset_ns = round(ts * 1000) - p.measured_start_ns
            break
    first_ts = min((p.start_ns for p in found), default=0) + offset_ns
    tracks = sorted({(p.device, p.stream) for p in found})
    for device, stream in tracks:
        tid = PROJECTED_TID_OFFSET + stream
        events.append({"ph": "M", "name": "thread_name", "pid": device, "tid": tid, "ts": round(first_ts / 1e3, 3),
                       "args": {"name": f"Stream {stream}: projected on {device_name} (estimate)"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": device, "tid": tid,
                       "ts": round(first_ts / 1e3, 3), "args": {"sort_index": tid}})
    for p in found:
        events.append({"ph": "X", "cat": "npu_projected", "name": p.name, "pid": p.device,
                       "tid": PROJECTED_TID_OFFSET + p.stream, "ts": round((p.start_ns + offset_ns) / 1e3, 3),
                       "dur": round(p.projected_ns / 1e3, 3),
                       "args": {"correlation": p.correlation, "kind": p.kind, "projected_us": p.projected_ns / 1e3,
                                "estimate": f"{device_name} cost model"}})
    with open(path, "w") as f:
        json.dump(trace, f)


def _install_projections():
    """The chip's projected times in PyTorch's profiler: held by each profile when it
    stops, attached to its events when they are parsed, shown by tables and added to
    exported traces. Nothing happens under a profile without a cost model."""
    _patches.patch(FunctionEvent, "npu_projected_time_total", property(_projected_time_total), GROUP,
                   checked=("2.13",), expects=_patches.ABSENT,
                   reason="PyTorch's events know the emulator's device time only; the projected time on the "
                          "device profile's chip is torch_npu's own")
    _patches.patch(FunctionEventAvg, "npu_projected_time_total", 0.0, GROUP, checked=("2.13",),
                   expects=_patches.ABSENT,
                   reason="averages of events sum the projected time on the chip as they sum device time")

    def summing_projections(original):
        @functools.wraps(original)
        def add(self, other):
            result = original(self, other)
            self.npu_projected_time_total += other.npu_projected_time_total
            return result
        return add

    _patches.wrap(FunctionEventAvg, "add", summing_projections, GROUP, checked=("2.13",), expects="(self, other)",
                  reason="FunctionEventAvg.add sums a fixed set of fields; the projected time on the chip must "
                         "add up in key_averages() too")

    def holding_projections(original):
        @functools.wraps(original)
        def __exit__(self, exc_type, exc_val, exc_tb):
            result = original(self, exc_type, exc_val, exc_tb)
            _analyse.held_projections(self)   # now, before another session replaces the runtime's
            return result
        return __exit__

    _patches.wrap(_autograd_profiler.profile, "__exit__", holding_projections, GROUP, checked=("2.13",),
                  expects="(self, exc_type, exc_val, exc_tb)",
                  reason="the runtime keeps the projections of its last session only; a profile parses its "
                         "events lazily, so it must take its own when it stops")

    def attaching_projections(original):
        @functools.wraps(original)
        def _parse_kineto_results(self, result, timeout_s=None):
            events = original(self, result, timeout_s=timeout_s)
            found = _analyse.projections(self, result) if _analyse.cost_profile() is not None else []
            if found:
                _attach(events, found, result.trace_start_ns())
            return events
        return _parse_kineto_results

    _patches.wrap(_autograd_profiler.profile, "_parse_kineto_results", attaching_projections, GROUP,
                  checked=("2.13",), expects="(self, result, timeout_s=None)",
                  reason="PyTorch builds the events from Kineto's activities, which carry no projected time; "
                         "each op and kernel event gets its own from the session's projections")

    def with_projected_column(original):
        @functools.wraps(original)
        def _build_table(events, sort_by=None, header=None, row_limit=100, max_src_column_width=75,
                         max_name_column_width=55, max_shapes_column_width=80, with_flops=False,
                         profile_memory=False, top_level_events_only=False, time_unit=None):
            table = original(events, sort_by=sort_by, header=header, row_limit=row_limit,
                             max_src_column_width=max_src_column_width, max_name_column_width=max_name_column_width,
                             max_shapes_column_width=max_shapes_column_width, with_flops=with_flops,
                             profile_memory=profile_memory, top_level_events_only=top_level_events_only,
                             time_unit=time_unit)
            profile = _analyse.cost_profile()
            if profile is None or not table or not any(evt.npu_projected_time_total > 0 for evt in events):
                return table
            return _with_projected_column(table, events, profile.device_name, sort_by, row_limit,
                                          top_level_events_only, time_unit)
        return _build_table

    _patches.wrap(_profiler_util, "_build_table", with_projected_column, GROUP, checked=("2.13",),
                  expects="(events, sort_by=None, header=None, row_limit=100, max_src_column_width=75, "
                          "max_name_column_width=55, max_shapes_column_width=80, with_flops=False, "
                          "profile_memory=False, top_level_events_only=False, time_unit=None)",
                  reason="PyTorch's table has a fixed set of columns; under a device profile with a cost model "
                         "it shows the projected time on the chip beside the emulator's device time")

    def with_projected_track(original):
        @functools.wraps(original)
        def export_chrome_trace(self, path, metadata=None, use_python_export=False):
            result = original(self, path, metadata=metadata, use_python_export=use_python_export)
            profile = _analyse.cost_profile()
            found = _analyse.projections(self) if profile is not None and self.kineto_results else []
            if found:
                _add_projected_track(path, found, profile.device_name)
            return result
        return export_chrome_trace

    _patches.wrap(_autograd_profiler.profile, "export_chrome_trace", with_projected_track, GROUP,
                  checked=("2.13",), expects="(self, path, metadata=None, use_python_export=False)",
                  reason="the projected track must stay out of Kineto's activities (PyTorch counts every device "
                         "activity as device time), so it is added to the exported trace")


_profile_npu_through_kineto()
_install_projections()
