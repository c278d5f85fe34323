"""The Ascend adapter's names for the profiler's device columns, opt-in.

Scripts written for the Ascend adapter read ``npu_time_total``, ``self_npu_time_total``,
``npu_memory_usage``... on events and averages, and pass them as ``sort_by`` keys;
PyTorch names those columns ``device_*`` and has no way to alias them. So the aliases are
properties added to PyTorch's ``FunctionEvent`` and ``FunctionEventAvg``: ten changes to
PyTorch's classes, made only when asked for, by

* ``torch_npu.profiler.enable_npu_column_aliases()``, in a script that uses the names, or
* ``import torch_npu.contrib.transfer_to_npu`` (also ``TORCH_TRANSFER_TO_NPU=1`` and the
  doctor's default), the switch for scripts that run here unchanged.

They go through :mod:`torch_npu._patches` in the group ``"profiler_aliases"``:
``torch_npu._patches.undo("profiler_aliases")`` takes them back.
"""
import functools

from torch.autograd.profiler_util import FunctionEvent, FunctionEventAvg

from .._core import patches as _patches

GROUP = "profiler_aliases"

# The Ascend adapter's names for the device columns, on events and averages alike, so
# that attributes and table(sort_by="npu_time_total") work.
NPU_ALIASES = {
    "npu_time": "device_time",
    "npu_time_total": "device_time_total",
    "self_npu_time_total": "self_device_time_total",
    "npu_memory_usage": "device_memory_usage",
    "self_npu_memory_usage": "self_device_memory_usage",
}


def enable_npu_column_aliases() -> None:
    """Makes the ``npu_*`` names of the device columns (``npu_time_total``,
    ``self_npu_time_total``, ``npu_memory_usage``, ``self_npu_memory_usage``, ``npu_time``)
    work on profiler events and averages and as ``sort_by`` keys, beside PyTorch's
    ``device_*``. Calling it again changes nothing."""
    for cls in (FunctionEvent, FunctionEventAvg):
        for alias, name in NPU_ALIASES.items():
            if not hasattr(cls, alias):
                _patches.patch(cls, alias, property(functools.partial(lambda self, n: getattr(self, n), n=name)),
                               GROUP, checked=("2.13",), expects=_patches.ABSENT,
                               reason="PyTorch names its device columns device_*; scripts and sort_by keys written "
                                      "for the Ascend adapter use npu_* names, which PyTorch has no way to alias "
                                      "(opt-in: enable_npu_column_aliases() or transfer_to_npu)")
