"""The names of the Ascend adapter that DeepSpeed's NPU_Accelerator calls and torch.npu had not:
``torch.npu._lazy_call`` (torch.cuda's) and ``torch.npu.npurt()`` (the runtime-API module, as
``torch.cuda.cudart()``), with their meaning on the emulated npu."""
import threading
import types
from typing import Callable, Dict

# ACL's return codes, as aclrtHostRegister/aclrtHostUnregister answer them.
ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000      # a null address, a zero or negative size, an unknown flag
ACL_ERROR_RT_PARAM_INVALID = 107000   # an address that no registration starts at
ACL_ERROR_RT_HOST_MEMORY_ALREADY_REGISTERED = 107030  # a range that overlaps a registered one

# The ACL_HOST_REG_* bitmask: PINNED page-locks the range, MAPPED also maps it for the device.
ACL_HOST_REG_PINNED = 0x1
ACL_HOST_REG_MAPPED = 0x2
_KNOWN_FLAGS = ACL_HOST_REG_PINNED | ACL_HOST_REG_MAPPED


def _lazy_call(callable: Callable[[], object], **kwargs) -> None:
    """Runs ``callable`` for state of the npu runtime, as ``torch.cuda._lazy_call``.

    torch.cuda queues such calls until CUDA initializes, so that setting a seed or a
    generator state does not create a CUDA context (and make later forks bad). The npu's
    generators, current device and seeds are readable and settable before the runtime
    starts without starting it (``torch.npu.is_initialized()`` stays false), so the call
    runs now, in order with the caller's other npu calls; ``seed``/``seed_all`` keyword
    arguments (torch.cuda's queue kinds) change nothing. A callable that itself uses the
    device starts the runtime, as it would on CUDA after initialization.
    """
    callable()


class _NpuRuntime(types.SimpleNamespace):
    """What ``torch.npu.npurt()`` returns: the npu runtime's host-memory registration, with
    ACL's return codes (0 on success) instead of exceptions, as ``torch.cuda.cudart()``'s
    ``cudaHostRegister`` returns cudaError codes.

    On an Ascend chip registration page-locks a host range and maps it for the NPU's DMA
    engine. The emulated npu computes on host memory its host can address, so a
    registration moves no data path: copies from a registered range are the same copies
    as from any host memory. What is kept is the runtime's bookkeeping and its errors: a
    range is registered once (an overlap is ACL_ERROR_RT_HOST_MEMORY_ALREADY_REGISTERED),
    it is unregistered by its start address only, and ``registered()`` lists what is held,
    so a caller that unregisters what it never registered, or twice, gets the error it
    would get on the chip.
    """

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._ranges: Dict[int, int] = {}    # start address -> size in bytes

    def npuHostRegister(self, address: int, size: int, flags: int = ACL_HOST_REG_PINNED) -> int:
        """Registers [address, address + size) with the runtime; 0, or an ACL error code."""
        if not isinstance(address, int) or not isinstance(size, int) or not isinstance(flags, int):
            return ACL_ERROR_INVALID_PARAM
        if address <= 0 or size <= 0 or flags & ~_KNOWN_FLAGS:
            return ACL_ERROR_INVALID_PARAM
        if flags & ACL_HOST_REG_MAPPED and address % 4096:
            return ACL_ERROR_INVALID_PARAM   # MAPPED registers 4K-aligned addresses only, as on the chip
        with self._lock:
            for start, length in self._ranges.items():
                if address < start + length and start < address + size:
                    return ACL_ERROR_RT_HOST_MEMORY_ALREADY_REGISTERED
            self._ranges[address] = size
        return ACL_SUCCESS

    def npuHostUnregister(self, address: int) -> int:
        """Unregisters the range that starts at ``address``; 0, or an ACL error code."""
        with self._lock:
            if self._ranges.pop(address, None) is None:
                return ACL_ERROR_RT_PARAM_INVALID
        return ACL_SUCCESS

    def registered(self) -> Dict[int, int]:
        """The registered ranges: {start address: size in bytes}."""
        with self._lock:
            return dict(self._ranges)


_runtime = _NpuRuntime()


def npurt() -> _NpuRuntime:
    """The npu runtime-API module (``npuHostRegister``, ``npuHostUnregister``), as
    ``torch.cuda.cudart()`` returns cudart's; one per process. DeepSpeed's NPU_Accelerator
    registers its natively pinned host buffers through it."""
    return _runtime
