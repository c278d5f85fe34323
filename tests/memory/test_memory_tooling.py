"""Memory tooling: private pools (MemPool, use_mem_pool), raw allocations, the per-process
memory fraction, snapshots that torch.cuda._memory_viz renders, the OOM snapshot, and the
allocator settings of PYTORCH_NPU_ALLOC_CONF.

Expected numbers follow the allocator's rules (tests/memory/test_memory.py): sizes round up to 512
bytes; requests up to 1 MiB come from 2 MiB segments; requests under 10 MiB share 20 MiB
segments; larger ones get a segment of their own, rounded up to 2 MiB.
"""
import gc
import json
import os
import pickle
import threading

import pytest
import torch
from torch.cuda import _memory_viz

import torch_npu
from helpers import ASYNC_ENV, KiB, MiB, last_line, run_python

pytestmark = pytest.mark.usefixtures("clean_npu")

_C = torch_npu._C


def alloc(nbytes, device="npu"):
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def segment_of(address, snapshot_segments):
    for segment in snapshot_segments:
        if segment["address"] <= address < segment["address"] + segment["total_size"]:
            return segment
    raise AssertionError(f"no segment holds {address:#x}")


@pytest.fixture
def history():
    """Records the allocator's history for one test, and stops and clears it after."""
    torch.npu.memory._record_memory_history("all", context="all", stacks="python", clear_history=True)
    yield
    torch.npu.memory._record_memory_history(None, clear_history=True)


# ---- private pools ----------------------------------------------------------------------------

def test_mempool_ids_and_use_count():
    a, b = torch.npu.MemPool(), torch.npu.MemPool()
    assert a.id[0] == 0 and b.id[0] == 0 and a.id[1] != b.id[1]  # user pools are (0, n)
    graph_pool = tuple(_C._new_pool_id(False))
    assert graph_pool[0] > 0 and graph_pool[1] == 0  # graph pools are (n, 0)
    assert a.use_count() == 1
    with torch.npu.use_mem_pool(a):
        assert a.use_count() == 2
    assert a.use_count() == 1


def test_mempool_refuses_cuda_only_options():
    with pytest.raises(TypeError, match="allocator must be an NPUPluggableAllocator"):
        torch.npu.MemPool(allocator=object())
    with pytest.raises(NotImplementedError, match="use_on_oom"):
        torch.npu.MemPool(use_on_oom=True)


def test_pool_allocations_come_from_its_own_segments():
    pool = torch.npu.MemPool()
    outside = alloc(4000)
    with torch.npu.use_mem_pool(pool):
        inside = alloc(4000)
    pool_segments = pool.snapshot()
    assert [s["segment_pool_id"] for s in pool_segments] == [pool.id]
    assert pool_segments[0]["total_size"] == 2 * MiB
    assert segment_of(inside.data_ptr(), pool_segments)["allocated_size"] == 4096
    everything = torch.npu.memory_snapshot()
    assert segment_of(outside.data_ptr(), everything)["segment_pool_id"] == (0, 0)
    assert _C._pool_reserved_bytes(0, *pool.id) == 2 * MiB
    assert torch.npu.memory_reserved() == 4 * MiB  # one general, one private small segment
    del outside, inside


def test_pool_blocks_are_cached_in_the_pool_only():
    pool = torch.npu.MemPool()
    with torch.npu.use_mem_pool(pool):
        x = alloc(100 * KiB)
    address = x.data_ptr()
    del x
    y = alloc(100 * KiB)  # the general pool: never the pool's cached block
    assert segment_of(y.data_ptr(), torch.npu.memory_snapshot())["segment_pool_id"] == (0, 0)
    assert y.data_ptr() != address
    with torch.npu.use_mem_pool(pool):
        z = alloc(100 * KiB)  # the pool again: its cached block is reused
    assert z.data_ptr() == address
    torch.npu.empty_cache()  # a live pool keeps its segments
    assert _C._pool_reserved_bytes(0, *pool.id) == 2 * MiB
    del y, z


def test_deleting_the_pool_gives_its_segments_back():
    pool = torch.npu.MemPool()
    with torch.npu.use_mem_pool(pool):
        x = alloc(12 * MiB)  # a segment of its own, 12 MiB
    pool_id = pool.id
    reserved = torch.npu.memory_reserved()
    del pool
    gc.collect()
    assert _C._pool_reserved_bytes(0, *pool_id) == 12 * MiB  # x is alive: its segment stays
    del x
    torch.npu.empty_cache()  # a released pool's free segments go back with the cache
    assert torch.npu.memory_reserved() == reserved - 12 * MiB
    assert _C._pool_reserved_bytes(0, *pool_id) == 0

    pool = torch.npu.MemPool()
    with torch.npu.use_mem_pool(pool):
        y = alloc(12 * MiB)
    del y
    assert torch.npu.memory_reserved() == reserved
    del pool  # no block in use: the segments go back at once
    gc.collect()
    assert torch.npu.memory_reserved() == reserved - 12 * MiB


def test_empty_cache_of_one_pool():
    pool, other = torch.npu.MemPool(), torch.npu.MemPool()
    for p in (pool, other):
        with torch.npu.use_mem_pool(p):
            del_me = alloc(4000)
        del del_me
    torch.npu.empty_cache()
    assert _C._pool_reserved_bytes(0, *pool.id) == 2 * MiB
    _C._empty_cache_pool(*pool.id)  # c10's DeviceAllocator::emptyCache(pool)
    assert _C._pool_reserved_bytes(0, *pool.id) == 0
    assert _C._pool_reserved_bytes(0, *other.id) == 2 * MiB


def test_nested_pools_latest_wins():
    outer, inner = torch.npu.MemPool(), torch.npu.MemPool()
    with torch.npu.use_mem_pool(outer):
        a = alloc(4000)
        with torch.npu.use_mem_pool(inner):
            b = alloc(4000)
        c = alloc(4000)
    segments = torch.npu.memory_snapshot()
    assert segment_of(a.data_ptr(), segments)["segment_pool_id"] == outer.id
    assert segment_of(b.data_ptr(), segments)["segment_pool_id"] == inner.id
    assert segment_of(c.data_ptr(), segments)["segment_pool_id"] == outer.id
    del a, b, c


def test_use_mem_pool_routes_this_thread_only():
    pool = torch.npu.MemPool()
    result = {}
    with torch.npu.use_mem_pool(pool):
        thread = threading.Thread(target=lambda: result.setdefault("x", alloc(4000)))
        thread.start()
        thread.join()
        mine = alloc(4000)
    segments = torch.npu.memory_snapshot()
    assert segment_of(result["x"].data_ptr(), segments)["segment_pool_id"] == (0, 0)
    assert segment_of(mine.data_ptr(), segments)["segment_pool_id"] == pool.id
    del result, mine


def test_stream_filter_routes_one_stream():
    """What a graph capture does: the capturing stream's allocations go to the pool."""
    pool_id = tuple(_C._new_pool_id(False))
    side = torch.npu.Stream()
    _C._begin_allocate_stream_to_pool(0, *pool_id, side.stream_id)
    try:
        with torch.npu.stream(side):
            captured = alloc(4000)
        ordinary = alloc(4000)
    finally:
        _C._end_allocate_to_pool(0, *pool_id)
    segments = torch.npu.memory_snapshot()
    assert segment_of(captured.data_ptr(), segments)["segment_pool_id"] == pool_id
    assert segment_of(ordinary.data_ptr(), segments)["segment_pool_id"] == (0, 0)
    assert _C._pool_use_count(0, *pool_id) == 1
    del captured, ordinary
    torch.npu.synchronize()
    _C._release_pool(0, *pool_id)
    assert _C._pool_reserved_bytes(0, *pool_id) == 0


def test_pool_errors_name_the_pool():
    with pytest.raises(RuntimeError, match=r"memory pool \(0, 987654\) is not being allocated to on npu:0"):
        _C._end_allocate_to_pool(0, 0, 987654)
    with pytest.raises(RuntimeError, match=r"memory pool \(0, 987654\) is not in use on npu:0"):
        _C._release_pool(0, 0, 987654)


# ---- raw allocations, backend, aliases ---------------------------------------------------------

def test_caching_allocator_alloc_and_delete():
    before = torch.npu.memory_allocated()
    side = torch.npu.Stream()
    ptr = torch.npu.caching_allocator_alloc(1000, stream=side)
    assert isinstance(ptr, int) and ptr != 0
    assert torch.npu.memory_allocated() - before == 1024
    assert segment_of(ptr, torch.npu.memory_snapshot())["stream"] == side.stream_id
    torch.npu.caching_allocator_delete(ptr)
    assert torch.npu.memory_allocated() == before
    with pytest.raises(RuntimeError, match="was not allocated by torch.npu.caching_allocator_alloc"):
        torch.npu.caching_allocator_delete(ptr)
    with pytest.raises(TypeError, match="stream must be a torch.npu.Stream"):
        torch.npu.caching_allocator_alloc(10, stream="s")


def test_caching_allocator_disabled_gives_memory_back_after_its_work():
    torch.npu.synchronize()
    torch.npu.empty_cache()
    baseline = torch.npu.memory_reserved()
    cached = torch.empty(MiB, dtype=torch.uint8, device="npu")
    del cached
    assert torch.npu.memory_reserved() > baseline  # cached while the allocator caches
    with torch.npu.caching_allocator_disabled():
        assert not torch_npu._C._caching_allocator_is_enabled()
        assert torch.npu.memory_reserved() == baseline  # the cache went back on disabling
        x = torch.ones(MiB, dtype=torch.uint8, device="npu")
        assert torch.npu.memory_reserved() == baseline + MiB  # exactly its size, no segment rounding
        torch.npu.synchronize()
        del x
        assert torch.npu.memory_reserved() == baseline  # every stream is past the free: back now
    assert torch_npu._C._caching_allocator_is_enabled()
    a = torch.randn(64, 64, device="npu")
    with torch.npu.caching_allocator_disabled():
        assert torch.equal((a @ a).relu().cpu(), (a.cpu() @ a.cpu()).relu())


def test_caching_allocator_disabled_keeps_memory_until_every_stream_ran():
    # Queued work is really pending only when kernels are queued (ASYNC_ENV).
    out = run_python("""
        import torch, torch_npu
        MiB = 1 << 20
        torch.npu.caching_allocator_enable(False)
        torch.zeros(1, device="npu"); torch.npu.synchronize(); torch.npu.empty_cache()
        base = torch.npu.memory_reserved()
        side = torch.npu.Stream()
        y = torch.empty(MiB, dtype=torch.uint8, device="npu")
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            torch.npu._sleep(100)
            y.fill_(7)
        y.record_stream(side)
        del y                                   # freed while its work is queued: kept
        kept_recorded = torch.npu.memory_reserved() - base
        side.synchronize()
        torch.zeros(1, device="npu")           # the next call gives it back
        back_recorded = torch.npu.memory_reserved() - base
        w = torch.empty(MiB, dtype=torch.uint8, device="npu")
        torch.npu.synchronize()
        with torch.npu.stream(side):            # another stream, and no record_stream
            torch.npu._sleep(100)
            w.fill_(3)
        del w
        kept_unrecorded = torch.npu.memory_reserved() - base
        side.synchronize()
        torch.zeros(1, device="npu")
        print(kept_recorded >= MiB, back_recorded < MiB // 2, kept_unrecorded >= MiB,
              torch.npu.memory_reserved() - base < MiB // 2)
    """, env=ASYNC_ENV)
    assert last_line(out) == "True True True True"


def test_backend_aliases_and_nested_stats():
    assert torch.npu.get_allocator_backend() == "native"
    assert torch.npu.OutOfMemoryError is torch.OutOfMemoryError
    x = alloc(4000)
    nested = torch.npu.memory_stats_as_nested_dict()
    flat = torch.npu.memory_stats()
    assert nested["allocated_bytes"]["all"]["current"] == flat["allocated_bytes.all.current"] == 4096
    assert nested["num_ooms"] == flat["num_ooms"]
    assert torch.npu.memory_cached() == torch.npu.memory_reserved()
    assert torch.npu.max_memory_cached() == torch.npu.max_memory_reserved()
    del x


# ---- the per-process memory fraction ------------------------------------------------------------

def test_memory_fraction_limits_the_process():
    _, total = torch.npu.mem_get_info()
    assert torch.npu.get_per_process_memory_fraction() == 1.0
    ooms = torch.npu.memory_stats()["num_ooms"]
    try:
        torch.npu.set_per_process_memory_fraction(32 * MiB / total)
        assert torch.npu.get_per_process_memory_fraction() == pytest.approx(32 * MiB / total)
        kept = alloc(20 * MiB)
        with pytest.raises(torch.OutOfMemoryError) as error:
            alloc(20 * MiB)  # 40 MiB reserved > 32 MiB allowed
        message = str(error.value)
        assert "NPU out of memory on npu:0" in message and "20.00 MiB" in message
        assert "32.00 MiB" in message and "set_per_process_memory_fraction" in message
        assert torch.npu.memory_stats()["num_ooms"] == ooms + 1
        del kept
    finally:
        torch.npu.set_per_process_memory_fraction(1.0)
        torch.npu.reset_accumulated_memory_stats()  # later tests expect a process without OOMs
    del_me = alloc(40 * MiB)
    del del_me
    with pytest.raises(ValueError, match="Allowed range"):
        torch.npu.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError, match="must be `float`"):
        torch.npu.set_per_process_memory_fraction(1)


# ---- snapshots ----------------------------------------------------------------------------------

def make_named_tensor():
    return alloc(3000)


def test_snapshot_structure_and_stacks(history):
    x = make_named_tensor()
    y = alloc(12 * MiB)
    del y
    torch.npu.empty_cache()
    snapshot = torch.npu.memory._snapshot()
    assert set(snapshot) >= {"segments", "device_traces", "allocator_settings"}
    segment = segment_of(x.data_ptr(), snapshot["segments"])
    assert segment["segment_type"] == "small" and segment["total_size"] == 2 * MiB
    assert segment["allocated_size"] == 3072 and segment["requested_size"] == 3000
    block = segment["blocks"][0]
    assert block["address"] == x.data_ptr() and block["state"] == "active_allocated"
    assert block["size"] == 3072 and block["requested_size"] == 3000
    names = [(os.path.basename(f["filename"]), f["name"]) for f in block["frames"]]
    assert ("test_memory_tooling.py", "make_named_tensor") in names
    assert all(isinstance(f["line"], int) for f in block["frames"])
    assert segment["blocks"][1]["state"] == "inactive" and segment["blocks"][1]["frames"] == []

    trace = snapshot["device_traces"][0]
    actions = [(e["action"], e.get("size")) for e in trace]
    assert actions[:7] == [
        ("segment_alloc", 2 * MiB), ("alloc", 3072),
        ("segment_alloc", 12 * MiB), ("alloc", 12 * MiB), ("free_requested", 12 * MiB),
        ("free_completed", 12 * MiB), ("segment_free", 12 * MiB),
    ]
    assert trace[-1]["action"] == "snapshot"
    assert trace[1]["addr"] == x.data_ptr() and trace[1]["stream"] == 0
    assert "make_named_tensor" in [f["name"] for f in trace[1]["frames"]]
    assert [f["name"] for f in trace[4]["frames"]][0] == "test_snapshot_structure_and_stacks"  # where it was freed
    assert trace[1]["time_us"] <= trace[4]["time_us"]
    del x


def test_history_max_entries_keeps_the_latest():
    torch.npu.memory._record_memory_history("all", max_entries=4, clear_history=True)
    try:
        kept = [alloc(512 * (i + 1)) for i in range(6)]
        trace = torch.npu.memory._snapshot()["device_traces"][0]
        # the 4 latest entries: the last three allocations, then the snapshot
        assert [e["size"] for e in trace[:3]] == [2048, 2560, 3072]
        assert trace[3]["action"] == "snapshot"
    finally:
        torch.npu.memory._record_memory_history(None, clear_history=True)
    del kept


def test_state_only_records_live_stacks_without_history():
    torch.npu.memory._record_memory_history("state", clear_history=True)
    try:
        x = make_named_tensor()
        snapshot = torch.npu.memory._snapshot()
    finally:
        torch.npu.memory._record_memory_history(None, clear_history=True)
    assert snapshot["device_traces"][0] == []
    block = segment_of(x.data_ptr(), snapshot["segments"])["blocks"][0]
    assert "make_named_tensor" in [f["name"] for f in block["frames"]]
    with pytest.raises(ValueError, match="stacks must be 'python' or 'all'"):
        torch.npu.memory._record_memory_history("all", stacks="cpp")
    del x


def test_pytorch_memory_viz_renders_an_npu_snapshot(history, tmp_path):
    x = make_named_tensor()
    pool = torch.npu.MemPool()
    with torch.npu.use_mem_pool(pool):
        y = alloc(12 * MiB)
    del y
    path = tmp_path / "snapshot.pickle"
    torch.npu.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snapshot = pickle.load(f)

    # the text views
    text = _memory_viz.trace(snapshot)
    assert "Device 0" in text and "cudaMalloc(" in text and "del " in text
    summary = _memory_viz.segsum(snapshot)
    assert "segments: 2" in summary and "total_reserved: 14.0MiB" in summary
    # the flame graphs, with their folded-stack input (the svg step downloads a script)
    folded = _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines)
    assert "stream_0;active_allocated;" in folded and "make_named_tensor" in folded
    folded = _memory_viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    assert f"seg_{segment_of(x.data_ptr(), snapshot['segments'])['address']}" in folded
    # the interactive pages: the snapshot embedded as the viewer (pytorch.org/memory_viz) reads it
    for page in (_memory_viz.trace_plot(snapshot), _memory_viz.trace_plot(snapshot, plot_segments=True),
                 _memory_viz.segment_plot(snapshot)):
        assert "MemoryViz.js" in page and "snapshot.pickle" in page
    # filter_freed walks alloc/free pairs: every free_completed had its free_requested
    filtered = _memory_viz.filter_alloc_free_pairs(pickle.loads(pickle.dumps(snapshot)))
    assert [e["action"] for e in filtered["device_traces"][0]].count("alloc") == 1  # x, still alive
    # the command line of torch.cuda._memory_viz reads the pickle
    proc = run_python(f"import sys; sys.argv = ['_memory_viz', 'stats', {str(path)!r}]\n"
                      "import runpy; runpy.run_module('torch.cuda._memory_viz', run_name='__main__')")
    assert "total_reserved" in proc.stdout
    del x, pool


# ---- OOM snapshots (OOM_SNAPSHOT_ENABLE / OOM_SNAPSHOT_PATH) ------------------------------------

OOM_SNAPSHOT_SCRIPT = r"""
import json, os, pickle, torch
MiB = 1 << 20
def hold():
    return torch.empty(40 * MiB, dtype=torch.uint8, device="npu")
kept = hold()
try:
    torch.empty(40 * MiB, dtype=torch.uint8, device="npu")
    raised = False
except torch.OutOfMemoryError:
    raised = True
files = sorted(os.listdir(os.environ["OOM_SNAPSHOT_PATH"]))
snapshot = pickle.load(open(os.path.join(os.environ["OOM_SNAPSHOT_PATH"], files[0]), "rb"))
trace = snapshot["device_traces"][0]
print(json.dumps({
    "raised": raised, "files": files,
    "segments": [(s["total_size"], s["blocks"][0]["state"], [f["name"] for f in s["blocks"][0]["frames"]])
                 for s in snapshot["segments"]],
    "actions": [e["action"] for e in trace],
    "oom": [{"size": e["size"], "device_free": e["device_free"]} for e in trace if e["action"] == "oom"],
}))
"""


@pytest.mark.parametrize("mode", ["1", "2"])
def test_oom_snapshot_is_written(tmp_path, mode):
    proc = run_python(OOM_SNAPSHOT_SCRIPT, env={"NPU_EMU_MEMORY": "64MiB", "OOM_SNAPSHOT_ENABLE": mode,
                                                "OOM_SNAPSHOT_PATH": str(tmp_path)})
    result = json.loads(last_line(proc))
    assert result["raised"]
    [name] = result["files"]
    assert name.startswith(f"oom_snapshot_") and name.endswith(".pickle")
    assert "the memory snapshot is in" in proc.stderr and name in proc.stderr
    if mode == "1":  # the history, with stacks
        assert result["segments"] == [[40 * MiB, "active_allocated", ["hold", "<module>"]]]
        assert result["actions"][:2] == ["segment_alloc", "alloc"] and "oom" in result["actions"]
        assert result["oom"] == [{"size": 40 * MiB, "device_free": 24 * MiB}]
    else:  # the state only
        assert result["segments"] == [[40 * MiB, "active_allocated", []]]
        assert result["actions"] == []


def test_oom_snapshot_settings_are_checked():
    proc = run_python("import torch_npu", env={"OOM_SNAPSHOT_ENABLE": "yes"}, check=False)
    assert proc.returncode != 0 and "OOM_SNAPSHOT_ENABLE='yes' is not valid" in proc.stderr


# ---- allocator settings -------------------------------------------------------------------------

SETTINGS_SCRIPT = r"""
import json, torch
MiB = 1 << 20
def allocated(nbytes):
    before = torch.npu.memory_allocated()
    x = torch.empty(nbytes, dtype=torch.uint8, device="npu")
    return torch.npu.memory_allocated() - before
out = {}
"""


@pytest.fixture(scope="module")
def split_and_roundup():
    code = SETTINGS_SCRIPT + r"""
# roundup_power2_divisions:4 from the environment: 5 MiB + 1 rounds to the next quarter of 4..8 MiB
out["four"] = [allocated(5 * MiB + 1), allocated(9000), allocated(4 * MiB)]
torch.npu.memory._set_allocator_settings("roundup_power2_divisions:[256:1,>:4]")
out["list"] = [allocated(5 * MiB + 1), allocated(300 * MiB + 1)]
torch.npu.memory._set_allocator_settings("roundup_power2_divisions:0,max_split_size_mb:40")
torch.npu.empty_cache()
a = torch.empty(60 * MiB, dtype=torch.uint8, device="npu")
del a                                                            # a cached 60 MiB block
b = torch.empty(30 * MiB, dtype=torch.uint8, device="npu")       # not cut from it: a segment of its own
out["small_request"] = torch.npu.memory_reserved()
c = torch.empty(50 * MiB, dtype=torch.uint8, device="npu")       # takes it whole (wastes < 20 MiB)
s = torch.npu.memory_stats()
out["large_request"] = [torch.npu.memory_reserved(), torch.npu.memory_allocated(), s["max_split_size"],
                        s["oversize_allocations.current"], s["oversize_segments.current"]]
print(json.dumps(out))
"""
    return json.loads(last_line(run_python(code, env={"NPU_EMU_MEMORY": "1GiB", "NPU_EMU_DEVICES": "1",
                                                      "PYTORCH_NPU_ALLOC_CONF": "roundup_power2_divisions:4"})))


def test_roundup_power2_divisions(split_and_roundup):
    # 4 divisions: 5 MiB + 1 -> 6 MiB; 9000 B -> 10 KiB (8..16 KiB in 2 KiB steps); powers of two stay
    assert split_and_roundup["four"] == [6 * MiB, 10 * KiB, 4 * MiB]
    # [256:1,>:4]: one division (512-byte rounding) below 256 MiB, four from 256 MiB up
    assert split_and_roundup["list"] == [5 * MiB + 512, 320 * MiB]


def test_max_split_size_mb(split_and_roundup):
    # without the setting the 30 MiB request would be cut from the cached 60 MiB block (60 MiB reserved)
    assert split_and_roundup["small_request"] == 90 * MiB
    reserved, allocated_now, max_split, oversize_allocations, oversize_segments = split_and_roundup["large_request"]
    assert reserved == 90 * MiB  # no new segment for c
    assert allocated_now == 30 * MiB + 60 * MiB  # c holds the whole, unsplit 60 MiB block
    assert max_split == 40 * MiB and oversize_allocations == 1 and oversize_segments == 1


def test_garbage_collection_threshold():
    code = SETTINGS_SCRIPT + r"""
a = torch.empty(24 * MiB, dtype=torch.uint8, device="npu")
del a                    # 24 MiB cached, above 0.25 * 64 MiB
b = torch.empty(30 * MiB, dtype=torch.uint8, device="npu")
s = torch.npu.memory_stats()
print(json.dumps([torch.npu.memory_reserved(), s["num_device_free"], s["num_alloc_retries"]]))
"""
    env = {"NPU_EMU_MEMORY": "64MiB", "NPU_EMU_DEVICES": "1"}
    collected = json.loads(last_line(run_python(code, env={**env, "PYTORCH_NPU_ALLOC_CONF":
                                                           "garbage_collection_threshold:0.25"})))
    # the cached 24 MiB segment was freed before the new one was allocated, without an OOM retry
    assert collected == [30 * MiB, 1, 0]
    kept = json.loads(last_line(run_python(code, env=env)))
    assert kept == [54 * MiB, 0, 0]


def test_page_size_alloc_conf_fallback():
    code = SETTINGS_SCRIPT + r"""
x = torch.empty(30 * MiB, dtype=torch.uint8, device="npu")
print(json.dumps([torch.npu.memory_reserved(), torch.npu.memory._snapshot()["allocator_settings"]["origin"]]))
"""
    proc = run_python(code, env={"NPU_EMU_MEMORY": "2GiB", "NPU_EMU_DEVICES": "1", "PYTORCH_NPU_ALLOC_CONF": None,
                                 "PYTORCH_ALLOC_CONF": "page_size:1g,expandable_segments:False"})
    # large-pool segments come in whole 1 GiB pages; PYTORCH_ALLOC_CONF is read without PYTORCH_NPU_ALLOC_CONF
    assert json.loads(last_line(proc)) == [1 << 30, "PYTORCH_ALLOC_CONF"]
    # PYTORCH_NPU_ALLOC_CONF comes first; expandable segments grow by 2 MiB pages, page_size aside
    proc = run_python(code, env={"NPU_EMU_MEMORY": "2GiB", "NPU_EMU_DEVICES": "1",
                                 "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
                                 "PYTORCH_ALLOC_CONF": "page_size:1g"})
    assert json.loads(last_line(proc)) == [30 * MiB, "PYTORCH_NPU_ALLOC_CONF"]
    assert "expandable_segments" not in proc.stderr


@pytest.mark.parametrize("setting,message", [
    ("max_split_size_mb:abc", "max_split_size_mb:abc is not valid; max_split_size_mb takes a whole number"),
    ("max_split_size_mb:10", "max_split_size_mb:10 is too small; it must be more than 20"),
    ("garbage_collection_threshold:1.5", "garbage_collection_threshold:1.5 is out of range"),
    ("roundup_power2_divisions:3", "the divisions must be a power of two"),
    ("roundup_power2_divisions:[100:2]", "the size 100 MiB is not a power of two"),
    ("expandable_segments:maybe", "expandable_segments takes True or False"),
    ("page_size:2m", "page_size takes 1g"),
    ("max_split_size_mb", "is not a key:value setting"),
    ("cuda_magic:1", "unknown setting 'cuda_magic'"),
])
def test_bad_settings_name_the_setting(setting, message):
    with pytest.raises(ValueError, match="torch.npu.memory._set_allocator_settings: .*" + message.replace(
            "(", r"\(").replace("[", r"\[")):
        torch.npu.memory._set_allocator_settings(setting)
    assert torch.npu.memory._snapshot()["allocator_settings"]["max_split_size"] == "-1"  # nothing applied


def test_bad_environment_setting_names_the_variable():
    proc = run_python("import torch_npu", env={"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:64,bogus:1"},
                      check=False)
    assert proc.returncode != 0
    assert "PYTORCH_NPU_ALLOC_CONF: unknown setting 'bogus'" in proc.stderr


def test_the_snapshot_example_writes_a_snapshot_and_its_timeline(tmp_path):
    import importlib.util
    import pickle
    pytest.importorskip("matplotlib", reason="matplotlib draws the timeline")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    spec = importlib.util.spec_from_file_location("memory_snapshot", os.path.join(root, "examples", "memory_snapshot.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(["--out", str(tmp_path / "timeline.png"), "--pickle", str(tmp_path / "snap.pickle")])
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    with open(tmp_path / "snap.pickle", "rb") as f:
        snapshot = pickle.load(f)
    times, series = example.active_timeline(snapshot)
    assert series and all(len(s) == len(times) for s in series)
    assert max(sum(column) for column in zip(*series)) > 1 << 20      # the model's memory, at its peak
