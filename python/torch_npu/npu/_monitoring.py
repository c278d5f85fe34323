"""What torch.cuda reads from NVML, for the npu: how busy the device is, its temperature
and power draw (torch.cuda.utilization, memory_usage, temperature, power_draw; re-exported
as torch.npu's). The emulator has no sensors: busy is sampled from the streams, the rest is 0."""
from ._device import _DeviceLike, _get_device_index
from .streams import current_stream, default_stream

def _busy(device: _DeviceLike) -> bool:
    return not (current_stream(device).query() and default_stream(device).query())


def utilization(device: _DeviceLike = None) -> int:
    """Percent of time the device was busy (torch.cuda.utilization's meaning). The emulator
    samples now: 100 while the device's current or default stream has queued work, else 0."""
    return 100 if _busy(device) else 0


def memory_usage(device: _DeviceLike = None) -> int:
    """Percent of time device memory was read or written (torch.cuda.memory_usage's meaning).
    On the emulator only kernels touch it: the same sample as utilization()."""
    return utilization(device)


def temperature(device: _DeviceLike = None) -> int:
    """The device's temperature in degrees C. The emulator has no sensor: 0."""
    _get_device_index(device)
    return 0


def power_draw(device: _DeviceLike = None) -> int:
    """The device's power draw in mW. The emulator has no sensor: 0."""
    _get_device_index(device)
    return 0
