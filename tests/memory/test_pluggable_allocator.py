"""torch.npu.memory.NPUPluggableAllocator: npu memory from a user's shared library.

The library below counts its calls and the bytes it holds, so each test checks
that the npu's memory really came from it and went back to it, and that results
computed in that memory equal the cpu's.
"""
import shutil
import subprocess

import pytest
import torch

from helpers import last_line, run_python

LIBRARY = r"""
#include <stdlib.h>
#include <sys/types.h>
long allocs = 0, frees = 0, held = 0;
void* counting_alloc(ssize_t size, int device, void* stream) {
  (void)device; (void)stream;
  size_t rounded = ((size_t)size + 4095) / 4096 * 4096;
  void* p = aligned_alloc(4096, rounded);
  if (p) { allocs++; held += size; }
  return p;
}
void counting_free(void* ptr, ssize_t size, int device, void* stream) {
  (void)device; (void)stream;
  free(ptr); frees++; held -= size;
}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the test allocator library")
    folder = tmp_path_factory.mktemp("allocator")
    (folder / "counting.c").write_text(LIBRARY)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(folder / "libcounting.so"),
                    str(folder / "counting.c")], check=True)
    return str(folder / "libcounting.so")


def counters(allocator):
    import ctypes
    lib = allocator._library
    return tuple(ctypes.c_long.in_dll(lib, name).value for name in ("allocs", "frees", "held"))


def test_a_mem_pool_takes_its_segments_from_the_library(library):
    allocator = torch.npu.memory.NPUPluggableAllocator(library, "counting_alloc", "counting_free")
    pool = torch.npu.MemPool(allocator.allocator())
    a = torch.randn(64, 64)
    with torch.npu.use_mem_pool(pool):
        x = a.npu()
        y = (x @ x).relu()
    allocs, _, held = counters(allocator)
    assert allocs >= 1 and held > 0
    assert torch.equal(y.cpu(), (a @ a).relu())
    segments = pool.snapshot()
    assert sum(s["total_size"] for s in segments) == held  # every segment of the pool is the library's
    del x, y
    torch.npu.synchronize()
    del pool
    import gc
    gc.collect()
    allocs, frees, held = counters(allocator)
    assert frees == allocs and held == 0  # the pool's segments went back to the library


def test_memory_of_a_pluggable_allocator_is_not_sent_to_another_process(library):
    from multiprocessing.reduction import ForkingPickler
    allocator = torch.npu.memory.NPUPluggableAllocator(library, "counting_alloc", "counting_free")
    pool = torch.npu.MemPool(allocator.allocator())
    with torch.npu.use_mem_pool(pool):
        x = torch.ones(16, device="npu")
    with pytest.raises(RuntimeError, match=r"came from a pluggable allocator .* send tensor.cpu\(\)"):
        ForkingPickler.dumps(x)
    ForkingPickler.dumps(torch.ones(16, device="npu"))  # the device's memory still goes
    del x, pool


def test_change_current_allocator_serves_every_allocation(library):
    out = run_python(f"""
        import ctypes, torch
        a = torch.nn.Linear(16, 8)
        x = torch.randn(4, 16)
        allocator = torch.npu.memory.NPUPluggableAllocator({library!r}, "counting_alloc", "counting_free")
        torch.npu.memory.change_current_allocator(allocator)
        assert torch.npu.memory._get_current_allocator() is allocator
        lib = allocator._library
        count = lambda name: ctypes.c_long.in_dll(lib, name).value
        m = torch.nn.Linear(16, 8)
        m.load_state_dict(a.state_dict())
        m = m.npu()
        loss = m(x.npu()).square().sum()
        loss.backward()
        expected = a(x).square().sum()
        expected.backward()
        assert torch.allclose(loss.cpu(), expected, rtol=1e-5)
        assert torch.allclose(m.weight.grad.cpu(), a.weight.grad, rtol=1e-5, atol=1e-6)
        assert count("allocs") >= 4
        torch.npu.synchronize()
        torch.empty(1, device="npu")  # frees whose work had not run yet go back now
        held = count("held")
        assert held == torch.npu.memory_reserved(), (held, torch.npu.memory_reserved())
        big = torch.ones(1 << 20, dtype=torch.uint8, device="npu")
        assert count("held") == held + (1 << 20)
        torch.npu.synchronize()
        frees = count("frees")
        del big  # uncached: it goes back to the library once its work has run
        torch.zeros(1, device="npu")
        assert count("frees") > frees and count("held") <= held + 512
        try:
            torch.npu.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            print("second:", "already" in str(e))
    """)
    assert last_line(out) == "second: True"


def test_the_allocator_must_come_before_the_first_tensor(library):
    out = run_python(f"""
        import torch
        torch.ones(1, device="npu")
        allocator = torch.npu.memory.NPUPluggableAllocator({library!r}, "counting_alloc", "counting_free")
        try:
            torch.npu.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            print("refused:", "before the first npu tensor" in str(e))
    """)
    assert last_line(out) == "refused: True"


def test_bad_libraries_and_arguments_are_refused(library):
    with pytest.raises(AttributeError, match="has no function 'nope'"):
        torch.npu.memory.NPUPluggableAllocator(library, "nope", "counting_free")
    with pytest.raises(TypeError, match="expected an NPUPluggableAllocator"):
        torch.npu.memory.change_current_allocator(object())
    with pytest.raises(TypeError, match="allocator must be an NPUPluggableAllocator"):
        torch.npu.MemPool(allocator="malloc")
