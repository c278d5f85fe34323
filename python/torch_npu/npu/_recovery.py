"""Stopping and restarting a device (the Ascend adapter's torch_npu.npu.stop_device and
torch.npu.restart_device, used by MindSpeed's high availability): while stopped, work
launched on the device raises an error that says FORCE STOP, as on the chip, and kernels it
had queued are skipped; restart_device lets work run again."""
import warnings
from typing import Any

from torch_npu import _C

from ._device import _get_device_index


def stop_device(device_id: Any) -> int:
    """Stops computation on ``device_id``: queued kernels are skipped, later work raises FORCE
    STOP until :func:`restart_device`. Returns 0 (done), as the adapter's."""
    _C._stop_device(_get_device_index(device_id))
    return 0


def restart_device(device_id: Any, rebuild_all_resources: bool = False,
                   disable_tensor_unsafe_check: bool = False) -> None:
    """Lets work run on ``device_id`` again after :func:`stop_device`."""
    index = _get_device_index(device_id)
    if rebuild_all_resources:
        warnings.warn("torch.npu.restart_device(rebuild_all_resources=True): the chip would recreate every stream "
                      "and, unless disable_tensor_unsafe_check=True, mark every npu tensor unsafe to read until "
                      "torch_npu.npu.update_npu_tensor_to_safe(); the emulated device keeps its streams and tensors "
                      "as they are (nothing on it was lost)", stacklevel=2)
    _C._restart_device(index)
