"""Memory of the caching allocator, with torch.cuda's functions and key names."""
import collections
from typing import Any, Dict

from torch_npu import _C

from ._device import _get_device_index


def memory_stats(device: Any = None) -> Dict[str, int]:
    """Allocator statistics: "allocated_bytes.all.current", "num_ooms", ... (see torch.cuda.memory_stats)."""
    stats = _C._memory_stats(_get_device_index(device))
    return collections.OrderedDict(sorted(stats.items()))


def memory_allocated(device: Any = None) -> int:
    """Bytes held by tensors now (rounded to the allocator's 512-byte blocks)."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: Any = None) -> int:
    """Bytes the allocator holds from the device: in use plus cached."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: Any = None) -> None:
    _C._reset_peak_memory_stats(_get_device_index(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _C._reset_accumulated_memory_stats(_get_device_index(device))


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A table of the allocator's statistics (the one an out-of-memory error shows)."""
    return _C._memory_summary(_get_device_index(device))


def empty_cache() -> None:
    """Gives cached, unused memory back to the device (waits for queued kernels first)."""
    _C._empty_cache()
