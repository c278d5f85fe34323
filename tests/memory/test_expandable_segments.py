"""expandable_segments:True (PYTORCH_NPU_ALLOC_CONF): the general large pool of each stream
takes its blocks from one segment that grows in place, page by page (2 MiB), through the
HAL's virtual memory (Capabilities::virtual_memory), so freed blocks and new growth merge;
empty_cache() unmaps whole free pages. Each test runs in a subprocess: the setting is read
at import.
"""
import json

import pytest

from helpers import MiB, last_line, run_python

PRELUDE = r"""
import json, warnings
import torch, torch_npu
MiB = 1 << 20
def buf(mib, value=0.0):
    return torch.full((mib * MiB // 4,), float(value), device="npu")
"""

# The fragmenting workload: a buffer that grows (each step allocates a larger one from the
# last, then frees the last), then the classic "allocate N blocks, free every other,
# allocate a larger one".
FRAGMENTING = PRELUDE + r"""
total = torch.zeros((), device="npu")
x = buf(12, 1)
for i in range(1, 13):
    y = buf(12 + 2 * i) + x.sum() / x.numel()
    total += y.sum()
    x = y
del x, y
blocks = [buf(12, i) for i in range(8)]
for i in range(0, 8, 2):
    blocks[i] = None
big = buf(40, 2)
total += big.sum() + sum(b.sum() for b in blocks if b is not None)
stats = torch.npu.memory_stats()
segments = torch.npu.memory._snapshot()["segments"]
out = {"peak": stats["reserved_bytes.all.peak"], "result": total.item(),
       "large_segments": [[s["is_expandable"], s["total_size"]] for s in segments if s["segment_type"] == "large"],
       "reserved_matches": sum(s["total_size"] for s in segments) == torch.npu.memory_reserved()}
del big, blocks
torch.npu.empty_cache()
free, total_memory = torch.npu.mem_get_info()
out["after_empty_cache"] = [torch.npu.memory_stats()["reserved_bytes.large_pool.current"],
                            total_memory - free == torch.npu.memory_reserved()]
print(json.dumps(out))
"""


def run(code, setting, memory="2GiB", **env):
    proc = run_python(code, env={"NPU_EMU_MEMORY": memory, "NPU_EMU_DEVICES": "1", "PYTORCH_ALLOC_CONF": None,
                                 "PYTORCH_NPU_ALLOC_CONF": setting, **env})
    return json.loads(last_line(proc)), proc


def test_fragmenting_workload_reserves_less_with_the_same_results():
    default, _ = run(FRAGMENTING, "expandable_segments:False")
    expandable, proc = run(FRAGMENTING, "expandable_segments:True")
    print(f"reserved peak: expandable_segments False {default['peak'] / MiB:.0f} MiB, "
          f"True {expandable['peak'] / MiB:.0f} MiB")
    assert expandable["result"] == default["result"]
    assert expandable["peak"] < default["peak"] / 2
    assert default["peak"] == 654 * MiB and expandable["peak"] == 142 * MiB  # the figures of docs/guide/memory.md
    assert all(not e for e, _ in default["large_segments"]) and len(default["large_segments"]) > 8
    # one expandable segment (its mapped run) holds every large block
    assert [e for e, _ in expandable["large_segments"]] == [True]
    for result in (default, expandable):
        assert result["reserved_matches"]
        assert result["after_empty_cache"] == [0, True]   # every large page unmapped, the device's count agrees
    assert "expandable_segments" not in proc.stderr


def test_a_segment_grows_in_place_and_the_snapshot_shows_it():
    code = PRELUDE + r"""
torch.npu.memory._record_memory_history(max_entries=1000)
a = buf(12)
b = buf(6)
stats = torch.npu.memory_stats()
seg = [s for s in torch.npu.memory._snapshot()["segments"] if s["segment_type"] == "large"]
del a                  # a free block before b ...
c = buf(30)            # ... too small: pages are mapped after b
d = buf(10)            # a's block again
trace = torch.npu.memory._snapshot()["device_traces"][0]
print(json.dumps({
    "contiguous": b.data_ptr() == seg[0]["address"] + 12 * MiB and c.data_ptr() == b.data_ptr() + 6 * MiB,
    "reuse": d.data_ptr() == seg[0]["address"],
    "first": [[s["is_expandable"], s["total_size"], [bl["size"] for bl in s["blocks"]]] for s in seg],
    "segments": [stats["segment.large_pool.current"], torch.npu.memory_stats()["segment.large_pool.current"]],
    "reserved": torch.npu.memory_stats()["reserved_bytes.large_pool.current"],
    "maps": [e["size"] for e in trace if e["action"] == "segment_map"],
    "segment_allocs": sum(e["action"] == "segment_alloc" and e["size"] >= 2 * MiB and e["size"] != 2 * MiB
                          for e in trace)}))
"""
    out, _ = run(code, "expandable_segments:True")
    assert out["contiguous"] and out["reuse"]
    assert out["first"] == [[True, 18 * MiB, [12 * MiB, 6 * MiB]]]
    assert out["segments"] == [1, 1]           # one segment, grown
    assert out["reserved"] == 48 * MiB         # 12 + 6 + 30
    assert out["maps"] == [12 * MiB, 6 * MiB, 30 * MiB]
    assert out["segment_allocs"] == 0


def test_empty_cache_unmaps_free_pages_in_the_middle_and_at_the_end():
    code = PRELUDE + r"""
a, b, c = buf(10), buf(10), buf(11)
before = torch.npu.mem_get_info()[0]
del b, c               # a free hole after a, and free pages at the end
torch.npu.empty_cache()
stats = torch.npu.memory_stats()
segs = [s for s in torch.npu.memory._snapshot()["segments"] if s["segment_type"] == "large"]
print(json.dumps([stats["reserved_bytes.large_pool.current"], torch.npu.mem_get_info()[0] - before,
                  [[s["is_expandable"], s["total_size"]] for s in segs], stats["segment.large_pool.current"],
                  a.sum().item()]))
del a
torch.npu.empty_cache()
print(json.dumps([torch.npu.memory_stats()["reserved_bytes.large_pool.current"],
                  torch.npu.memory_stats()["segment.large_pool.current"]]))
"""
    proc = run_python(code, env={"NPU_EMU_MEMORY": "2GiB", "NPU_EMU_DEVICES": "1", "PYTORCH_ALLOC_CONF": None,
                                 "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"})
    first, second = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert first == [10 * MiB, 22 * MiB, [[True, 10 * MiB]], 1, 0.0]
    assert second == [0, 0]


def test_out_of_memory_retry_and_fraction():
    code = PRELUDE + r"""
out = {}
a = buf(40)
b = buf(10)
del a                  # 40 MiB cached before b: a 50 MiB request fits neither there nor at the end
c = buf(50)            # the retry unmaps the cached pages, then maps again
out["retry"] = [torch.npu.memory_stats()["num_alloc_retries"], torch.npu.memory_stats()["num_ooms"]]
try:
    buf(60)
except torch.OutOfMemoryError as e:
    out["oom"] = "NPU out of memory" in str(e)
out["ooms"] = torch.npu.memory_stats()["num_ooms"]
del c
out["after"] = buf(40).sum().item()      # still usable after the OOM
torch.npu.empty_cache()
torch.npu.set_per_process_memory_fraction(0.5)
try:
    buf(40)
except torch.OutOfMemoryError as e:
    out["fraction"] = "set_per_process_memory_fraction" in str(e)
out["fraction_ok"] = buf(20).numel() * 4 == 20 * MiB
print(json.dumps(out))
"""
    out, _ = run(code, "expandable_segments:True", memory="64MiB")
    assert out == {"retry": [1, 0], "oom": True, "ooms": 1, "after": 0.0, "fraction": True, "fraction_ok": True}


def test_record_stream_and_stream_order_still_hold():
    code = PRELUDE + r"""
s = torch.npu.Stream()
a = buf(12, 3)
s.wait_stream(torch.npu.current_stream())
with torch.npu.stream(s):
    b = a * 2          # s reads a
a.record_stream(s)
del a
c = buf(12, 5)         # a's block only once s's work on it ran
torch.npu.synchronize()
with torch.npu.stream(s):   # s has its own expandable segment
    e = buf(12, 7)
torch.npu.synchronize()
print(json.dumps([b.sum().item() == 6 * 3 * MiB, c[0].item(), e[0].item(),
                  sum(x["is_expandable"] for x in torch.npu.memory._snapshot()["segments"])]))
"""
    out, _ = run(code, "expandable_segments:True")
    assert out == [True, 5.0, 7.0, 2]


def test_private_pools_keep_ordinary_segments():
    code = PRELUDE + r"""
pool = torch.npu.MemPool()
with torch.npu.use_mem_pool(pool):
    x = buf(12)
segs = torch.npu.memory._snapshot()["segments"]
print(json.dumps([[s["is_expandable"], list(s["segment_pool_id"]) != [0, 0]] for s in segs
                  if s["segment_type"] == "large"]))
"""
    out, _ = run(code, "expandable_segments:True")
    assert out == [[False, True]]


def test_without_virtual_memory_it_warns_once_and_behaves_as_false():
    code = PRELUDE + r"""
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    x, y = buf(12), buf(12)
print(json.dumps([[str(w.message) for w in caught], torch.npu.memory_reserved(),
                  [s["is_expandable"] for s in torch.npu.memory._snapshot()["segments"]]]))
"""
    out, _ = run(code, "expandable_segments:True", NPU_EMU_PROTECT="1")
    messages, reserved, expandable = out
    assert len([m for m in messages if "cannot grow a segment in place" in m]) == 1, messages
    assert reserved == 2 * 12 * MiB and expandable == [False, False]   # as with False: a segment each


def test_expandable_memory_cannot_be_sent_to_another_process():
    code = PRELUDE + r"""
from multiprocessing.reduction import ForkingPickler
try:
    ForkingPickler.dumps(buf(12))
    print(json.dumps(None))
except Exception as e:
    print(json.dumps(str(e)))
"""
    out, _ = run(code, "expandable_segments:True")
    assert out is not None and "expandable_segments:False" in out, out
