"""Devices: selection, properties, synchronisation."""
from dataclasses import dataclass
import uuid as _uuid
from typing import Any, Optional, Union

import torch

from torch_npu import _C
from torch_npu._core import env as _ascend_env
from torch_npu._emu import profiles as _profiles

_DeviceLike = Union[torch.device, str, int, None]


def _get_device_index(device: _DeviceLike, optional: bool = True) -> int:
    """The npu index of ``device`` (an int, "npu", "npu:1", torch.device or None).

    The index is validated in full, before anything narrows it to c10's 8-bit
    device index, so npu:256 is an "invalid device" error, never npu:0; -1 means
    the current device.
    """
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "npu":
            raise ValueError(f"expected an npu device, got {device}")
        device = device.index
    if device is None:
        if not optional:
            raise ValueError("expected an npu device with an index, e.g. 'npu:0'")
        return current_device()
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"expected an npu device (int, str or torch.device), got {type(device).__name__}")
    if device == -1:
        return current_device()
    return _C._check_device_index(device)


def is_available() -> bool:
    return _C._device_count() > 0


def is_initialized() -> bool:
    """True once the npu runtime started (``init()`` or the first npu use), as torch.cuda's;
    False in a child forked after that (its npu calls raise)."""
    return _C._is_initialized() and not _is_in_bad_fork()


def init() -> None:
    """Starts the npu runtime now, as ``torch.cuda.init()`` creates the CUDA context.

    It otherwise starts at the first npu use. From then on ``is_initialized()``
    is true, ``torch.npu._initialized`` (what ``torch.utils.checkpoint`` and other
    device-generic code read) too, and a child forked afterwards raises at its
    first npu call. Raises in such a child.
    """
    _C._init()


def _lazy_init() -> None:
    _C._init()


def _is_in_bad_fork() -> bool:
    """True in a child forked after its parent used the npu: npu calls raise there (use 'spawn')."""
    return _C._is_in_bad_fork()


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    return _C._current_device()


def set_device(device: _DeviceLike) -> None:
    index = _get_device_index(device)
    if index != -1:  # -1: no change, as torch.cuda.set_device(-1)
        _C._set_device(index)


class device:
    """Context manager that makes ``device`` the current npu device."""

    def __init__(self, device: Any):
        self.idx = _get_device_index(device, optional=True) if device is not None else -1
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            _C._set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.idx >= 0 and self.idx != self.prev_idx:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current (no-op for cpu tensors)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "npu" else None)


def synchronize(device: _DeviceLike = None) -> None:
    """Waits for all kernels on all streams of the device; raises a failed kernel's error."""
    _C._synchronize(_get_device_index(device))


@dataclass(frozen=True)
class _NPUDeviceProperties:
    """torch.cuda's fields, and the Ascend adapter's (cube_core_num, vector_core_num, L2_cache_size):
    the chip's under a device profile, the host's on generic (L2_cache_size 0: unknown).

    ``uuid`` is stable for a device of this machine and profile, in every process. ``clock_rate``
    (kHz, as CUDA's) is the profile chip's cube clock. What no figure exists for (the memory
    clock and bus width, PCI location) is 0; the emulated device is discrete (``is_integrated`` 0).
    CUDA's SIMT fields (warp size, registers, threads, shared memory) mean nothing on an NPU and
    are absent.
    """
    name: str
    total_memory: int
    multi_processor_count: int
    major: int
    minor: int
    cube_core_num: int
    vector_core_num: int
    L2_cache_size: int
    uuid: _uuid.UUID = _uuid.UUID(int=0)
    clock_rate: int = 0
    memory_clock_rate: int = 0
    memory_bus_width: int = 0
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    pci_bus_id: int = 0
    pci_device_id: int = 0
    pci_domain_id: int = 0

    def __repr__(self) -> str:
        return (f"_NPUDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count}, cube_core_num={self.cube_core_num}, "
                f"vector_core_num={self.vector_core_num}, L2_cache_size={self.L2_cache_size // (1024 * 1024)}MB)")


def can_device_access_peer(device: _DeviceLike, peer_device: _DeviceLike) -> bool:
    """Whether ``device`` can read ``peer_device``'s memory directly: true for two distinct
    emulated npus (one host memory), as for devices linked by HCCS on a real node."""
    index, peer = _get_device_index(device, optional=False), _get_device_index(peer_device, optional=False)
    _C._check_device_index(index)      # "invalid device", naming the count
    _C._check_device_index(peer)
    return index != peer


def clock_rate(device: _DeviceLike = None) -> int:
    """The device's clock in MHz: under a device profile, its cube units' clock, derived from
    the profile's own figures (peak float16 = cube cores x 16x16x16 MACs x 2 x clock: 1800 for
    Ascend910B2); 0 for the generic emulated npu."""
    _get_device_index(device)
    chip = _profiles.active()
    cores = chip.properties.get("cube_core_num") or chip.properties.get("ai_core_num")
    if not chip.cost or not cores:
        return 0
    return round(chip.cost["cube_fp16_tflops"] * 1e12 / (cores * 16 ** 3 * 2) / 1e6)


def is_tf32_supported() -> bool:
    """Whether TF32 matmuls exist: not on the npu (its cube units take float16, bfloat16 and
    float32 inputs; torch.backends' TF32 switches change nothing here)."""
    return False


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode) -> None:
    """Warn (1, "warn") or raise (2, "error") at each npu operation that makes the host wait
    for the device's results: a copy to host memory (not a non_blocking one into pinned
    memory), ``.item()``, an op whose output size depends on the data (nonzero, masked_select,
    unique, ...). 0 or "default" says nothing. As torch.cuda.set_sync_debug_mode; explicit
    ``synchronize()`` calls are not flagged."""
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    _C._set_sync_debug_mode(int(debug_mode))


def get_sync_debug_mode() -> int:
    """The mode set_sync_debug_mode set: 0, 1 or 2."""
    return _C._get_sync_debug_mode()


def _physical_index(index: int) -> int:
    """The emulated device behind npu:index, through ASCEND_RT_VISIBLE_DEVICES' mask."""
    import os

    mask, physical = os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), os.environ.get(_ascend_env._PHYSICAL, "")
    if mask is not None and physical.strip().isdigit():
        visible = _ascend_env._visible_devices(mask, int(physical))
        if index < len(visible):
            return visible[index]
    return index


def _device_uuid(index: int, name: str) -> _uuid.UUID:
    index = _physical_index(index)  # the same device has one uuid in every process, masked or not
    try:
        with open("/etc/machine-id", encoding="ascii") as f:
            machine = f.read().strip()
    except OSError:
        import socket
        machine = socket.gethostname()
    return _uuid.uuid5(_uuid.NAMESPACE_OID, f"torch_npu/{machine}/{name}/npu{index}")


def get_device_properties(device: _DeviceLike = None) -> _NPUDeviceProperties:
    index = _get_device_index(device)
    fields = _C._device_properties(index)
    return _NPUDeviceProperties(**fields, uuid=_device_uuid(index, fields["name"]), clock_rate=clock_rate(index) * 1000)


def get_device_name(device: _DeviceLike = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: _DeviceLike = None) -> tuple:
    props = get_device_properties(device)
    return props.major, props.minor


def get_soc_version() -> int:
    """The chip's SoC version as the Ascend adapter numbers it (910B2 = 221, A3 = 250..., 310P3 = 202).

    The generic device is no chip: it raises, naming the profiles that are."""
    profile = _profiles.active()
    if not profile.is_chip:
        raise RuntimeError(
            "torch.npu.get_soc_version(): the npu is the generic emulated device (device profile 'generic'), "
            "not an Ascend chip, so it has no SoC version. Emulate a chip with NPU_EMU_PROFILE=<name> or "
            "torch_npu.npu.set_profile(name) before the first npu use; chips: "
            + ", ".join(n for n in _profiles.names() if n != _profiles.GENERIC))
    return profile.soc_version


def list_profiles() -> dict:
    """Every device profile: {name: one line describing it}; the active one is marked."""
    active = _C._active_profile()
    return {name: _profiles.load(name).description + (" (active)" if name == active else "")
            for name in _profiles.names()}


def set_profile(name: str) -> None:
    """Makes the npu behave as chip ``name`` (see list_profiles()) from its first use on, as
    NPU_EMU_PROFILE does. Raises once the npu started as another profile."""
    _profiles.activate(name)


def get_profile() -> str:
    """The name of the active device profile ("generic" by default)."""
    return _C._active_profile()


def mem_get_info(device: _DeviceLike = None) -> tuple:
    """(free, total) bytes of device memory, as the device (not the cache) sees it."""
    return tuple(_C._mem_get_info(_get_device_index(device)))


def _sleep(milliseconds: float, device: _DeviceLike = None) -> None:
    """Queues a kernel that keeps the current stream busy (for tests of asynchrony)."""
    _C._launch_sleep(_get_device_index(device), float(milliseconds))


def _launch_failing_kernel(message: str, device: _DeviceLike = None) -> None:
    """Queues a kernel that fails with ``message`` (for tests of error reporting)."""
    _C._launch_failing(_get_device_index(device), str(message))
