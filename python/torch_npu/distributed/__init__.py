"""torch.distributed on the npu: the c10d backend "hccl" (also "npu_gloo").

``torch.distributed.init_process_group()`` with no backend picks it when the
npu is the accelerator, ``init_process_group("hccl")`` (the name transformers
and accelerate pass for an NPU) serves npu and cpu tensors, and
``"cpu:gloo,npu:hccl"`` routes each device to its own backend. Every
collective runs Gloo on the host (``csrc/distributed``): on the npu tensor's
memory in place where the device's memory is host-addressable (the emulated
npu), else on pinned host copies that are copied back (``NPU_DIST_STAGING=1``
forces that path). A collective is complete when it returns, so an
``async_op=True`` Work is already finished and its future holds the outputs;
send and receive return at once and finish in ``wait()``. A peer that died or
stalled makes the collective raise ``DistBackendError`` once Gloo gives up
(bounded by the group's ``timeout``).

One process per device: with ``NPU_EMU_DEVICES=N`` and ``torchrun
--nproc-per-node N``, each process calls ``torch.npu.set_device(LOCAL_RANK)``
(``local_device()`` does it from the environment).
"""
import functools
import os
import sys
import types

import torch
import torch.distributed as dist

from .. import _C
from .._core import patches as _patches

BACKEND = "hccl"
ALIAS = "npu_gloo"   # the descriptive name: Gloo for npu tensors

__all__ = ["ALIAS", "BACKEND", "GlooBackend", "ProcessGroupHCCL", "local_device"]


def _creator(name):
    def create(store, rank, size, timeout):
        gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        return GlooBackend(gloo, name)   # noqa: F821  (made by _C._init_distributed below)
    create.__name__ = f"create_{name}_backend"
    return create


def local_device():
    """The npu of this process: ``npu:LOCAL_RANK`` (torchrun sets it), made current."""
    index = int(os.environ.get("LOCAL_RANK", "0"))
    if index >= torch.npu.device_count():
        raise RuntimeError(f"torch_npu.distributed.local_device: LOCAL_RANK={index} but this process sees "
                           f"{torch.npu.device_count()} npu device(s); start as many processes per node as "
                           f"devices (torchrun --nproc-per-node), or raise NPU_EMU_DEVICES on the emulator")
    torch.npu.set_device(index)
    return torch.device("npu", index)


class _BackendOfHCCLGroups(type):
    # Backends are made by the C++ GlooBackend class: they are this class's instances too.
    def __instancecheck__(cls, obj):
        return isinstance(obj, GlooBackend)   # noqa: F821

    def __subclasscheck__(cls, sub):
        return issubclass(sub, GlooBackend) or type.__subclasscheck__(cls, sub)   # noqa: F821


class ProcessGroupHCCL(metaclass=_BackendOfHCCLGroups):
    """The backend of "hccl" groups in the shape of ``torch.distributed.ProcessGroupNCCL``
    (transfer_to_npu puts it under that name): ``isinstance(pg._get_backend(device),
    ProcessGroupHCCL)`` holds, ``ProcessGroupHCCL.Options()`` are accepted (by
    ``init_process_group``/``new_group`` as ``pg_options``) and
    ``ProcessGroupHCCL(store, rank, size, options)`` makes the backend.

    The backend has no streams or communicator settings: groups accept Options and
    keep their own timeout; the constructor takes the timeout from them.
    """

    if dist.is_available():
        class Options(dist._Backend.Options):
            """As ProcessGroupNCCL.Options: the fields are kept, the backend does not use them."""

            def __init__(self, is_high_priority_stream: bool = False):
                super().__init__(BACKEND)
                self.is_high_priority_stream = is_high_priority_stream
                self.config = types.SimpleNamespace()   # takes any NCCL config field
                self.split_from = None
                self.split_color = 0
                self.global_ranks_in_group = []
                self.group_name = ""

    def __new__(cls, store, rank, size, options=None):
        timeout = options._timeout if options is not None else dist.default_pg_timeout
        return _creator(BACKEND)(store, rank, size, timeout)


def _default_to_the_npu_backend():
    # A group whose npu tensors go to our backend has it as its default backend,
    # as a CUDA group has NCCL. torch marks Gloo (no backend named: it knows NCCL
    # or Gloo only) or nothing ("cpu:gloo,npu:hccl": it compares the plugin's
    # upper-case key with the lower-case name), and the group then warns at
    # teardown that its default backend does not exist.
    def marking_the_default(helper):
        @functools.wraps(helper)
        def _new_process_group_helper(*args, **kwargs):
            pg, prefix_store = helper(*args, **kwargs)
            try:
                ours = isinstance(pg._get_backend(torch.device("npu")), GlooBackend)  # noqa: F821
            except (RuntimeError, AttributeError):
                ours = False
            if ours:
                pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
            return pg, prefix_store
        return _new_process_group_helper

    _patches.wrap(dist.distributed_c10d, "_new_process_group_helper", marking_the_default, "distributed",
                  checked=("2.13",),
                  expects="(group_size, group_rank, global_ranks_in_group, backend, store, group_name, "
                          "backend_options=None, timeout=None, pg_tag=None, device_id=None, group_desc=None)",
                  reason="c10d marks a group's default backend only for NCCL or Gloo (a plugin's upper-case key "
                         "never matches) and has no hook for a plugin to be marked, so a group of the npu's "
                         "backend would warn at teardown that it has none")


def is_hccl_available() -> bool:
    """torch.distributed.is_hccl_available(), as the Ascend adapter adds it: whether the "hccl"
    backend can be used (here: registered, over Gloo)."""
    return dist.is_available() and BACKEND in dist.Backend.backend_list


def _register():
    if not (dist.is_available() and dist.is_gloo_available()):
        return
    module = sys.modules[__name__]
    if not hasattr(module, "GlooBackend"):
        _C._init_distributed(module)
    for name in (BACKEND, ALIAS):
        if name not in dist.Backend.backend_list:
            dist.Backend.register_backend(name, _creator(name), devices=["cpu", "npu"])
    # The Ascend adapter's c10d submodule of its extension: vllm-ascend imports ProcessGroupHCCL from it.
    if not hasattr(_C, "_distributed_c10d"):
        c10d = types.ModuleType("torch_npu._C._distributed_c10d", "The Ascend adapter's c10d names: ProcessGroupHCCL.")
        c10d.ProcessGroupHCCL = ProcessGroupHCCL
        _C._distributed_c10d = c10d
        sys.modules[c10d.__name__] = c10d
    if getattr(dist, "is_hccl_available", None) is not is_hccl_available:
        _patches.patch(dist, "is_hccl_available", is_hccl_available, "distributed", checked=("2.13",),
                       expects=_patches.ABSENT,
                       reason="the Ascend adapter adds torch.distributed.is_hccl_available beside PyTorch's "
                              "is_nccl_available and is_gloo_available; vllm-ascend imports it")
    _default_to_the_npu_backend()


_register()
