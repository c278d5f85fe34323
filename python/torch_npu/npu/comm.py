"""Collectives between the npu devices of one process (torch.cuda.comm's), used by
``nn.DataParallel``: broadcast, scatter, gather, reduce_add and their coalesced forms.

PyTorch's ``torch.nn.parallel.comm`` calls C++ functions that exist in CUDA builds only;
for npu tensors its functions come here (through :mod:`torch_npu._patches`, group
"comm"), and other devices keep PyTorch's path. Each copy is a device-to-device copy in
stream order (csrc/core/copy.cpp): the destination's stream waits for the source's work.
"""
from typing import List, Optional, Sequence

import torch

from ._device import _get_device_index

__all__ = ["broadcast", "broadcast_coalesced", "reduce_add", "reduce_add_coalesced", "scatter", "gather"]


def _npu_device(device) -> torch.device:
    if isinstance(device, torch.device) and device.type == "cpu":
        return device
    if device == -1:
        return torch.device("cpu")
    return torch.device("npu", _get_device_index(device, optional=False))


def broadcast(tensor: torch.Tensor, devices: Optional[Sequence] = None, *, out=None) -> tuple:
    """``tensor`` copied to each of ``devices`` (or into each tensor of ``out``)."""
    if (devices is None) == (out is None):
        raise RuntimeError("torch.npu.comm.broadcast: give exactly one of devices and out "
                           f"(got devices={devices} and out={out})")
    if out is not None:
        for o in out:
            o.copy_(tensor)
        return tuple(out)
    return tuple(tensor if _npu_device(d) == tensor.device else tensor.to(_npu_device(d)) for d in devices)


def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence, buffer_size: int = 10485760) -> List[tuple]:
    """Each tensor of ``tensors`` copied to each of ``devices``: one tuple per device."""
    return [tuple(t if t.device == _npu_device(d) else t.to(_npu_device(d)) for t in tensors) for d in devices]


def reduce_add(inputs: Sequence[torch.Tensor], destination=None) -> torch.Tensor:
    """The sum of ``inputs`` (one per device, same shape) on ``destination`` (default: the current device)."""
    if not inputs:
        raise RuntimeError("torch.npu.comm.reduce_add: expected at least one tensor")
    shape = inputs[0].shape
    for i, t in enumerate(inputs):
        if t.shape != shape:
            raise ValueError(f"torch.npu.comm.reduce_add: input {i} has shape {tuple(t.shape)}, expected "
                             f"{tuple(shape)} (the first input's)")
    target = _npu_device(destination if destination is not None else torch.npu.current_device())
    result = inputs[0].to(target, copy=True)
    for t in inputs[1:]:
        result.add_(t.to(target))
    return result


def reduce_add_coalesced(inputs: Sequence[Sequence[torch.Tensor]], destination=None,
                         buffer_size: int = 10485760) -> tuple:
    """reduce_add of each position of ``inputs`` (a sequence of tensors per device)."""
    return tuple(reduce_add(list(column), destination) for column in zip(*inputs))


def scatter(tensor: torch.Tensor, devices: Optional[Sequence] = None, chunk_sizes=None, dim: int = 0, streams=None,
            *, out=None) -> tuple:
    """``tensor`` split along ``dim`` (by ``chunk_sizes``, or evenly) and each piece copied to its device."""
    if out is not None:
        if devices is not None or chunk_sizes is not None:
            raise RuntimeError("torch.npu.comm.scatter: with out=, devices and chunk_sizes must be None")
        pieces = tensor.split([o.shape[dim] for o in out], dim)
        for o, p in zip(out, pieces):
            o.copy_(p)
        return tuple(out)
    if devices is None:
        raise RuntimeError("torch.npu.comm.scatter: give devices or out")
    devices = [_npu_device(d) for d in devices]
    pieces = tensor.split(list(chunk_sizes), dim) if chunk_sizes is not None else tensor.chunk(len(devices), dim)
    results = []
    for i, (piece, device) in enumerate(zip(pieces, devices)):
        stream = streams[i] if streams else None
        with torch.npu.stream(stream) if stream is not None else _nothing():
            results.append(piece.contiguous() if piece.device == device else piece.to(device))
    return tuple(results)


def gather(tensors: Sequence[torch.Tensor], dim: int = 0, destination=None, *, out=None) -> torch.Tensor:
    """``tensors`` (one per device) concatenated along ``dim`` on ``destination`` (default:
    the current device; -1 or "cpu": the host), or into ``out``."""
    if out is not None:
        if destination is not None:
            raise RuntimeError("torch.npu.comm.gather: with out=, destination must be None")
        return torch.cat([t.to(out.device) for t in tensors], dim, out=out)
    target = _npu_device(destination if destination is not None else torch.npu.current_device())
    return torch.cat([t.to(target) for t in tensors], dim)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _any_npu(values) -> bool:
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type == "npu":
            return True
        if isinstance(v, (list, tuple)) and _any_npu(v):
            return True
    return False


def install() -> None:
    """torch.nn.parallel.comm's functions take npu tensors here (nn.DataParallel over npus)."""
    import functools

    from torch.nn.parallel import comm as pytorch_comm

    from .._core import patches as _patches
    ours = {"broadcast": broadcast, "broadcast_coalesced": broadcast_coalesced, "reduce_add": reduce_add,
            "reduce_add_coalesced": reduce_add_coalesced, "scatter": scatter, "gather": gather}
    expects = {"broadcast": "(tensor, devices=None, *, out=None)",
               "broadcast_coalesced": "(tensors, devices, buffer_size=10485760)",
               "reduce_add": "(inputs, destination=None)",
               "reduce_add_coalesced": "(inputs, destination=None, buffer_size=10485760)",
               "scatter": "(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None)",
               "gather": "(tensors, dim=0, destination=None, *, out=None)"}

    def routed(name):
        def make(original):
            @functools.wraps(original)
            def comm_function(*args, **kwargs):
                if _any_npu(args) or _any_npu(kwargs.values()):
                    return ours[name](*args, **kwargs)
                return original(*args, **kwargs)
            return comm_function
        return make

    for name in ours:
        _patches.wrap(pytorch_comm, name, routed(name), "comm", checked=("2.13",), expects=expects[name],
                      reason="torch.nn.parallel.comm calls C++ collectives built for CUDA only (it imports "
                             "torch.cuda.nccl) and has no extension point for another device: npu tensors "
                             "(nn.DataParallel over npu devices) are copied between devices here instead")
