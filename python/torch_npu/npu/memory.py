"""Memory of the caching allocator, with torch.cuda's functions and key names."""
import collections
import contextlib
import os
import sys
from typing import Any, Dict, Optional

import torch

from torch_npu import _C

from ._device import _get_device_index, current_device, mem_get_info
from .streams import current_stream
from .streams import stream as stream_context


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


def caching_allocator_enable(value: bool = True) -> None:
    """Turns the caching allocator on (the default) or off, as torch.cuda's.

    Off, freed memory is never reused: it goes back to the device once the work
    queued on its stream before the free has run, and what the cache held goes
    back at once. Graph pools and MemPools keep caching.
    """
    _C._caching_allocator_enable(bool(value))


@contextlib.contextmanager
def caching_allocator_disabled():
    """The caching allocator off inside the block, as it was after."""
    previous = _C._caching_allocator_is_enabled()
    caching_allocator_enable(False)
    try:
        yield
    finally:
        caching_allocator_enable(previous)


def memory_stats_as_nested_dict(device: Any = None) -> Dict[str, Any]:
    """memory_stats() as nested dicts: {"allocated_bytes": {"all": {"current": ...}}}, as torch.cuda's."""
    nested: Dict[str, Any] = {}
    for key, value in _C._memory_stats(_get_device_index(device)).items():
        node = nested
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def memory_cached(device: Any = None) -> int:
    """Deprecated name of memory_reserved (as in torch.cuda)."""
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    """Deprecated name of max_memory_reserved (as in torch.cuda)."""
    return max_memory_reserved(device)


def reset_max_memory_cached(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def get_allocator_backend() -> str:
    """The npu's caching allocator ("native"; there is no other backend)."""
    return "native"


# ---- the device's memory, all processes (torch.cuda.memory's, which reads NVML) ------------

def device_memory_used(device: Any = None) -> int:
    """Bytes of device memory in use, by all processes (total minus free)."""
    free, total = mem_get_info(device)
    return total - free


def list_gpu_processes(device: Any = None) -> str:
    """torch.cuda.list_gpu_processes' report for the npu. The emulated device is this
    process's own: it lists this process and the memory its allocator holds."""
    index = _get_device_index(device, optional=True)
    reserved = memory_reserved(index)
    lines = [f"NPU:{index}"]
    if reserved:
        lines.append(f"process {os.getpid():>10d} uses {reserved / 1024 / 1024:12.3f} MB NPU memory")
    else:
        lines.append("no processes are running")
    return "\n".join(lines)


# ---- raw allocations ------------------------------------------------------------------------

def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Allocates ``size`` bytes from the npu caching allocator on ``device`` (current by default)
    for ``stream`` (a torch.npu.Stream or stream id; the current stream by default) and returns
    the address; free it with caching_allocator_delete."""
    index = _get_device_index(device)
    if stream is None:
        stream = current_stream(index)
    elif isinstance(stream, int) and not isinstance(stream, bool):
        stream = torch.npu.Stream(stream_id=stream, device_index=index, device_type=_C._device_type())
    elif not isinstance(stream, torch.Stream):
        raise TypeError(f"caching_allocator_alloc: stream must be a torch.npu.Stream or a stream id (int), "
                        f"got {type(stream).__name__}")
    if stream.device_index != index:
        raise ValueError(f"caching_allocator_alloc: the stream is on npu:{stream.device_index}, the allocation "
                         f"on npu:{index}; give a stream of the allocation's device")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"caching_allocator_alloc: size must be a number of bytes (int >= 0), got {size!r}")
    with stream_context(stream):
        return _C._caching_allocator_alloc(size)


def caching_allocator_delete(mem_ptr: int) -> None:
    """Frees memory of caching_allocator_alloc (its device and stream are remembered)."""
    _C._caching_allocator_delete(mem_ptr)


# ---- per-process memory fraction ------------------------------------------------------------

def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Limits this process to ``fraction`` (0 to 1) of the device's memory: an allocation that
    would pass it raises torch.OutOfMemoryError, as on CUDA."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C._set_memory_fraction(fraction, _get_device_index(device))


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction of the device's memory this process may use (1.0 unless set)."""
    return _C._get_memory_fraction(_get_device_index(device))


# ---- pinned host memory ---------------------------------------------------------------------

def host_memory_stats() -> Dict[str, Any]:
    """Statistics of the pinned host allocator, with torch.cuda.host_memory_stats()'s keys:
    "allocations.{current,peak,allocated,freed}" and "allocated_bytes.*" (blocks held from the
    host, in use and cached, at their power-of-two size), "active_requests.*" and "active_bytes.*"
    (blocks handed out and not yet reusable), "num_host_alloc"/"num_host_free" (blocks allocated
    from and given back to the host) and "host_alloc_time.{total,max,min,count,avg}" /
    "host_free_time.*" (microseconds in those calls)."""
    result = []

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                add(f"{prefix}.{key}" if prefix else key, item)
        else:
            result.append((prefix, value))

    add("", host_memory_stats_as_nested_dict())
    return collections.OrderedDict(sorted(result))


def host_memory_stats_as_nested_dict() -> Dict[str, Any]:
    """host_memory_stats() as nested dicts: {"allocations": {"current": ...}, "num_host_alloc": ...}."""
    return _C._host_memory_stats()


def reset_accumulated_host_memory_stats() -> None:
    """Resets the "allocated" and "freed" counts (and num_host_alloc/free, the times' totals and counts)."""
    _C._reset_accumulated_host_memory_stats()


def reset_peak_host_memory_stats() -> None:
    """Resets the "peak" values to the current ones (and the times' max and min)."""
    _C._reset_peak_host_memory_stats()


# ---- private memory pools -------------------------------------------------------------------

class MemPool:
    """A private pool of the npu caching allocator (torch.cuda.MemPool's API): allocations made
    inside ``use_mem_pool(pool)`` come from the pool's own segments and are cached there only;
    the segments go back to the device when the pool is deleted (and its tensors are freed).

    ``allocator`` (``NPUPluggableAllocator(...).allocator()``) makes the pool take its segments
    from that allocator's functions (cached within the pool). ``use_on_oom`` and ``no_split`` are
    CUDA options the npu allocator does not have; they raise rather than be ignored.
    """

    def __init__(self, allocator: Any = None, use_on_oom: bool = False, no_split: bool = False):
        import weakref

        if allocator is not None and not isinstance(allocator, _C._PluggableAllocator):
            raise TypeError("torch.npu.MemPool: allocator must be an NPUPluggableAllocator's .allocator(), got "
                            f"{type(allocator).__name__}")
        if use_on_oom or no_split:
            raise NotImplementedError("torch.npu.MemPool: use_on_oom and no_split are not supported on the npu; "
                                      "leave them False")
        self._device = current_device()
        self._id = tuple(_C._new_pool_id(True))
        self._allocator = allocator
        if allocator is not None:
            _C._set_pool_allocator(*self._id, allocator)  # its segments come from the allocator
        _C._retain_pool(self._device, *self._id)
        self._finalizer = weakref.finalize(self, MemPool._release, self._device, self._id)
        self._finalizer.atexit = False  # the process ends: nothing to give back

    @staticmethod
    def _release(device: int, pool_id) -> None:
        _C._release_pool(device, *pool_id)
        _C._empty_cache_pool(*pool_id)

    @property
    def id(self):
        """The pool's id, (0, n) for pools made by the user (graph pools are (n, 0))."""
        return self._id

    def use_count(self) -> int:
        """How many holders the pool has: 1 for the MemPool itself, plus one per use_mem_pool
        context (or graph) using it."""
        return _C._pool_use_count(self._device, *self._id)

    def snapshot(self, include_traces: bool = True):
        """memory_snapshot() of this pool's segments only."""
        return memory_snapshot(self._id, include_traces=include_traces)

    def __repr__(self):
        return f"torch.npu.MemPool(id={self._id}, device=npu:{self._device})"


class _NPUAllocator:
    """An npu memory allocator, as torch.cuda.memory._CUDAAllocator: ``allocator()`` is what
    ``MemPool(allocator=...)`` takes."""

    def __init__(self, allocator):
        self._allocator = allocator

    def allocator(self):
        return self._allocator


class NPUPluggableAllocator(_NPUAllocator):
    """An allocator whose functions live in a shared library (torch.cuda.CUDAPluggableAllocator's
    npu form, the Ascend adapter's name). The library exports::

        void* alloc_fn_name(ssize_t size, int device, void* stream);
        void free_fn_name(void* ptr, ssize_t size, int device, void* stream);

    ``stream`` is the runtime stream (``Stream.npu_stream``) the memory is first used on. The
    memory must be addressable by the device (on the emulated npu: host memory). Frees are called
    once the work queued before them has run. Use it for one pool
    (``MemPool(allocator=a.allocator())``) or for every allocation (``change_current_allocator``).
    """

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str):
        import ctypes

        self._library = ctypes.CDLL(path_to_so_file)  # kept loaded as long as the allocator lives
        addresses = []
        for name in (alloc_fn_name, free_fn_name):
            try:
                addresses.append(ctypes.cast(getattr(self._library, name), ctypes.c_void_p).value)
            except AttributeError:
                raise AttributeError(f"NPUPluggableAllocator: {path_to_so_file} has no function {name!r}") from None
        super().__init__(_C._PluggableAllocator(*addresses))
        _loaded_libraries.append(self._library)  # segments may outlive the object: never unload


_loaded_libraries = []
_current_allocator: Optional[_NPUAllocator] = None


def change_current_allocator(allocator: _NPUAllocator) -> None:
    """Makes ``allocator`` (an NPUPluggableAllocator) serve every npu allocation outside private
    pools, uncached, as torch.cuda's: only before the first npu tensor of the process."""
    global _current_allocator
    if not isinstance(allocator, _NPUAllocator) or not isinstance(allocator.allocator(), _C._PluggableAllocator):
        raise TypeError("torch.npu.memory.change_current_allocator: expected an NPUPluggableAllocator, got "
                        f"{type(allocator).__name__}")
    _C._change_current_allocator(allocator.allocator())
    _current_allocator = allocator


def _get_current_allocator() -> Optional[_NPUAllocator]:
    """The allocator change_current_allocator installed (None: the caching allocator)."""
    return _current_allocator


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None):
    """Routes this thread's npu allocations on ``device`` (current by default) to ``pool``.
    Other threads (the autograd engine's backward, for one) keep the general pools, as on CUDA."""
    if not isinstance(pool, MemPool):
        raise TypeError(f"use_mem_pool: expected a torch.npu.MemPool, got {type(pool).__name__}")
    index = _get_device_index(device)
    _C._begin_allocate_current_thread_to_pool(index, *pool.id)
    try:
        yield
    finally:
        _C._end_allocate_to_pool(index, *pool.id)
        _C._release_pool(index, *pool.id)


# ---- snapshots --------------------------------------------------------------------------------

def memory_snapshot(mempool_id=None, include_traces: bool = True):
    """The allocator's segments on every device (only the pool's with ``mempool_id``), each with
    its blocks: torch.cuda.memory_snapshot()'s structure."""
    first, second = (0, 0) if mempool_id is None else mempool_id
    return _C._memory_snapshot(first, second, include_traces)["segments"]


_CONTEXTS = {None: 0, "state": 1, "alloc": 2, "all": 3}


def _record_memory_history(enabled: Optional[str] = "all", context: Optional[str] = "all",
                           stacks: str = "all", max_entries: int = sys.maxsize, device: Any = None,
                           clear_history: bool = False, **unsupported) -> None:
    """Records where npu memory is allocated, as torch.cuda.memory._record_memory_history:
    ``enabled`` None (stop), "state" (stacks of live blocks) or "all" (also a history of every
    alloc, free and segment event, at most ``max_entries`` per device); ``context`` None, "state",
    "alloc" or "all" (which events keep a stack); ``stacks`` "python" or "all" (with C++ frames).
    Read it with _snapshot() or _dump_snapshot()."""
    if isinstance(enabled, bool):  # the legacy form: _record_memory_history(True/False, ...)
        enabled = "all" if enabled else None
    if unsupported:
        raise TypeError(f"_record_memory_history: {', '.join(sorted(unsupported))} not supported on the npu")
    if enabled not in (None, "state", "all"):
        raise ValueError(f"_record_memory_history: enabled must be None, 'state' or 'all', got {enabled!r}")
    if context not in _CONTEXTS:
        raise ValueError(f"_record_memory_history: context must be None, 'state', 'alloc' or 'all', got {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"_record_memory_history: stacks must be 'python' or 'all', got {stacks!r}")
    if enabled == "state" and context in ("alloc", "all"):
        context = "state"  # there is no history to keep stacks for
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
        raise ValueError(f"_record_memory_history: max_entries must be an int >= 0, got {max_entries!r}")
    _C._record_memory_history(enabled is not None, enabled == "all", _CONTEXTS[context] if enabled else 0,
                              stacks == "all", max_entries if enabled == "all" else 0, clear_history)


def _snapshot(device: Any = None):
    """The allocator's state: {"segments": [...], "device_traces": [[...] per device],
    "allocator_settings": {...}}, torch.cuda.memory._snapshot()'s structure, which
    torch.cuda._memory_viz renders (and https://pytorch.org/memory_viz opens when pickled)."""
    return _C._memory_snapshot(0, 0, True)


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles _snapshot() to ``filename`` (open it at https://pytorch.org/memory_viz)."""
    import pickle

    snapshot = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)


def _set_allocator_settings(settings: str) -> None:
    """Applies PYTORCH_NPU_ALLOC_CONF-style settings ("max_split_size_mb:64,...") now."""
    _warn_notes(_C._set_allocator_settings(settings, "torch.npu.memory._set_allocator_settings"))


def _warn_notes(notes) -> None:
    import warnings
    for note in notes:
        warnings.warn(note, stacklevel=3)


# ---- at import: the allocator's settings and the OOM snapshot --------------------------------

def _oom_snapshot_observer(device, requested, reserved, device_free):
    """OOM_SNAPSHOT_ENABLE: writes the snapshot before the OutOfMemoryError is raised."""
    import datetime
    directory = os.environ.get("OOM_SNAPSHOT_PATH") or os.getcwd()
    stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S_%f")
    path = os.path.join(directory, f"oom_snapshot_{os.getpid()}_{stamp}.pickle")
    try:
        _dump_snapshot(path)
    except OSError as error:
        print(f"torch_npu: OOM_SNAPSHOT_ENABLE: could not write the snapshot to {path}: {error}; "
              f"OOM_SNAPSHOT_PATH must name a directory this process can write", file=sys.stderr)
        return
    print(f"torch_npu: npu:{device} ran out of memory; the memory snapshot is in {path} "
          f"(open it at https://pytorch.org/memory_viz)", file=sys.stderr)


def _setup_from_environment() -> None:
    _warn_notes(_C._load_allocator_settings())
    mode = os.environ.get("OOM_SNAPSHOT_ENABLE", "0").strip()
    if mode in ("", "0"):
        return
    if mode not in ("1", "2"):
        raise ValueError(f"OOM_SNAPSHOT_ENABLE={mode!r} is not valid: 0 (off), 1 (the snapshot with the history of "
                         "allocations and frees) or 2 (the state at the out-of-memory error only)")
    path = os.environ.get("OOM_SNAPSHOT_PATH")
    if path and not os.path.isdir(path):
        raise ValueError(f"OOM_SNAPSHOT_PATH={path!r} is not a directory; create it or point it at one")
    if mode == "1":
        _record_memory_history("all", context="all", stacks="python")
    _C._attach_out_of_memory_observer(_oom_snapshot_observer)


_setup_from_environment()
