"""The caching allocator's fast path: the last free of a small block is parked, not
returned to its pool, and a request of the same stream and rounded size takes it
back when the pools would have given exactly that block.

Everything that reads the pools (memory_stats, snapshots, empty_cache, the
out-of-memory retry) first returns the parked block, so each test compares a run
that reads the statistics after every step (the parked block is returned at once,
as before the fast path) with one that reads them only at the end.
"""
import json
import random
import threading

import pytest
import torch

from helpers import MiB, last_line, run_python

pytestmark = pytest.mark.usefixtures("clean_npu")


def nothing_allocated():
    s = torch.npu.memory_stats()
    assert s["allocated_bytes.all.current"] == 0, "npu tensors of an earlier test are still alive"
    assert s["segment.all.current"] == 0, "empty_cache() kept a segment with no tensor in it"


def fresh_start():
    torch.npu.synchronize()
    torch.npu.empty_cache()
    nothing_allocated()
    torch.npu.reset_accumulated_memory_stats()
    torch.npu.reset_peak_memory_stats()


def tiny_sequence(observe, seed=0):
    """Tiny ops and allocations of mixed sizes, some kept for a while, within one 2 MiB
    segment. Returns the offsets of every result from the first one's address."""
    rng = random.Random(seed)
    x = torch.arange(16, dtype=torch.float32, device="npu")
    base = x.data_ptr()
    offsets, kept = [], []
    seen = []

    def step(t):
        offsets.append(t.data_ptr() - base)
        if observe:
            seen.append(torch.npu.memory_stats()["inactive_split.all.current"])
        return t

    for i in range(300):
        choice = rng.randrange(6)
        if choice == 0:
            step(x + x)  # freed at once: the next request of its size takes it back
        elif choice == 1:
            y = step(x * 2)
            step(y.exp())
            del y
        elif choice == 2:
            step(torch.empty(rng.choice([1, 100, 128, 129, 1000, 3000]), device="npu"))
        elif choice == 3:
            kept.append(step(torch.empty(rng.choice([16, 128, 700]), device="npu")))
        elif choice == 4 and kept:
            kept.pop(rng.randrange(len(kept)))
        else:
            step(x.sum())
        if observe:
            seen.append(torch.npu.memory_stats()["active.all.current"])
    del kept, x
    return offsets


def test_tiny_sequence_keeps_every_counter_and_address():
    fresh_start()
    observed_offsets = tiny_sequence(observe=True)
    torch.npu.synchronize()
    observed = torch.npu.memory_stats()
    fresh_start()
    fast_offsets = tiny_sequence(observe=False)
    torch.npu.synchronize()
    fast = torch.npu.memory_stats()
    assert fast_offsets == observed_offsets  # the same blocks, in the same order
    assert observed["segment.all.peak"] == 1 and observed["num_device_alloc"] == 1
    differing = {k: (observed[k], fast[k]) for k in observed if observed[k] != fast[k]}
    assert not differing, f"counters that differ (observed each step, read at the end): {differing}"


def test_tiny_loop_counters_by_hand():
    fresh_start()
    x = torch.ones(16, device="npu")  # 512 bytes: the segment's first block
    for _ in range(100):
        x + x  # 512 bytes split from the rest of the segment, freed, merged back
    s = torch.npu.memory_stats()
    assert s["allocation.all.current"] == 1 and s["allocation.all.allocated"] == 101
    assert s["allocation.all.freed"] == 100 and s["allocation.all.peak"] == 2
    assert s["active.all.current"] == 1 and s["active.all.allocated"] == 101 and s["active.all.freed"] == 100
    assert s["allocated_bytes.all.current"] == 512 and s["allocated_bytes.all.allocated"] == 101 * 512
    assert s["requested_bytes.all.current"] == 64 and s["requested_bytes.all.allocated"] == 101 * 64
    assert s["reserved_bytes.all.current"] == 2 * MiB and s["segment.all.current"] == 1
    # the rest of the segment: split off at each allocation, merged back at each free
    assert s["inactive_split.all.current"] == 1 and s["inactive_split.all.peak"] == 1
    assert s["inactive_split_bytes.all.current"] == 2 * MiB - 512
    assert s["inactive_split_bytes.all.peak"] == 2 * MiB - 512
    assert s["inactive_split.all.allocated"] == 201 and s["inactive_split.all.freed"] == 200
    assert s["num_device_alloc"] == 1 and s["num_alloc_retries"] == 0
    del x


def test_reused_block_is_the_one_freed():
    fresh_start()
    x = torch.ones(16, device="npu")
    ptr = (x + x).data_ptr()
    assert (x + x).data_ptr() == ptr
    y = x + x  # kept: the next one gets the block after it
    assert (x + x).data_ptr() == y.data_ptr() + 512
    del x, y


def test_empty_cache_releases_a_parked_block():
    fresh_start()
    x = torch.ones(16, device="npu")
    del x  # parked: the segment is not whole until it goes back to the pool
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() == 0
    s = torch.npu.memory_stats()
    assert s["segment.all.current"] == 0 and s["num_device_free"] == 1


def test_snapshot_lists_a_parked_block_as_inactive():
    fresh_start()
    a = torch.ones(16, device="npu")
    b = torch.ones(16, device="npu")
    ptr = a.data_ptr()
    del a  # parked; b keeps it from merging with the rest of the segment
    (segment,) = torch.npu.memory_snapshot()
    blocks = {block["address"]: block for block in segment["blocks"]}
    assert blocks[ptr]["state"] == "inactive" and blocks[ptr]["size"] == 512
    assert blocks[b.data_ptr()]["state"] == "active_allocated"
    assert segment["allocated_size"] == 512 and segment["active_size"] == 512
    assert torch.npu.memory_stats()["inactive_split.all.current"] == 2
    del b


def test_stats_see_a_parked_block_returned():
    fresh_start()
    a = torch.ones(16, device="npu")
    b = torch.ones(16, device="npu")
    del a
    s = torch.npu.memory_stats()
    assert s["active.all.current"] == 1 and s["active_bytes.all.current"] == 512
    assert s["inactive_split.all.current"] == 2 and s["inactive_split_bytes.all.current"] == 2 * MiB - 512
    del b
    s = torch.npu.memory_stats()
    assert s["active.all.current"] == 0 and s["inactive_split.all.current"] == 0


def test_parked_block_is_not_given_to_another_stream():
    fresh_start()
    x = torch.ones(16, device="npu")
    ptr = x.data_ptr()
    del x
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        y = torch.ones(16, device="npu")
    assert y.data_ptr() != ptr
    z = torch.ones(16, device="npu")
    assert z.data_ptr() == ptr
    del y, z


def test_record_stream_waits_for_the_other_streams_work():
    # x is filled on a busy side stream and recorded there; its block must not come back
    # (the fast path included) before that fill ran, or the fill would overwrite y.
    fresh_start()
    side = torch.npu.Stream()
    x = torch.zeros(256, device="npu")
    torch.npu.synchronize()
    ptr = x.data_ptr()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        torch.npu._sleep(100)
        x.fill_(2.0)
    x.record_stream(side)
    del x
    y = torch.empty(256, device="npu")
    busy = not side.query()
    y.fill_(1.0)
    side.synchronize()
    if busy:
        assert y.data_ptr() != ptr
    assert torch.equal(y.cpu(), torch.ones(256))
    del y
    z = torch.empty(256, device="npu")  # side is done: the block is free again
    assert z.data_ptr() == ptr
    del z


def test_capture_does_not_take_a_parked_block():
    fresh_start()
    a = torch.ones(16, device="npu")
    x = torch.ones(16, device="npu")
    ptr = x.data_ptr()
    del x  # parked in the general pool
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        out = a + a
    assert out.data_ptr() != ptr  # from the graph's private pool
    g.replay()
    torch.npu.synchronize()
    assert torch.equal(out.cpu(), torch.full((16,), 2.0))
    del out, g, a


def test_threads_allocating_tiny_tensors():
    fresh_start()
    errors = []

    def work(seed):
        try:
            s = torch.npu.Stream() if seed % 2 else torch.npu.current_stream()
            with torch.npu.stream(s):
                x = torch.full((16,), float(seed), device="npu")
                for i in range(300):
                    y = x + i
                    if i % 50 == 0 and not torch.equal(y.cpu(), torch.full((16,), float(seed + i))):
                        errors.append((seed, i))
                s.synchronize()
        except Exception as error:  # noqa: BLE001
            errors.append(repr(error))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    torch.npu.synchronize()
    s = torch.npu.memory_stats()
    assert s["allocated_bytes.all.current"] == 0 and s["active.all.current"] == 0
    assert s["allocation.all.allocated"] == s["allocation.all.freed"]
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() == 0


OOM_AFTER_PARKED = r"""
import json, torch
MiB = 1 << 20
x = torch.ones(16, device="npu")  # a 2 MiB segment of the small pool
del x                             # parked: the segment is whole only once it is returned
reserved = torch.npu.memory_reserved()
big = torch.empty(63 * MiB, dtype=torch.uint8, device="npu")  # a 64 MiB segment: needs the 2 MiB back
s = torch.npu.memory_stats()
print(json.dumps({"reserved_before": reserved, "reserved": torch.npu.memory_reserved(),
                  "retries": s["num_alloc_retries"], "ooms": s["num_ooms"]}))
"""


def test_out_of_memory_retry_returns_the_parked_block():
    proc = run_python(OOM_AFTER_PARKED, env={"NPU_EMU_MEMORY": "64MiB", "NPU_EMU_DEVICES": "1"})
    r = json.loads(last_line(proc))
    assert r["reserved_before"] == 2 * MiB
    assert r["retries"] == 1 and r["ooms"] == 0
    assert r["reserved"] == 64 * MiB
