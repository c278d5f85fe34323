"""Which implementation serves each aten op on the npu.

The answers come from PyTorch's dispatcher, not from a hand-kept list::

    >>> import torch_npu
    >>> torch_npu._ops_registry.get("add").backend      # a native npu kernel
    'npu'
    >>> torch_npu._ops_registry.get("linear").backend   # PyTorch decomposes it
    'composite'
    >>> torch_npu._ops_registry.backends_for_op("torch.exp")
    ['npu', 'cpu']
    >>> torch_npu._ops_registry.num_registered          # native kernels (overloads)
    1234

Names may be given as "add", "aten::add", "aten::add.Tensor", "torch.add",
"Tensor.add_" or "torch.ops.aten.add.Tensor", or as the operator itself
(``torch.ops.aten.add.Tensor``); anything else raises TypeError. Without an overload, the op's
primary overload answers.

Under a device profile (NPU_EMU_PROFILE=ascend910b2) the answers are the
chip's: an op outside its native set is "composite" or "cpu". Any profile can
be asked without switching to it::

    >>> torch_npu._ops_registry.get("_transformer_encoder_layer_fwd", profile="ascend910b2").backend
    'cpu'

Your own operators join the registry (see ``register``)::

    >>> torch_npu._ops_registry.register(name="my_custom_op", impl=lambda x, w: x * w, priority=200)
    >>> torch_npu._ops_registry.get("my_custom_op")
    OpInfo(name='npu::my_custom_op', backend='npu', priority=200, backends=['npu'])

backend is one of:
  "npu"        a native kernel of the npu op library (or a custom op) runs it;
  "composite"  PyTorch decomposes it into other ops, which run on the npu;
  "cpu"        it runs on the CPU through the fallback (see NPUFallbackMode);
  "none"       no implementation for the npu or the cpu exists.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from .. import _C
from .._emu import profiles as _profiles
from .custom import all_custom_ops, custom_op, register

__all__ = ["OpInfo", "contains", "get", "backends_for_op", "list_ops", "summary", "num_registered", "register"]


@dataclass(frozen=True)
class OpInfo:
    name: str          # "aten::add.Tensor"
    backend: str       # "npu", "composite", "cpu" or "none"
    priority: int      # of the implementation that serves it: native 100, composite 50, cpu fallback 0
    backends: List[str] = field(default_factory=list)  # every implementation that exists


def _info(resolved) -> OpInfo:
    name, backend, priority, backends = resolved
    return OpInfo(name, backend, priority, list(backends))


def _custom_info(op) -> OpInfo:
    best = op.best("npu") or op.best("cpu")
    backends = [d for d in ("npu", "cpu") if op.best(d) is not None]
    return OpInfo(op.qualified_name, best.device, best.priority, backends)


def _op_name(name) -> str:
    """``name`` as text: a string, or an operator object (torch.ops.aten.add.Tensor, torch.ops.aten.add)."""
    if isinstance(name, str):
        return name
    if isinstance(name, torch._ops.OpOverload):
        return name.name()
    if isinstance(name, torch._ops.OpOverloadPacket):
        return name._qualified_op_name
    raise TypeError(f"torch_npu._ops_registry: the operator name must be a str (e.g. 'add', 'aten::add.Tensor') "
                    f"or an operator such as torch.ops.aten.add.Tensor, got name={name!r} "
                    f"({type(name).__name__})")


def _profile(profile: Optional[str]) -> Optional[str]:
    """``profile`` defined in C++ (None: the active one)."""
    if profile is not None:
        _profiles.define(profile)
    return profile


def get(name: str, profile: Optional[str] = None) -> Optional[OpInfo]:
    """How the npu runs ``name`` (under device profile ``profile``, default the active one), or None if no
    such operator exists."""
    name = _op_name(name)
    profile = _profile(profile)
    op = custom_op(name)
    if op is not None:
        return _custom_info(op)
    resolved = _C._resolve_op(name, profile)
    return None if resolved is None else _info(resolved)


def contains(name: str, profile: Optional[str] = None) -> bool:
    """True if ``name`` has a native npu kernel (it runs on the npu without decomposition)."""
    info = get(name, profile)
    return info is not None and info.backend == "npu"


def backends_for_op(name: str, profile: Optional[str] = None) -> List[str]:
    """Every implementation of ``name`` that exists, e.g. ["npu", "cpu"]; [] if unknown."""
    info = get(name, profile)
    return [] if info is None else info.backends


def list_ops(backend: Optional[str] = None, profile: Optional[str] = None) -> List[OpInfo]:
    """All aten operators (each overload) and custom npu ops, optionally only those served by ``backend``."""
    if backend not in (None, "npu", "composite", "cpu", "none"):
        raise ValueError(f"backend must be 'npu', 'composite', 'cpu', 'none' or None, got {backend!r}")
    ops = [_info(r) for r in _C._all_ops(_profile(profile)) if r[0].startswith("aten::")]
    ops += [_custom_info(op) for op in all_custom_ops()]
    return [op for op in ops if backend is None or op.backend == backend]


def summary(profile: Optional[str] = None) -> Dict[str, int]:
    """How many operators (aten and custom) each backend serves."""
    counts: Dict[str, int] = {}
    for op in list_ops(profile=profile):
        counts[op.backend] = counts.get(op.backend, 0) + 1
    return counts


def __getattr__(name: str):
    if name == "num_registered":
        return _C._num_native_kernels()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
