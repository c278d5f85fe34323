"""npu tensors and torch.multiprocessing, as CUDA tensors.

torch.multiprocessing sends a CUDA tensor to another process as an IPC handle
of its memory (``reduce_tensor``'s CUDA branch) and any other tensor through
shared host memory (``_share_fd_``, cpu only). An npu tensor is sent as CUDA's
is: the handle of the HAL allocation holding its storage, the storage's offset
in it, an interprocess event recorded on the sender's current stream (the
receiver's current stream waits for it before using the memory) and a
reference-counter slot (csrc/core/ipc.h). The receiver gets a tensor on the
same npu memory: writes are visible both ways. The sender keeps the memory
until every receiver dropped its tensor (or exited); ``torch.npu.ipc_collect()``
frees what was released, as ``torch.cuda.ipc_collect()`` does.

A HAL without interprocess memory (the emulator under NPU_EMU_PROTECT=1, a
vendor's without ``Capabilities::interprocess``) cannot: sending raises,
naming the HAL. Where the pickling runs in the sender's thread
(``SimpleQueue``, ``Pipe``, ``Pool`` arguments), the sender raises; a
``multiprocessing.Queue`` pickles in a feeder thread after ``put()`` returned,
so there the item becomes one that raises the same error in the receiver's
``get()`` instead of being lost while the receiver waits.

npu storages themselves are refused as CUDA storages are ("try pickling a
tensor instead").
"""
import threading
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as _reductions  # registers torch's reducers first

from torch_npu import _C
from torch_npu._core import patches as _patches

from .streams import Event, _InterprocessEvent

GROUP = "multiprocessing"


class NpuSharingError(RuntimeError):
    """An npu tensor, storage or event could not be sent to another process."""


def _refuse(message: str):
    raise NpuSharingError(message)


def _is_npu(obj) -> bool:
    if isinstance(obj, torch.storage.TypedStorage):
        obj = obj._untyped_storage  # (its .device warns that TypedStorage is deprecated)
    return obj.device.type == "npu"


def _fail(message: str):
    if threading.current_thread().name == "QueueFeederThread":
        # The sender's put() has returned: the receiver gets the error instead of the item.
        return _refuse, (message,)
    raise NpuSharingError(message)


def rebuild_npu_tensor(tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls, dtype, storage_device,
                       storage_handle, storage_size_bytes, storage_offset_bytes, requires_grad, ref_counter_handle,
                       ref_counter_offset, event_handle, event_sync_required):
    """The receiving side of :func:`reduce_npu_tensor` (torch's ``rebuild_cuda_tensor``, for the npu)."""
    if storage_handle is None or storage_size_bytes == 0:
        storage = torch.UntypedStorage(0, device=torch.device("npu", storage_device))
    else:
        key = ("npu", storage_handle, storage_offset_bytes)
        storage = _reductions.storage_from_cache(storage_cls, key)
        if storage is None:
            storage = _C._ipc_open_storage(storage_device, storage_handle, storage_size_bytes, storage_offset_bytes,
                                           ref_counter_handle, ref_counter_offset, event_handle,
                                           event_sync_required)
            _reductions.shared_cache[key] = _reductions.StorageWeakRef(storage)
        else:
            # Already open here: the sender counted this send too, release its slot now;
            # still order this process's stream after the sender's writes.
            _C._ipc_release_counter(ref_counter_handle, ref_counter_offset)
            if event_sync_required:
                _C._ipc_wait_event(storage_device, event_handle)
    typed = torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)
    t = torch._utils._rebuild_tensor(typed, tensor_offset, tensor_size, tensor_stride)
    if tensor_cls == torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def reduce_npu_tensor(tensor):
    """torch's ``reduce_tensor`` for an npu tensor: sends a handle of its memory, not its data."""
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not support "
            "crossing process boundaries.  If you just want to transfer the data, call detach() on the tensor "
            "before serializing (e.g., putting it on the queue).")
    torch.utils.hooks.warn_if_has_hooks(tensor)
    if tensor.layout != torch.strided or tensor.is_nested:
        return _fail(f"sending an npu tensor to another process: only strided tensors can be shared "
                     f"(this one is {tensor.layout}{', nested' if tensor.is_nested else ''}); send its parts, "
                     f"or tensor.cpu()")
    storage = tensor._typed_storage()
    untyped = storage._untyped_storage
    if untyped.nbytes() == 0:
        shared = (tensor.device.index, None, 0, 0, None, 0, None, False)
    else:
        try:
            shared = _C._ipc_share_storage(tensor)
        except Exception as error:  # noqa: BLE001  (the HAL cannot share; a received tensor)
            return _fail(str(error).split("\nException raised from")[0])
        device, handle, size_bytes, offset_bytes = shared[:4]
        _reductions.shared_cache[("npu", handle, offset_bytes)] = _reductions.StorageWeakRef(untyped)
    device, handle, size_bytes, offset_bytes, ref_handle, ref_slot, event_handle, event_sync = shared
    return (rebuild_npu_tensor,
            (type(tensor), tensor.size(), tensor.stride(), tensor.storage_offset(), type(storage), tensor.dtype,
             device, handle, size_bytes, offset_bytes, tensor.requires_grad, ref_handle, ref_slot, event_handle,
             event_sync))


def _sharing_npu(reduce):
    def reduce_tensor_or_npu(tensor):
        if tensor.device.type != "npu":
            return reduce(tensor)
        return reduce_npu_tensor(tensor)

    reduce_tensor_or_npu.__wrapped__ = reduce
    return reduce_tensor_or_npu


_STORAGE_MESSAGE = ("Cannot pickle npu storage; try pickling an npu tensor instead (torch.multiprocessing shares "
                    "npu tensors as CUDA tensors: the receiver gets a tensor on the same npu memory)")


def _refusing_npu_storage(reduce):
    def reduce_unless_npu(storage):
        if not _is_npu(storage):
            return reduce(storage)
        return _fail(_STORAGE_MESSAGE)

    reduce_unless_npu.__wrapped__ = reduce
    return reduce_unless_npu


def rebuild_event(device, handle):
    return Event.from_ipc_handle(device, handle)


def reduce_event(event):
    handle = event.ipc_handle()
    return (rebuild_event, (event.device, handle))


def install() -> None:
    reducers = ForkingPickler._extra_reducers
    for cls in (torch.Tensor, torch.nn.Parameter):
        if cls in reducers:
            _patches.wrap(reducers, cls, _sharing_npu, GROUP, checked=("2.13",), expects="(tensor)",
                          reason="torch's reducer shares any non-CUDA tensor through host memory (_share_fd_, cpu "
                                 "only) and has no per-device hook (reduce_tensor tests device.type == 'cuda'): npu "
                                 "tensors are shared as CUDA's, by a handle of their npu memory")
    for cls in (torch.UntypedStorage, torch.storage.TypedStorage):
        if cls in reducers:
            _patches.wrap(reducers, cls, _refusing_npu_storage, GROUP, checked=("2.13",), expects="(storage)",
                          reason="torch's reducer shares any non-CUDA storage through host memory and fails with "
                                 "a lost item and a hung consumer for npu memory, with no per-device hook: npu "
                                 "storages are refused as CUDA storages are")
    for cls in (Event, _InterprocessEvent):  # the pickler looks up the exact class
        _patches.patch(reducers, cls, reduce_event, GROUP, checked=("2.13",), expects=_patches.ABSENT,
                       reason="torch.multiprocessing registers torch.cuda.Event's reducer only: torch.npu.Event "
                              "(interprocess=True) is sent by its IPC handle as torch.cuda.Event is, through the "
                              "pickler's own reducer table (entered here so undo removes it)")


def ipc_collect():
    r"""Force collects npu memory after it has been released by the processes it was sent to.

    As ``torch.cuda.ipc_collect()``: an npu tensor sent to other processes keeps its
    memory until every receiver dropped its tensor (or exited), even once the sender
    dropped it too; this frees what is released now. Each later send does the same.
    """
    torch.npu._lazy_init()
    _C._ipc_collect()
