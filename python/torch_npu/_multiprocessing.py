"""npu tensors and torch.multiprocessing.

torch.multiprocessing sends a CUDA tensor to another process as an IPC handle
of its memory, and any other tensor as shared host memory (``_share_fd_``, cpu
only). The emulated npu's memory belongs to its process, so an npu tensor (or
storage) cannot be shared: instead of torch's "only available on CPU" error in
a queue's feeder thread, which loses the item and leaves the consumer waiting
forever, pickling one raises a clear error. Where the pickling runs in the
sender's thread (``SimpleQueue``, ``Pipe``, ``Pool`` arguments), the sender
raises; a ``multiprocessing.Queue`` pickles in a feeder thread, so its consumer
raises the same error from ``get()`` instead of waiting.
"""
import threading
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions  # noqa: F401  (registers torch's reducers first)

from . import _patches

GROUP = "multiprocessing"

_MESSAGE = ("npu tensors cannot be sent to another process: the npu's memory belongs to the process that "
            "allocated it and cannot be shared (torch.multiprocessing shares CUDA tensors through IPC handles; "
            "the npu has none). Send tensor.cpu() and move it to the npu in the receiving process, or start the "
            "workers with the 'spawn' start method and create their npu tensors there.")


class NpuSharingError(RuntimeError):
    """An npu tensor or storage was sent to another process."""


def _refuse(message: str):
    raise NpuSharingError(message)


def _is_npu(obj) -> bool:
    if isinstance(obj, torch.storage.TypedStorage):
        obj = obj._untyped_storage  # (its .device warns that TypedStorage is deprecated)
    return obj.device.type == "npu"


def _refusing_npu(reduce):
    def reduce_unless_npu(obj):
        if not _is_npu(obj):
            return reduce(obj)
        if threading.current_thread().name == "QueueFeederThread":
            # The sender's put() has returned: the receiver gets the error instead of the item.
            return _refuse, (_MESSAGE,)
        raise NpuSharingError(_MESSAGE)

    reduce_unless_npu.__wrapped__ = reduce
    return reduce_unless_npu


def install() -> None:
    reducers = ForkingPickler._extra_reducers
    for cls in (torch.Tensor, torch.nn.Parameter, torch.UntypedStorage, torch.storage.TypedStorage):
        if cls in reducers:
            _patches.wrap(reducers, cls, _refusing_npu, GROUP, checked=("2.13",),
                          expects="(storage)" if cls in (torch.UntypedStorage, torch.storage.TypedStorage)
                          else "(tensor)",
                          reason="torch's reducer shares any non-CUDA tensor through host memory and fails with "
                                 "a lost item and a hung consumer for npu memory: npu tensors are refused clearly")
