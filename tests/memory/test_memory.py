"""The caching allocator: rounding, pools, reuse, statistics, record_stream, OOM.

Expected numbers are computed by hand from the allocator's documented rules:
every size rounds up to 512 bytes; requests up to 1 MiB come from 2 MiB segments
(the small pool); requests under 10 MiB share 20 MiB segments; larger ones get a
segment of their own, rounded up to 2 MiB.
"""
import json

import pytest
import torch

from conftest import scenario_result
from helpers import KiB, MiB, last_line, run_python

pytestmark = pytest.mark.usefixtures("clean_npu")


def stats():
    return torch.npu.memory_stats()


def nothing_allocated(pool="all"):
    """Precondition of exact segment counts: no npu tensor is alive (so no segment is split)."""
    current = stats()[f"allocated_bytes.{pool}.current"]
    assert current == 0, f"{current} bytes of npu tensors are still alive ({pool}): a leak in an earlier test?"
    assert stats()[f"segment.{pool}.current"] == 0, "empty_cache() kept a segment with no tensor in it"


def alloc(nbytes, device="npu"):
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


# ---- rounding and pools ---------------------------------------------------------------

def test_float32_1000_elements_takes_4096_bytes():
    before = torch.npu.memory_allocated()
    x = torch.empty(1000, dtype=torch.float32, device="npu")  # 4000 B
    assert torch.npu.memory_allocated() - before == 4096
    del x
    assert torch.npu.memory_allocated() == before


@pytest.mark.parametrize("nbytes,expected", [
    (1, 512), (511, 512), (512, 512), (513, 1024), (4000, 4096), (100 * KiB + 1, 100 * KiB + 512),
    (1 * MiB, 1 * MiB),
])
def test_sizes_round_up_to_512_bytes(nbytes, expected):
    before = stats()
    x = alloc(nbytes)
    after = stats()
    assert after["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] == expected
    assert after["requested_bytes.all.current"] - before["requested_bytes.all.current"] == nbytes
    assert after["allocation.all.current"] - before["allocation.all.current"] == 1
    del x


def test_empty_tensor_allocates_nothing():
    before = torch.npu.memory_allocated()
    x = torch.empty(0, device="npu")
    assert torch.npu.memory_allocated() == before
    del x


def test_small_allocations_share_a_2mib_segment():
    nothing_allocated()
    x = alloc(4000)
    s = stats()
    assert torch.npu.memory_reserved() == 2 * MiB
    assert s["segment.small_pool.current"] == 1 and s["segment.large_pool.current"] == 0
    assert s["reserved_bytes.small_pool.current"] == 2097152
    y = alloc(100 * KiB)
    z = alloc(1 * MiB)  # the largest small request: fits in what is left of the segment
    assert torch.npu.memory_reserved() == 2 * MiB
    assert stats()["segment.small_pool.current"] == 1
    assert torch.npu.memory_allocated() == 4096 + 100 * KiB + 1 * MiB
    w = alloc(1 * MiB)  # no longer fits: a second 2 MiB segment
    assert torch.npu.memory_reserved() == 4 * MiB
    assert stats()["segment.small_pool.current"] == 2
    del x, y, z, w


def test_medium_allocations_share_a_20mib_segment():
    nothing_allocated()
    x = alloc(1 * MiB + 1)  # just over the small limit: large pool
    s = stats()
    assert torch.npu.memory_reserved() == 20 * MiB
    assert s["segment.large_pool.current"] == 1 and s["segment.small_pool.current"] == 0
    assert s["allocated_bytes.large_pool.current"] == 1 * MiB + 512
    y = alloc(5 * MiB)
    z = alloc(9 * MiB)
    assert torch.npu.memory_reserved() == 20 * MiB
    assert torch.npu.memory_allocated() == 1 * MiB + 512 + 14 * MiB
    w = alloc(8 * MiB)  # 5 MiB - 512 B are left: a second 20 MiB segment
    assert torch.npu.memory_reserved() == 40 * MiB
    del x, y, z, w


@pytest.mark.parametrize("nbytes,segment", [
    (10 * MiB, 10 * MiB),
    (11 * MiB, 12 * MiB),
    (25 * MiB + 1, 26 * MiB),
    (64 * MiB, 64 * MiB),
])
def test_large_allocations_get_own_segment_rounded_to_2mib(nbytes, segment):
    nothing_allocated()
    x = alloc(nbytes)
    assert torch.npu.memory_reserved() == segment
    assert stats()["segment.large_pool.current"] == 1
    assert torch.npu.memory_allocated() >= nbytes
    del x


def test_second_device_has_its_own_statistics():
    nothing_allocated()
    before0 = torch.npu.memory_allocated(0)
    before1 = torch.npu.memory_allocated(1)
    x = torch.empty(1000, dtype=torch.float32, device="npu:1")
    assert torch.npu.memory_allocated(1) - before1 == 4096
    assert torch.npu.memory_allocated(0) == before0
    assert torch.npu.memory_reserved(1) >= 2 * MiB
    del x


# ---- reuse ----------------------------------------------------------------------

@pytest.mark.parametrize("nbytes", [4000, 3 * MiB, 30 * MiB], ids=["small", "large", "huge"])
def test_free_then_same_size_reuses_the_block(nbytes):
    x = alloc(nbytes)
    ptr = x.data_ptr()
    reserved = torch.npu.memory_reserved()
    allocs = stats()["num_device_alloc"]
    del x
    assert torch.npu.memory_reserved() == reserved  # cached, not given back
    y = alloc(nbytes)
    assert y.data_ptr() == ptr
    assert torch.npu.memory_reserved() == reserved
    assert stats()["num_device_alloc"] == allocs
    del y


def test_blocks_split_and_merge():
    nothing_allocated()
    a = alloc(512)
    b = alloc(512)
    c = alloc(512)
    assert b.data_ptr() == a.data_ptr() + 512 and c.data_ptr() == b.data_ptr() + 512
    ptr_a = a.data_ptr()
    del a, b, c  # the three blocks merge back into the whole segment
    assert stats()["inactive_split.all.current"] == 0
    d = alloc(1536)
    assert d.data_ptr() == ptr_a
    del d


def test_block_freed_on_one_stream_is_not_given_to_another():
    x = alloc(4000)
    ptr = x.data_ptr()
    del x
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        y = alloc(4000)
    assert y.data_ptr() != ptr  # the cached block belongs to the default stream
    z = alloc(4000)
    assert z.data_ptr() == ptr
    del y, z


def test_record_stream_keeps_block_until_stream_done_in_process():
    s = torch.npu.Stream()
    x = alloc(4000)
    ptr = x.data_ptr()
    x.record_stream(s)
    del x
    s.synchronize()  # s has no queued work: the block is free at the next allocation
    y = alloc(4000)
    assert y.data_ptr() == ptr
    del y


def test_record_stream_delays_reuse(async_results):
    # Runs in the always-enqueue child (conftest.async_results): x is allocated on
    # the default stream, record_stream(side) while side sleeps 200 ms, then freed.
    r = scenario_result(async_results, "record_stream_delays_reuse")
    assert r["busy"]
    assert not r["reused_while_busy"], "a block was reused while a recorded stream still used it"
    assert r["reused_after"], "the block did not come back after the recorded stream finished"
    assert r["reused_without_record"]


# ---- peaks, statistics, summary ---------------------------------------------------------

def test_max_memory_allocated_tracks_peak_and_resets():
    torch.npu.reset_peak_memory_stats()
    base = torch.npu.memory_allocated()
    assert torch.npu.max_memory_allocated() == base
    a = alloc(4 * MiB)
    b = alloc(4 * MiB)
    del a
    c = alloc(1 * MiB)
    assert torch.npu.max_memory_allocated() == base + 8 * MiB
    del b, c
    assert torch.npu.memory_allocated() == base
    assert torch.npu.max_memory_allocated() == base + 8 * MiB
    assert torch.npu.max_memory_reserved() >= torch.npu.memory_reserved()
    torch.npu.reset_peak_memory_stats()
    assert torch.npu.max_memory_allocated() == base
    assert torch.npu.max_memory_reserved() == torch.npu.memory_reserved()
    torch.npu.reset_max_memory_allocated()
    assert torch.npu.max_memory_allocated() == base


def test_memory_stats_keys_and_consistency():
    x = alloc(4000)
    y = alloc(3 * MiB)
    s = torch.npu.memory_stats()
    for key in ["allocated_bytes.all.current", "reserved_bytes.all.peak", "num_ooms",
                "active_bytes.small_pool.current", "segment.large_pool.current",
                "allocation.all.current", "requested_bytes.all.current", "inactive_split_bytes.all.current",
                "num_alloc_retries", "allocated_bytes.all.allocated", "allocated_bytes.all.freed"]:
        assert key in s, key
    assert s["allocated_bytes.all.current"] == torch.npu.memory_allocated()
    assert s["reserved_bytes.all.current"] == torch.npu.memory_reserved()
    for stat in ["allocated_bytes", "reserved_bytes", "active_bytes", "segment", "allocation"]:
        assert s[f"{stat}.all.current"] == s[f"{stat}.small_pool.current"] + s[f"{stat}.large_pool.current"]
    assert s["allocated_bytes.small_pool.current"] >= 4096
    assert s["allocated_bytes.large_pool.current"] >= 3 * MiB
    assert s["active_bytes.all.current"] >= s["allocated_bytes.all.current"]
    assert s["num_ooms"] == 0
    del x, y


def test_memory_stats_accumulated_counters():
    torch.npu.reset_accumulated_memory_stats()
    x = alloc(4000)
    del x
    s = stats()
    assert s["allocation.all.allocated"] == 1 and s["allocation.all.freed"] == 1
    assert s["allocated_bytes.all.allocated"] == 4096 and s["allocated_bytes.all.freed"] == 4096
    assert s["requested_bytes.all.allocated"] == 4000


def test_memory_summary():
    x = alloc(4000)
    text = torch.npu.memory_summary()
    assert isinstance(text, str)
    assert "Allocated memory" in text
    assert "NPU reserved memory" in text
    assert "device ID 0" in text
    assert "4.00 KiB" in text  # the current allocated memory
    del x


def test_empty_cache_returns_reserved_memory():
    nothing_allocated()
    free_before = torch.npu.mem_get_info()[0]
    x = alloc(5 * MiB)
    y = alloc(4000)
    del x, y
    assert torch.npu.memory_reserved() == 22 * MiB  # cached: a 20 MiB and a 2 MiB segment
    assert torch.npu.mem_get_info()[0] == free_before - 22 * MiB
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() == 0
    assert torch.npu.mem_get_info()[0] == free_before
    assert stats()["segment.all.current"] == 0


def test_empty_cache_keeps_segments_in_use():
    nothing_allocated()
    x = alloc(4000)
    y = alloc(5 * MiB)
    del y
    torch.npu.empty_cache()
    # the large segment had no tensor left and went back; the small one is in use.
    assert torch.npu.memory_reserved() == 2 * MiB
    assert torch.npu.memory_allocated() == 4096
    del x


# ---- out of memory: a child with a 64 MiB device ----------------------------------------

OOM_SCRIPT = r"""
import json, torch
MiB = 1 << 20
out = {}

# 1. Cached blocks are released and the allocation retried before any OOM.
a = torch.empty(40 * MiB, dtype=torch.uint8, device="npu")
del a
out["cached_before_retry"] = torch.npu.memory_reserved()
b = torch.empty(50 * MiB, dtype=torch.uint8, device="npu")  # 40 cached + 50 > 64
s = torch.npu.memory_stats()
out["retry"] = {"ok": True, "num_alloc_retries": s["num_alloc_retries"], "num_ooms": s["num_ooms"],
                "reserved": torch.npu.memory_reserved()}
del b
torch.npu.empty_cache()

# 2. A request past the capacity raises torch.OutOfMemoryError with the summary.
try:
    torch.empty(100 * MiB, dtype=torch.uint8, device="npu")
    out["oom"] = None
except torch.OutOfMemoryError as error:
    out["oom"] = {"message": str(error), "is_runtime_error": isinstance(error, RuntimeError),
                  "num_ooms": torch.npu.memory_stats()["num_ooms"]}

# 3. Filling the device, failing, freeing, recovering.
held = [torch.empty(20 * MiB, dtype=torch.uint8, device="npu") for _ in range(3)]  # 60 MiB
try:
    torch.empty(20 * MiB, dtype=torch.uint8, device="npu")
    out["full"] = "allocated"
except torch.OutOfMemoryError:
    out["full"] = "oom"
del held[:2]
x = torch.empty(30 * MiB, dtype=torch.uint8, device="npu")
x.fill_(7)
out["recovered"] = {"value": int(x[-1].item()), "num_ooms": torch.npu.memory_stats()["num_ooms"],
                    "allocated": torch.npu.memory_allocated()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def oom_results():
    proc = run_python(OOM_SCRIPT, env={"NPU_EMU_MEMORY": "64MiB", "NPU_EMU_DEVICES": "1"})
    return json.loads(last_line(proc))


def test_oom_retry_releases_cached_blocks(oom_results):
    assert oom_results["cached_before_retry"] == 40 * MiB
    retry = oom_results["retry"]
    assert retry["ok"]
    assert retry["num_alloc_retries"] >= 1
    assert retry["num_ooms"] == 0
    assert retry["reserved"] == 50 * MiB


def test_oom_error_message(oom_results):
    oom = oom_results["oom"]
    assert oom is not None, "allocating 100 MiB on a 64 MiB device did not raise"
    message = oom["message"]
    assert oom["is_runtime_error"]
    assert "NPU out of memory" in message
    assert "100.00 MiB" in message  # what was asked for
    assert "64.00 MiB" in message  # the capacity
    assert "NPU_EMU_MEMORY" in message
    assert "Allocated memory" in message and "NPU reserved memory" in message  # the summary table
    assert oom["num_ooms"] == 1


def test_oom_recovery_after_freeing(oom_results):
    assert oom_results["full"] == "oom"
    recovered = oom_results["recovered"]
    assert recovered["value"] == 7
    assert recovered["num_ooms"] == 2  # the 100 MiB request and the one on a full device
    assert recovered["allocated"] == 50 * MiB  # 20 MiB still held + 30 MiB


def test_record_stream_with_stream_of_other_device():
    if torch.npu.device_count() < 2:
        pytest.skip("needs two devices")
    proc = run_python(
        """
        import torch
        s = torch.npu.Stream(device=1)
        x = torch.ones(10, device="npu:0")
        try:
            x.record_stream(s)
        except RuntimeError:
            pass  # rejecting a stream of another device is fine too
        del x
        y = torch.ones(10, device="npu:0")
        print("ok", y.cpu().tolist() == [1.0] * 10)
        """,
        check=False,
    )
    assert proc.returncode == 0, f"the process died (rc={proc.returncode}): {proc.stderr[-300:]}"
    assert last_line(proc) == "ok True"
