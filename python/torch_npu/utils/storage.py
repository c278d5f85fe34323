"""The Ascend adapter's pickle function for npu tensors.

Files written by torch_npu for torch before 2.1 pickle each npu tensor as
``torch_npu.utils.storage._rebuild_npu_tensor(storage, storage_offset, size, stride,
requires_grad, backward_hooks, npu_storage_info)``, its data in the storage; ``npu_storage_info``
is False/True (the default format) or the tensor's ACL storage format. msprobe adds this function
to torch.serialization's safe globals so that such tensors load with ``weights_only=True``.
"""
import torch

from ..ops.formats import npu_format_cast

__all__ = []


def _rebuild_npu_tensor(storage, storage_offset, size, stride, requires_grad, backward_hooks, npu_storage_info):
    """The npu tensor such a file holds: its storage's values, on the npu, with its requires_grad,
    backward hooks and, when the file names one, its storage format (kept as metadata here).
    Like the Ascend adapter under a plain torch.load, the tensor goes to the npu whatever storage
    torch.load gave (map_location included): the file holds an npu tensor."""
    tensor = torch.empty(0, dtype=storage.dtype, device=storage.device)
    tensor.set_(storage, storage_offset, size, stride)
    if tensor.device.type != "npu":
        tensor = tensor.npu()
    if not isinstance(npu_storage_info, bool):
        tensor = npu_format_cast(tensor, int(npu_storage_info))
    tensor.requires_grad = requires_grad
    tensor._backward_hooks = backward_hooks
    return tensor
