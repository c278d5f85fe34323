"""The Db export of the Ascend adapter's profiler (``ExportType.Db``), written from the same
collected profile as the Text export (``_ascend_export.py``):

    ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler[_<rank>].db
        STRING_IDS          every name and shape string, by id
        ENUM_API_TYPE       the host API kinds (op, queue, trace, mstx)
        PYTORCH_API         host ops: start/end, thread, connectionId, name, input shapes/dtypes
        TASK                npu kernels, copies and CPU fallbacks: start/end, device, stream, connectionId
        COMPUTE_TASK_INFO   the kernels' names, types, core and input shapes (not the copies)
        STEP_TIME           ProfilerStep ranges
        MEMORY_RECORD       npu allocator totals over time (profile_memory=True)
        OP_MEMORY           each npu allocation: the op that made it, size, lifetime
        META_DATA, SESSION_TIME_INFO, NPU_INFO, RANK_DEVICE_MAP, HOST_INFO
    ASCEND_PROFILER_OUTPUT/analysis.db
        StepTraceTime       per step: computing and free device time

in the adapter's table layouts, which msprof-analyze's Db analyses read (``cluster``,
``cluster -m compute_op_sum``, ...). Times are integer nanoseconds since the epoch, except
StepTraceTime (microseconds, as the adapter writes it); sizes are bytes. A connectionId joins
a host op to the kernels it launched (PyTorch's correlation id). What the emulator does not
measure (block dims, formats, AI-core counters, communication) is left empty or 0.
"""
import os
import socket
from contextlib import closing
import sqlite3
import uuid

import torch

DB_NAME = "ascend_pytorch_profiler"
ANALYSIS_DB = "analysis.db"

# The adapter's host API kinds; its PyTorch ops are "op".
_API_TYPES = {50001: "op", 50002: "queue", 50003: "trace", 50004: "mstx"}
_API_OP = 50001

_TABLES = {
    "STRING_IDS": "id INTEGER PRIMARY KEY, value TEXT",
    "ENUM_API_TYPE": "id INTEGER PRIMARY KEY, name TEXT",
    "PYTORCH_API": "startNs TEXT, endNs TEXT, globalTid INTEGER, connectionId INTEGER, name INTEGER, "
                   "sequenceNumber INTEGER, fwdThreadId INTEGER, inputDtypes INTEGER, inputShapes INTEGER, "
                   "callchainId INTEGER, type INTEGER",
    "TASK": "startNs INTEGER, endNs INTEGER, deviceId INTEGER, connectionId INTEGER, globalTaskId INTEGER, "
            "globalPid INTEGER, taskType INTEGER, contextId INTEGER, streamId INTEGER, taskId INTEGER, "
            "modelId INTEGER",
    "COMPUTE_TASK_INFO": "name INTEGER, globalTaskId INTEGER, blockDim INTEGER, mixBlockDim INTEGER, "
                         "taskType INTEGER, opType INTEGER, inputFormats INTEGER, inputDataTypes INTEGER, "
                         "inputShapes INTEGER, outputFormats INTEGER, outputDataTypes INTEGER, "
                         "outputShapes INTEGER, attrInfo INTEGER, opState INTEGER, hf32Eligible INTEGER",
    "STEP_TIME": "id INTEGER, startNs INTEGER, endNs INTEGER",
    "MEMORY_RECORD": "component INTEGER, timestamp INTEGER, totalAllocated INTEGER, totalReserved INTEGER, "
                     "totalActive INTEGER, streamPtr INTEGER, deviceId INTEGER",
    "OP_MEMORY": "name INTEGER, size INTEGER, allocationTime INTEGER, releaseTime INTEGER, "
                 "activeReleaseTime INTEGER, duration INTEGER, activeDuration INTEGER, "
                 "allocationTotalAllocated INTEGER, allocationTotalReserved INTEGER, allocationTotalActive INTEGER, "
                 "releaseTotalAllocated INTEGER, releaseTotalReserved INTEGER, releaseTotalActive INTEGER, "
                 "streamPtr INTEGER, deviceId INTEGER",
    "META_DATA": "name TEXT, value TEXT",
    "SESSION_TIME_INFO": "startTimeNs INTEGER, endTimeNs INTEGER",
    "NPU_INFO": "id INTEGER, name TEXT",
    "RANK_DEVICE_MAP": "rankId INTEGER, deviceId INTEGER",
    "HOST_INFO": "hostUid TEXT, hostName TEXT",
}
_STEP_TRACE_TIME = ("deviceId INTEGER, step TEXT, computing NUMERIC, communication_not_overlapped NUMERIC, "
                    "overlapped NUMERIC, communication NUMERIC, free NUMERIC, stage NUMERIC, bubble NUMERIC, "
                    "communication_not_overlapped_and_exclude_receive NUMERIC, preparing NUMERIC")


class _Strings:
    """STRING_IDS: each distinct string once, by id."""

    def __init__(self):
        self.ids = {}

    def __call__(self, value):
        return self.ids.setdefault(value, len(self.ids))

    def rows(self):
        return [(i, v) for v, i in self.ids.items()]


def _ns(us):
    return int(round(us * 1000))


def _create(db, tables):
    for name, columns in tables.items():
        db.execute(f"CREATE TABLE {name} ({columns})")


def _insert(db, table, rows):
    if rows:
        db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)


def db_name(rank):
    return f"{DB_NAME}.db" if rank is None else f"{DB_NAME}_{rank}.db"


def write(out, rank, *, base_us, ops, kernels, steps, step_times, op_inputs, allocations, samples, formats, meta):
    """Writes ``out``/ascend_pytorch_profiler[_<rank>].db and ``out``/analysis.db.

    ``ops``: the host ops (FunctionEvents, times relative to ``base_us``), ``op_inputs`` their
    (shapes, dtypes) by id; ``kernels``: the npu activities (_Kernel); ``steps``: (step, start
    us, end us); ``step_times``: (step, start us, end us, computing us, free us) per step
    range; ``allocations`` and ``samples``: the npu memory as the Text export reads it;
    ``formats``: the Text export's string forms (op_type, shapes, dtypes); ``meta``:
    META_DATA's (name, value) pairs."""
    strings = _Strings()
    pid = os.getpid()
    api_rows = []
    for e in ops:
        start, end = base_us + e.time_range.start, base_us + e.time_range.end
        shapes, dtypes = op_inputs.get(e.id, ([], []))
        api_rows.append((str(_ns(start)), str(_ns(end)), (pid << 32) | (e.thread & 0xFFFFFFFF), e.id,
                         strings(e.name), getattr(e, "sequence_nr", -1), getattr(e, "fwd_thread", 0) or 0,
                         strings(formats.dtypes(dtypes)), strings(formats.shapes(shapes)), None, _API_OP))
    task_rows, compute_rows = [], []
    for task_id, k in enumerate(kernels):
        core = strings(k.core)
        task_rows.append((_ns(k.start_us), _ns(k.start_us + k.dur_us), k.device, k.correlation, task_id, pid, core,
                          0, k.stream, k.task_id, 4294967295))
        if k.core != "MEMCPY_ASYNC":
            empty = strings("")
            compute_rows.append((strings(k.name), task_id, 0, 0, core, strings(formats.op_type(k.name)),
                                 strings(";".join(["ND"] * len(k.shapes))), strings(formats.dtypes(k.dtypes)),
                                 strings(formats.shapes(k.shapes)), empty, empty, empty, empty, 0, 0))
    step_rows = [(int(s) if str(s).isdigit() else i, _ns(a), _ns(b)) for i, (s, a, b) in enumerate(steps)]
    memory_rows = [(strings("PTA"), _ns(t), a.get("Total Allocated", 0), a.get("Total Reserved", 0),
                    a.get("Total Allocated", 0), None, a.get("Device Id", 0)) for t, a in samples]
    op_memory_rows = []
    for m in allocations:
        release = None if m["release_us"] is None else _ns(m["release_us"])
        duration = None if release is None else release - _ns(m["alloc_us"])
        op_memory_rows.append((strings(m["name"]), m["size"], _ns(m["alloc_us"]), release, release, duration,
                               duration, m["alloc_allocated"], m["alloc_reserved"], m["alloc_allocated"],
                               m["release_allocated"], m["release_reserved"], m["release_allocated"], None,
                               m["device"]))
    times = [_ns(k.start_us) for k in kernels] + [_ns(base_us + e.time_range.start) for e in ops]
    ends = [_ns(k.start_us + k.dur_us) for k in kernels] + [_ns(base_us + e.time_range.end) for e in ops]
    devices = sorted({k.device for k in kernels}) or [torch.npu.current_device()]

    path = os.path.join(out, db_name(rank))
    with closing(sqlite3.connect(path)) as db, db:
        _create(db, _TABLES)
        _insert(db, "ENUM_API_TYPE", sorted(_API_TYPES.items()))
        _insert(db, "PYTORCH_API", api_rows)
        _insert(db, "TASK", task_rows)
        _insert(db, "COMPUTE_TASK_INFO", compute_rows)
        _insert(db, "STEP_TIME", step_rows)
        _insert(db, "MEMORY_RECORD", memory_rows)
        _insert(db, "OP_MEMORY", op_memory_rows)
        _insert(db, "STRING_IDS", strings.rows())
        _insert(db, "META_DATA", [(str(n), str(v)) for n, v in meta])
        _insert(db, "SESSION_TIME_INFO", [(min(times, default=_ns(base_us)), max(ends, default=_ns(base_us)))])
        _insert(db, "NPU_INFO", [(d, torch.npu.get_device_name(d)) for d in devices])
        _insert(db, "RANK_DEVICE_MAP", [(-1 if rank is None else rank, d) for d in devices])
        _insert(db, "HOST_INFO", [(str(uuid.getnode()), socket.gethostname())])
    with closing(sqlite3.connect(os.path.join(out, ANALYSIS_DB))) as db, db:
        _create(db, {"StepTraceTime": _STEP_TRACE_TIME})
        _insert(db, "StepTraceTime", [(devices[0], str(step), computing, 0, 0, 0, free, 0, 0, 0, 0)
                                      for step, _, _, computing, free in step_times])
    return path
