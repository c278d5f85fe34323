"""torch.npu: the npu device module, with the names and meanings of torch.cuda."""
import torch

from torch_npu import _C
from torch_npu._emu import profiles as _profiles

from ._device import (
    current_device,
    device,
    device_count,
    device_of,
    get_device_capability,
    get_device_name,
    get_device_properties,
    get_profile,
    get_soc_version,
    get_sync_debug_mode,
    can_device_access_peer,
    clock_rate,
    init,
    is_tf32_supported,
    list_profiles,
    is_available,
    is_initialized,
    mem_get_info,
    set_device,
    set_profile,
    set_sync_debug_mode,
    synchronize,
    _get_device_index,
    _is_in_bad_fork,
    _lazy_init,
    _sleep,
    _launch_failing_kernel,
)
from . import memory  # noqa: E402  (torch.npu.memory, as torch.cuda.memory)
from . import utils  # noqa: E402  (torch_npu.npu.utils, the Ascend adapter's path to these:)
from ._msprobe_names import (  # noqa: E402  (the overflow-status names msprobe calls)
    clear_npu_overflow_flag, get_npu_overflow_flag, is_support_inf_nan, npu_check_overflow,
)
from ._kernel_dump import finalize_dump, init_dump, set_dump  # noqa: E402  (msprobe's L2 kernel dump)
from ._monitoring import memory_usage, power_draw, temperature, utilization  # noqa: E402
from .memory import (
    device_memory_used,
    list_gpu_processes,
    MemPool,
    caching_allocator_alloc,
    caching_allocator_delete,
    caching_allocator_disabled,
    caching_allocator_enable,
    change_current_allocator,
    NPUPluggableAllocator,
    empty_cache,
    get_allocator_backend,
    get_per_process_memory_fraction,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
    use_mem_pool,
)
from .random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import (  # noqa: E402
    Event, ExternalStream, Stream, StreamContext, current_stream, default_stream, get_stream_from_external, set_stream,
    stream,
)
from ._tensor_types import (  # noqa: E402  (the legacy typed tensors, as torch.cuda's)
    BFloat16Tensor, BoolTensor, ByteTensor, CharTensor, DoubleTensor, FloatTensor, HalfTensor, IntTensor, LongTensor,
    ShortTensor,
)
from ._ascend import config, get_option, is_jit_compile_false, set_compile_mode, set_option  # noqa: E402
from .graphs import NPUGraph, graph, graph_pool_handle, is_current_stream_capturing, make_graphed_callables
from . import amp  # noqa: E402
from . import comm  # noqa: E402  (torch.npu.comm, as torch.cuda.comm)
from ._multiprocessing import ipc_collect  # noqa: E402  (torch.cuda.ipc_collect's)
from ._deepspeed_names import _lazy_call, npurt  # noqa: E402  (what DeepSpeed's NPU_Accelerator calls)
from .streams import ExternalEvent, SyncLaunchStream  # noqa: E402  (the Ascend adapter's stream names)
from .graphs import (  # noqa: E402  (task groups: vllm-ascend's graph parameter updates)
    NpuGraphOpHandler, graph_task_group_begin, graph_task_group_end, graph_task_update_begin, graph_task_update_end,
    register_npu_graph_handler,
)
from ._host_func import (  # noqa: E402,F401
    _launch_host_func, _launch_host_func_pending, _subscribe_report, _unsubscribe_report,
)
from ._recovery import restart_device, stop_device  # noqa: E402  (MindSpeed's high availability)

has_half = True   # float16 kernels, as torch.cuda.has_half
OutOfMemoryError = torch.OutOfMemoryError  # what the npu allocator raises, as torch.cuda.OutOfMemoryError


class _AmpDtypes(list):
    """The autocast dtypes of a chip without bfloat16: asked whether bfloat16 is
    among them (torch.autocast does, before it disables itself with a generic
    warning), it also warns why."""

    def __contains__(self, dtype):
        if dtype == torch.bfloat16:
            import warnings
            name = get_device_name()
            warnings.warn(f"torch.autocast('npu', dtype=torch.bfloat16): {name} (device profile "
                          f"'{get_profile()}') has no bfloat16 units, so autocast is disabled; use "
                          f"dtype=torch.float16 on this chip", stacklevel=3)
        return super().__contains__(dtype)


def get_amp_supported_dtype():
    """The dtypes torch.autocast("npu") may cast to: float16, and bfloat16 where the chip has it."""
    return [torch.float16, torch.bfloat16] if is_bf16_supported() else _AmpDtypes([torch.float16])


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether the chip computes in bfloat16: False under the 910A and 310P profiles, which have no
    bfloat16 units (npu ops on bfloat16 tensors raise there). Nothing emulates bfloat16 on them."""
    return _profiles.active().bfloat16


__all__ = [
    "config", "get_option", "is_jit_compile_false", "set_compile_mode", "set_option",
    "ExternalStream", "get_stream_from_external", "has_half",
    "BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor",
    "IntTensor", "LongTensor", "ShortTensor", "can_device_access_peer", "clock_rate", "device_memory_used",
    "is_tf32_supported", "list_gpu_processes", "memory_usage", "power_draw", "temperature", "utilization",
    "get_sync_debug_mode", "set_sync_debug_mode",
    "ipc_collect",
    "npurt",
    "NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables",
    "Event", "MemPool", "OutOfMemoryError", "Stream", "StreamContext", "amp", "caching_allocator_alloc",
    "caching_allocator_delete", "caching_allocator_disabled", "caching_allocator_enable",
    "change_current_allocator", "NPUPluggableAllocator",
    "get_allocator_backend", "get_per_process_memory_fraction", "max_memory_cached",
    "memory_cached", "memory_snapshot", "memory_stats_as_nested_dict", "reset_max_memory_cached",
    "set_per_process_memory_fraction", "use_mem_pool",
    "host_memory_stats", "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats", "current_device", "current_stream", "default_generators",
    "default_stream", "device", "device_count", "device_of", "empty_cache", "get_amp_supported_dtype",
    "get_device_capability", "get_device_name", "get_device_properties", "get_profile", "get_rng_state",
    "get_rng_state_all", "get_soc_version", "init", "initial_seed", "is_available", "is_bf16_supported",
    "is_initialized", "list_profiles",
    "manual_seed", "manual_seed_all", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
    "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_peak_memory_stats", "seed",
    "seed_all", "set_device", "set_profile", "set_rng_state", "set_rng_state_all", "set_stream", "stream",
    "synchronize",
    "clear_npu_overflow_flag", "get_npu_overflow_flag", "is_support_inf_nan", "npu_check_overflow",
    "init_dump", "set_dump", "finalize_dump",
    "ExternalEvent", "SyncLaunchStream", "graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin",
    "graph_task_update_end", "restart_device", "stop_device", "NpuGraphOpHandler", "register_npu_graph_handler",
]


# Names a part of torch_npu above torch.npu provides, loaded when first read:
# {name: loader(name) -> value}. torch_npu._compile provides inductor's (Scheduling and the
# wrappers, which inductor's backend registration reads from the device module).
_provided = {}


def _provide(name, loader):
    """Makes ``torch.npu.<name>`` read ``loader(name)`` (for torch_npu's own layers above torch.npu)."""
    _provided[name] = loader


def __getattr__(name):
    if name == "_initialized":
        # torch.cuda's flag, read by device-generic code (torch.utils.checkpoint
        # stashes the device's RNG state only when it is true): live, so it is
        # true after init() and after the first npu use alike.
        return _C._is_initialized() and not _is_in_bad_fork()
    if name in _provided:
        return _provided[name](name)
    raise AttributeError(f"module 'torch.npu' has no attribute {name!r}")
