"""torch.npu has every name of torch.cuda that means something on any accelerator, with
torch.cuda's meaning. The names come from the installed wheel (torch.cuda.__all__ and its
submodules'), so a name a future torch adds fails here until it is classified: provided,
or CUDA-only (with why), or not yet (with why; the README lists these)."""
import inspect

import pytest
import torch

import torch_npu  # noqa: F401
from helpers import run_python

SUBMODULES = ("memory", "streams", "random", "graphs")

# torch.cuda's names that are about CUDA itself, or legacy that PyTorch deprecates.
CUDA_ONLY = {
    **dict.fromkeys(("cudart", "cudaStatus", "CudaError", "check_error", "DeferredCudaCallError"),
                    "the CUDA runtime's own API and error codes"),
    **dict.fromkeys(("get_arch_list", "get_gencode_flags"), "the SM architectures the CUDA kernels were built for"),
    **dict.fromkeys(("current_blas_handle", "current_solver_handle"), "cuBLAS and cuSOLVER handles"),
    "has_magma": "the MAGMA library for CUDA",
    "jiterator": "NVRTC-compiled elementwise kernels",
    "nccl": "NVIDIA's collectives library (the npu's collectives are torch.distributed's 'hccl')",
    "nvtx": "NVIDIA's tracing annotations (torch_npu.profiler records ranges)",
    "profiler": "cudaProfilerStart/Stop for nvprof",
    "tunable": "TunableOp, which tunes cuBLAS and hipBLASLt GEMMs",
    "GreenContext": "CUDA green contexts (SM partitions)",
    "sparse": "the legacy torch.cuda.sparse tensor types",
    **dict.fromkeys(("BFloat16Storage", "BoolStorage", "ByteStorage", "CharStorage", "ComplexDoubleStorage",
                     "ComplexFloatStorage", "DoubleStorage", "FloatStorage", "HalfStorage", "IntStorage",
                     "LongStorage", "ShortStorage"),
                    "typed storages, which PyTorch deprecates (tensor.untyped_storage() works on the npu)"),
}
# Meaningful on any accelerator, not on the npu yet.
NOT_YET = {
}
# torch.cuda's name -> torch.npu's, where the name says CUDA.
RENAMED = {"CUDAGraph": "NPUGraph", "CUDAPluggableAllocator": "NPUPluggableAllocator"}


def cuda_names():
    names = set(torch.cuda.__all__)
    for sub in SUBMODULES:
        names |= set(getattr(getattr(torch.cuda, sub), "__all__", ()))
    return names


def test_every_torch_cuda_name_is_classified():
    unclassified = sorted(n for n in cuda_names()
                          if n not in CUDA_ONLY and n not in NOT_YET and not hasattr(torch.npu, RENAMED.get(n, n)))
    assert not unclassified, f"torch.cuda names the npu lacks and that are not classified: {unclassified}"
    stale = sorted(n for n in NOT_YET if hasattr(torch.npu, n))
    assert not stale, f"provided now: take them out of NOT_YET: {stale}"


def test_provided_names_take_torch_cudas_arguments():
    different = []
    for name in sorted(cuda_names() - CUDA_ONLY.keys() - NOT_YET.keys()):
        cuda, npu = getattr(torch.cuda, name), getattr(torch.npu, RENAMED.get(name, name))
        if inspect.isfunction(cuda):
            ours = inspect.signature(npu).parameters
            for param in inspect.signature(cuda).parameters.values():
                if param.name not in ours and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                    different.append(f"{name}({param.name}=...)")
    assert not different, f"torch.npu functions that refuse an argument torch.cuda's take: {different}"


def test_the_readme_lists_what_is_cuda_only_and_not_yet():
    import pathlib
    readme = (pathlib.Path(__file__).resolve().parents[2] / "docs/guide/device-and-tensors.md").read_text()
    missing = [n for n in list(NOT_YET) + ["jiterator", "nccl", "nvtx", "tunable", "cudart"] if f"`{n}`" not in readme]
    assert not missing, missing


def test_the_amp_and_comm_modules_have_torch_cudas_names():
    import torch.cuda.comm
    for cuda_module, npu_module in ((torch.cuda.amp, torch.npu.amp), (torch.cuda.comm, torch.npu.comm)):
        names = getattr(cuda_module, "__all__", None) or [n for n in dir(cuda_module) if not n.startswith("_")
                                                            and callable(getattr(cuda_module, n))]
        missing = [n for n in names if not hasattr(npu_module, n)]
        assert not missing, (cuda_module.__name__, missing)


def test_sync_debug_and_device_information():
    assert torch.npu.get_sync_debug_mode() == 0
    assert torch.npu.has_half and not torch.npu.is_tf32_supported()
    assert torch.npu.utilization() == 0 and torch.npu.memory_usage() == 0         # idle
    busy = run_python("""
        import torch, torch_npu
        torch.npu._sleep(300)                         # queued (NPU_EMU_ALWAYS_ENQUEUE): the device is busy
        print(torch.npu.utilization(), torch.npu.memory_usage())
        torch.npu.synchronize()
        print(torch.npu.utilization())
    """, env={"NPU_EMU_ALWAYS_ENQUEUE": "1"})
    assert busy.stdout.split() == ["100", "100", "0"], busy.stdout
    x = torch.empty(1 << 20, device="npu")
    free, total = torch.npu.mem_get_info()
    assert torch.npu.device_memory_used() == total - free
    assert torch.npu.list_gpu_processes().startswith("NPU:0\nprocess ")
    assert torch.npu.temperature() == 0 and torch.npu.power_draw() == 0
    assert torch.npu.clock_rate() >= 0
    if torch.npu.device_count() > 1:
        assert torch.npu.can_device_access_peer(0, 1)
    assert not torch.npu.can_device_access_peer(0, 0)
    with pytest.raises(RuntimeError, match="invalid device"):
        torch.npu.can_device_access_peer(0, 99)
    del x


def test_legacy_typed_tensors():
    x = torch.npu.FloatTensor(2, 3)
    assert x.device.type == "npu" and x.dtype == torch.float32 and x.shape == (2, 3)
    assert isinstance(x, torch.npu.FloatTensor) and not isinstance(x, torch.npu.DoubleTensor)
    assert not isinstance(torch.ones(2), torch.npu.FloatTensor)                 # a cpu tensor
    assert torch.npu.LongTensor([1, 2]).tolist() == [1, 2]
    assert x.type() == "torch.npu.FloatTensor" and x.type(torch.npu.HalfTensor).dtype == torch.float16
    assert repr(torch.npu.FloatTensor) == "<class 'torch.npu.FloatTensor'>"
    with pytest.raises(ValueError, match="npu device"):
        torch.npu.FloatTensor(2, device="cpu")


def test_stream_handles_and_external_streams():
    s = torch.npu.Stream()
    assert torch.npu.Stream.priority_range() == (0, -1)
    handle = s.npu_stream
    assert isinstance(handle, int) and handle != 0 and handle != torch.npu.default_stream().npu_stream
    wrapped = torch.npu.ExternalStream(handle)
    assert wrapped.stream_id == s.stream_id and wrapped == s
    assert torch.npu.get_stream_from_external(handle) == s
    with torch.npu.stream(wrapped):
        y = torch.ones(4, device="npu") * 2
    s.synchronize()
    assert y.tolist() == [2.0] * 4
    with pytest.raises(ValueError, match="not the handle of a stream"):
        torch.npu.ExternalStream(12345)
    e = torch.npu.Event()
    e.record()
    assert e.npu_event == e.event_id != 0
    assert torch.npu.amp.amp_definitely_not_available() is False


# torch.cuda's device-properties fields that mean nothing on an NPU (SIMT, ROCm).
CUDA_ONLY_PROPERTIES = {"max_threads_per_multi_processor", "gcnArchName", "warp_size", "shared_memory_per_block",
                        "shared_memory_per_multiprocessor", "regs_per_multiprocessor",
                        "shared_memory_per_block_optin"}


def test_device_properties_have_torch_cudas_fields():
    import pathlib
    import re

    stub = (pathlib.Path(torch.__file__).parent / "_C" / "__init__.pyi").read_text()
    body = re.search(r"class _CudaDeviceProperties:\n((?:    .*\n)+)", stub).group(1)
    fields = set(re.findall(r"^    (\w+):", body, flags=re.M))
    assert {"name", "uuid", "L2_cache_size", "multi_processor_count"} <= fields
    props = torch.npu.get_device_properties(0)
    missing = sorted(f for f in fields - CUDA_ONLY_PROPERTIES if not hasattr(props, f))
    assert not missing, f"torch.npu device properties lack torch.cuda's fields: {missing}"
    assert props.uuid != torch.npu.get_device_properties(1).uuid
    assert str(props.uuid) == run_python_line("import torch; print(torch.npu.get_device_properties(0).uuid)")


def run_python_line(code):
    from helpers import last_line, run_python
    return last_line(run_python(code))
