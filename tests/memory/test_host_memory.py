"""Pinned host memory is cached and reused, as by CUDA's CachingHostAllocator.

A freed pinned block goes on the free list of its power-of-two size and the next pin of that
size gets it back without asking the host; a block that a queued non_blocking copy still reads
or writes is not handed out before the copy ran. torch.npu.host_memory_stats() reports it with
torch.cuda.host_memory_stats()'s keys, its reset functions and torch.accelerator.empty_host_cache()
act on it. The asynchronous cases run in a child with NPU_EMU_ALWAYS_ENQUEUE=1, where a kernel
(torch.npu._sleep) really keeps the stream busy while the host goes on.
"""
import json
import re

import pytest
import torch

import torch_npu  # noqa: F401
from helpers import last_line

ALWAYS_ENQUEUE = {"NPU_EMU_ALWAYS_ENQUEUE": "1", "NPU_LAUNCH_BLOCKING": None}


def child_json(run_python, code, env=ALWAYS_ENQUEUE):
    return json.loads(last_line(run_python("import json, torch, torch_npu\n" + code, env=env)))


def stats():
    return torch.npu.host_memory_stats()


@pytest.fixture
def empty_host_cache():
    """No cached blocks from earlier tests: a pin of any size asks the host. (Like
    torch.cuda's, torch.accelerator.empty_host_cache() does nothing before the device's
    lazy initialisation, which an npu tensor triggers.)"""
    torch.ones(1, device="npu")
    torch.npu.synchronize()
    torch.accelerator.empty_host_cache()
    yield


def cuda_documented_keys():
    """The keys torch.cuda.host_memory_stats() documents, braces expanded."""
    keys = set()
    for name in re.findall(r'``"([a-z_.{},]+)"``', torch.cuda.host_memory_stats.__doc__):
        if "{" in name:
            head, tail = name.split("{")
            keys.update(head + part for part in tail.rstrip("}").split(","))
        else:
            keys.add(name)
    return keys


def test_stats_have_torch_cudas_keys():
    expected = cuda_documented_keys()
    assert {"allocations.current", "active_bytes.peak", "num_host_alloc", "host_free_time.avg"} <= expected
    assert set(stats()) == expected
    assert list(stats()) == sorted(expected)  # flattened and sorted, as torch.cuda's
    nested = torch.npu.host_memory_stats_as_nested_dict()
    assert set(nested["allocations"]) == {"current", "peak", "allocated", "freed"}
    assert set(nested["host_alloc_time"]) == {"total", "max", "min", "count", "avg"}
    assert all(isinstance(value, int) for value in stats().values())


def test_a_freed_block_is_reused_by_the_next_pin_of_its_size(empty_host_cache):
    before = stats()
    a = torch.empty(1000, pin_memory=True)  # 4000 bytes: a 4096-byte block
    ptr = a.data_ptr()
    after_alloc = stats()
    assert after_alloc["num_host_alloc"] == before["num_host_alloc"] + 1
    assert after_alloc["allocated_bytes.current"] == before["allocated_bytes.current"] + 4096
    assert after_alloc["active_bytes.current"] == before["active_bytes.current"] + 4096
    assert after_alloc["active_requests.current"] == before["active_requests.current"] + 1
    assert after_alloc["host_alloc_time.count"] == before["host_alloc_time.count"] + 1
    del a
    cached = stats()
    assert cached["active_requests.current"] == before["active_requests.current"]  # reusable now
    assert cached["allocations.current"] == after_alloc["allocations.current"]     # still held: cached
    b = torch.ones(1024).pin_memory()  # 4096 bytes: the same bucket
    assert b.data_ptr() == ptr
    assert stats()["num_host_alloc"] == after_alloc["num_host_alloc"]
    assert stats()["active_requests.allocated"] == after_alloc["active_requests.allocated"] + 1
    c = torch.empty(2048, pin_memory=True)  # 8192 bytes: another bucket, a new block
    assert c.data_ptr() != ptr
    assert stats()["num_host_alloc"] == after_alloc["num_host_alloc"] + 1
    assert torch.equal(b, torch.ones(1024))
    del b, c


def test_sizes_round_up_to_a_power_of_two(empty_host_cache):
    before = stats()
    x = torch.empty(3 * (1 << 18), dtype=torch.uint8, pin_memory=True)  # 768 KiB -> 1 MiB
    assert stats()["allocated_bytes.current"] - before["allocated_bytes.current"] == 1 << 20
    ptr = x.data_ptr()
    del x
    y = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)  # 1 MiB: the cached block
    assert y.data_ptr() == ptr and stats()["num_host_alloc"] == before["num_host_alloc"] + 1
    del y


def test_empty_host_cache_gives_cached_blocks_back(empty_host_cache):
    x = torch.empty(1 << 16, pin_memory=True)
    held = torch.empty(1 << 16, pin_memory=True)  # in use: stays
    del x
    before = stats()
    torch.accelerator.empty_host_cache()
    after = stats()
    assert after["allocations.current"] == before["allocations.current"] - 1
    assert after["allocated_bytes.current"] == before["allocated_bytes.current"] - (1 << 18)
    assert after["num_host_free"] == before["num_host_free"] + 1
    assert after["host_free_time.count"] == before["host_free_time.count"] + 1
    assert after["active_requests.current"] == before["active_requests.current"]
    torch.empty(1 << 16, pin_memory=True)  # nothing cached any more: a new block
    assert stats()["num_host_alloc"] == after["num_host_alloc"] + 1
    assert torch.npu.is_available() and held.is_pinned()


def test_reset_peak_and_accumulated_host_memory_stats(empty_host_cache):
    torch.npu.reset_peak_host_memory_stats()
    base = stats()
    blocks = [torch.empty(1 << 14, pin_memory=True) for _ in range(3)]
    assert stats()["active_requests.peak"] == base["active_requests.current"] + 3
    del blocks
    assert stats()["active_requests.peak"] == base["active_requests.current"] + 3
    torch.npu.reset_peak_host_memory_stats()
    s = stats()
    assert s["active_requests.peak"] == s["active_requests.current"] == base["active_requests.current"]
    assert s["allocations.peak"] == s["allocations.current"]
    assert s["host_alloc_time.max"] == 0 and s["host_alloc_time.min"] == 0
    assert s["num_host_alloc"] >= 3 and s["host_alloc_time.count"] >= 3

    torch.npu.reset_accumulated_host_memory_stats()
    s = stats()
    assert s["num_host_alloc"] == s["num_host_free"] == 0
    assert s["allocations.allocated"] == s["allocations.freed"] == 0
    assert s["active_requests.allocated"] == s["active_bytes.freed"] == 0
    assert s["host_alloc_time.count"] == s["host_alloc_time.total"] == 0
    assert s["allocations.current"] == base["allocations.current"] + 3  # current values stay
    again = torch.empty(1 << 14, pin_memory=True)  # from the cache
    assert stats()["num_host_alloc"] == 0 and stats()["active_requests.allocated"] == 1
    del again


def test_transfer_to_npu_gives_torch_cuda_the_host_stats(run_python):
    out = child_json(run_python, r"""
import torch_npu.contrib.transfer_to_npu
x = torch.ones(4).pin_memory()
torch.cuda.reset_peak_host_memory_stats()
torch.cuda.reset_accumulated_host_memory_stats()
y = torch.ones(8).pin_memory()
print(json.dumps({"same": torch.cuda.host_memory_stats() == torch.npu.host_memory_stats(),
                  "alloc": torch.cuda.host_memory_stats()["num_host_alloc"],
                  "nested": torch.cuda.host_memory_stats_as_nested_dict()["allocations"]["current"]}))
""", env=None)
    assert out == {"same": True, "alloc": 1, "nested": 2}


# ---- blocks that queued copies still use -------------------------------------------------

def test_no_reuse_while_a_queued_copy_reads_the_block(run_python):
    out = child_json(run_python, r"""
n = 1 << 16
src = torch.full((n,), 1.0).pin_memory()
ptr = src.data_ptr()
dst = torch.empty(n, device="npu")
torch.npu._sleep(300)                 # the stream is busy: the copy below is queued
dst.copy_(src, non_blocking=True)
del src                               # freed while its copy is queued
pending = torch.npu.host_memory_stats()
again = torch.full((n,), 2.0).pin_memory()   # same size: must not get the queued block
again_ptr = again.data_ptr()
after_again = torch.npu.host_memory_stats()
torch.npu.synchronize()
ok = bool((dst.cpu() == 1).all())     # the copy read the 1s, not the 2s written over a reused block
del again
third = torch.empty(n).pin_memory()   # both blocks are cached now: no new one
final = torch.npu.host_memory_stats()
print(json.dumps({"reused_while_queued": again_ptr == ptr, "ok": ok,
                  "pending_active": pending["active_requests.current"],
                  "allocs": [pending["num_host_alloc"], after_again["num_host_alloc"], final["num_host_alloc"]],
                  "third_reuses": third.data_ptr() in (ptr, again_ptr),
                  "final_active": final["active_requests.current"]}))
""")
    assert not out["reused_while_queued"], out
    assert out["ok"], out
    assert out["pending_active"] == 1, out        # not reusable while the copy is queued (CUDA's meaning)
    assert out["allocs"] == [1, 2, 2], out
    assert out["third_reuses"] and out["final_active"] == 1, out


def test_no_reuse_while_a_queued_copy_writes_the_block(run_python):
    out = child_json(run_python, r"""
n = 1 << 16
x = torch.full((n,), 7.0, device="npu")
out = torch.empty(n, pin_memory=True)
ptr = out.data_ptr()
torch.npu._sleep(300)
out.copy_(x, non_blocking=True)        # npu -> pinned, queued
del out
fresh = torch.zeros(n, pin_memory=True)
torch.npu.synchronize()
print(json.dumps({"reused": fresh.data_ptr() == ptr, "untouched": bool((fresh == 0).all())}))
""")
    assert out == {"reused": False, "untouched": True}


def test_empty_host_cache_keeps_a_block_whose_copy_is_queued(run_python):
    out = child_json(run_python, r"""
n = 1 << 16
src = torch.full((n,), 3.0).pin_memory()
dst = torch.empty(n, device="npu")
torch.npu._sleep(300)
dst.copy_(src, non_blocking=True)
del src
torch.accelerator.empty_host_cache()   # the block is still read: kept
kept = torch.npu.host_memory_stats()["allocations.current"]
torch.npu.synchronize()
ok = bool((dst.cpu() == 3).all())
torch.accelerator.empty_host_cache()   # its copy ran: given back
s = torch.npu.host_memory_stats()
print(json.dumps({"kept": kept, "ok": ok, "after": s["allocations.current"], "freed": s["num_host_free"]}))
""")
    assert out == {"kept": 1, "ok": True, "after": 0, "freed": 1}


def test_a_pin_memory_loop_allocates_once(run_python):
    """A DataLoader's pin_memory pattern: the same size pinned, copied and freed each step."""
    out = child_json(run_python, r"""
batch = torch.randn(64, 1024)
dst = torch.empty(64, 1024, device="npu")
total = torch.zeros((), device="npu")
for _ in range(50):
    pinned = batch.pin_memory()
    dst.copy_(pinned, non_blocking=True)
    total += dst.sum()
    del pinned
    torch.npu.current_stream().synchronize()  # the step ends (a loss read): its copy has run
torch.npu.synchronize()
s = torch.npu.host_memory_stats()
print(json.dumps({"allocs": s["num_host_alloc"], "handed_out": s["active_requests.allocated"],
                  "ok": abs(total.item() - 50 * batch.sum().item()) < 1e-1 * 50}))
""")
    # Each step frees its block while its copy may be queued: a few blocks take turns (1 or 2 here).
    # (Without the step's end the host may run any number of steps ahead of the stream, each
    # with a block of its own, as with CUDA's caching host allocator.)
    assert out["allocs"] <= 4 and out["handed_out"] == 50 and out["ok"], out
