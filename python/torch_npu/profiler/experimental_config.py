"""The Ascend adapter's profiler switches: ``torch_npu.profiler._ExperimentalConfig``,
``ProfilerLevel``, ``AiCMetrics`` and ``ExportType``, with its names, values and
defaults, accepted by ``torch_npu.profiler.profile(experimental_config=...)``.

    config = torch_npu.profiler._ExperimentalConfig(profiler_level=ProfilerLevel.Level1,
                                                    export_type=ExportType.Text)
    with torch_npu.profiler.profile(experimental_config=config,
                                    on_trace_ready=torch_npu.profiler.tensorboard_trace_handler("./prof")):
        ...

What the emulator can honour: the profiler level decides what the Text export
holds (Level_none: the host's ops only; Level0 and up: the npu's kernels, copies
and fallbacks too; Level1 and up: the runtime's launches and stream waits under
their CANN names, "Node@launch" and "AscendCL@aclrtSynchronizeStream", on a "CANN"
track); ``record_op_args`` asks for the ops' shapes (``record_shapes``). The
emulated npu has no AI-core performance counters and no L2 cache to sample:
``aic_metrics`` and ``l2_cache`` are validated and recorded in the export's
``profiler_info.json``, and the export writes no counter columns, as the adapter
does at Level0. ``gc_detect_threshold`` (milliseconds) records Python's garbage
collections at least that long ("GC" events in trace_view.json, which
msprof-analyze's GC check reads). ``data_simplification``, ``msprof_tx``,
``host_sys``, ``mstx*``, ``sys_io`` and ``sys_interconnection`` are validated and
recorded only (the export has no intermediate data to simplify, nor those system
samples). ``export_type`` picks the Text export, the Db export (the adapter's
SQLite ``ascend_pytorch_profiler[_<rank>].db`` and ``analysis.db``) or both;
``op_attr`` needs the Db export and records nothing there (PyTorch's profiler keeps
no operator attributes).

Invalid values raise ``ValueError`` naming the valid ones (the adapter warns and
resets them to defaults).
"""

__all__ = ["_ExperimentalConfig", "supported_profiler_level", "supported_ai_core_metrics",
           "supported_export_type", "ProfilerLevel", "AiCMetrics", "ExportType"]


class ProfilerLevel:
    Level_none = "Level_none"
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"


class AiCMetrics:
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
    MemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    MemoryUB = "ACL_AICORE_MEMORY_UB"
    ResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    L2Cache = "ACL_AICORE_L2_CACHE"
    AiCoreNone = "ACL_AICORE_NONE"


class ExportType:
    Text = "text"
    Db = "db"


def supported_profiler_level():
    return {ProfilerLevel.Level0, ProfilerLevel.Level1, ProfilerLevel.Level2}


def supported_ai_core_metrics():
    return {AiCMetrics.PipeUtilization, AiCMetrics.ArithmeticUtilization, AiCMetrics.Memory, AiCMetrics.MemoryL0,
            AiCMetrics.MemoryUB, AiCMetrics.ResourceConflictRatio, AiCMetrics.L2Cache}


def supported_export_type():
    return {ExportType.Text, ExportType.Db}


_LEVELS = (ProfilerLevel.Level_none, ProfilerLevel.Level0, ProfilerLevel.Level1, ProfilerLevel.Level2)
_METRICS = tuple(sorted(supported_ai_core_metrics())) + (AiCMetrics.AiCoreNone,)


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise ValueError(f"_ExperimentalConfig: {name} must be a bool, got {value!r}")


class _ExperimentalConfig:
    """The Ascend adapter's ``torch_npu.profiler._ExperimentalConfig`` (same keywords and
    defaults). See the module's docstring for what the emulated npu does with each."""

    def __init__(self, profiler_level=ProfilerLevel.Level0, aic_metrics=AiCMetrics.AiCoreNone, l2_cache=False,
                 msprof_tx=False, data_simplification=True, record_op_args=False, op_attr=False,
                 gc_detect_threshold=None, export_type=ExportType.Text, host_sys=None, mstx_domain_include=None,
                 mstx_domain_exclude=None, sys_io=False, sys_interconnection=False, mstx=False):
        if profiler_level not in _LEVELS:
            raise ValueError(f"_ExperimentalConfig: profiler_level must be one of ProfilerLevel's "
                             f"{', '.join(_LEVELS)}; got {profiler_level!r}")
        if aic_metrics not in _METRICS:
            raise ValueError(f"_ExperimentalConfig: aic_metrics must be one of AiCMetrics' {', '.join(_METRICS)}; "
                             f"got {aic_metrics!r}")
        if profiler_level in (ProfilerLevel.Level_none, ProfilerLevel.Level0):
            if aic_metrics != AiCMetrics.AiCoreNone:
                raise ValueError(f"_ExperimentalConfig: aic_metrics={aic_metrics!r} needs profiler_level Level1 or "
                                 f"Level2 (the adapter collects no AI-core metrics at {profiler_level})")
        elif aic_metrics == AiCMetrics.AiCoreNone:
            aic_metrics = AiCMetrics.PipeUtilization   # the adapter's default above Level0
        for name, value in (("l2_cache", l2_cache), ("msprof_tx", msprof_tx), ("record_op_args", record_op_args),
                            ("op_attr", op_attr), ("sys_io", sys_io), ("sys_interconnection", sys_interconnection),
                            ("mstx", mstx)):
            _check_bool(name, value)
        if data_simplification is not None:
            _check_bool("data_simplification", data_simplification)
        if gc_detect_threshold is not None and (not isinstance(gc_detect_threshold, (int, float))
                                                or isinstance(gc_detect_threshold, bool) or gc_detect_threshold < 0):
            raise ValueError(f"_ExperimentalConfig: gc_detect_threshold must be a number >= 0 (milliseconds) or "
                             f"None; got {gc_detect_threshold!r}")
        types = [export_type] if isinstance(export_type, str) else list(export_type or [])
        if not types or any(t not in (ExportType.Text, ExportType.Db) for t in types):
            raise ValueError(f"_ExperimentalConfig: export_type must be ExportType.Text ('text') or ExportType.Db "
                             f"('db'), or a list of them; got {export_type!r}")
        if op_attr and ExportType.Db not in types:
            raise ValueError("_ExperimentalConfig: op_attr is only valid with export_type=ExportType.Db (the "
                             "operators' attributes go into the Db export)")
        self._profiler_level = profiler_level
        self._aic_metrics = aic_metrics
        self._l2_cache = l2_cache
        self._msprof_tx = msprof_tx
        self._data_simplification = True if data_simplification is None else data_simplification
        self.record_op_args = record_op_args
        self._op_attr = op_attr
        self._gc_detect_threshold = gc_detect_threshold
        self._export_type = types
        self._host_sys = list(host_sys or [])
        self._mstx_domain_include = list(mstx_domain_include or [])
        self._mstx_domain_exclude = list(mstx_domain_exclude or [])
        self._sys_io = sys_io
        self._sys_interconnection = sys_interconnection
        self._mstx = mstx

    @property
    def profiler_level(self):
        return self._profiler_level

    @property
    def aic_metrics(self):
        return self._aic_metrics

    @property
    def export_type(self):
        return list(self._export_type)

    @property
    def with_gc(self):
        return self._gc_detect_threshold is not None

    @property
    def gc_detect_threshold(self):
        return self._gc_detect_threshold

    @property
    def device_activities(self):
        """Whether the Text export holds the npu's activities (all levels but Level_none)."""
        return self._profiler_level != ProfilerLevel.Level_none

    def to_dict(self):
        """The switches as the adapter records them in profiler_info.json."""
        return {"_profiler_level": self._profiler_level, "_aic_metrics": self._aic_metrics,
                "_l2_cache": self._l2_cache, "_msprof_tx": self._msprof_tx,
                "_data_simplification": self._data_simplification, "record_op_args": self.record_op_args,
                "_op_attr": self._op_attr, "_gc_detect_threshold": self._gc_detect_threshold,
                "_export_type": list(self._export_type), "_host_sys": self._host_sys,
                "_mstx_domain_include": self._mstx_domain_include, "_mstx_domain_exclude": self._mstx_domain_exclude,
                "_sys_io": self._sys_io, "_sys_interconnection": self._sys_interconnection, "_mstx": self._mstx}

    def __repr__(self):
        return f"_ExperimentalConfig(profiler_level={self._profiler_level!r}, aic_metrics={self._aic_metrics!r}, " \
               f"export_type={self._export_type!r})"
