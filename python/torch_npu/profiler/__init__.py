"""The npu in PyTorch's profiler: ``torch_npu.profiler`` is ``torch.profiler``
with the npu's device activities (csrc/profiler): kernels timed where they ran
and linked to the op that launched them, copies with their bytes, CPU
fallbacks, host waits for the device, and npu memory per op.

    from torch_npu.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU], profile_memory=True) as prof:
        model(x).sum().backward()
    print(prof.key_averages().table(sort_by="npu_time_total"))
    print(torch_npu.profiler.analyse(prof))

``torch.profiler.profile(activities=[ProfilerActivity.PrivateUse1])`` and
``torch.autograd.profiler.profile(use_device="npu")`` are the same profiler.

The changes to PyTorch's profiler classes (the ``npu_*`` aliases of the event
classes, ``use_device="npu"`` defaulting to Kineto) go through
:mod:`torch_npu._patches` in the group ``"profiler"``.
"""
import functools
import inspect

import torch
import torch.autograd.profiler as _autograd_profiler
from torch.autograd.profiler_util import FunctionEvent, FunctionEventAvg
from torch.profiler import (  # noqa: F401  (the public names of torch.profiler)
    ProfilerAction,
    ProfilerActivity,
    record_function,
    schedule,
    supported_activities,
    tensorboard_trace_handler,
)

from .. import _patches
from ._analyse import Analysis, analyse  # noqa: F401

GROUP = "profiler"

__all__ = ["profile", "ProfilerActivity", "ProfilerAction", "schedule", "tensorboard_trace_handler",
           "record_function", "supported_activities", "analyse", "Analysis"]


class profile(torch.profiler.profile):
    """``torch.profiler.profile``; also samples npu memory at each ``step()``
    (``step_memory``: (step, allocated bytes, reserved bytes)), which
    ``analyse`` reads for memory growth across steps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_memory = []

    def _sample_memory(self):
        if torch.npu.is_initialized():
            torch.npu.synchronize()
            self.step_memory.append((self.step_num, torch.npu.memory_allocated(), torch.npu.memory_reserved()))

    def start(self):
        self.step_memory = []
        super().start()

    def step(self):
        self._sample_memory()
        super().step()

    def stop(self):
        if not self.step_memory:  # no step() called: one sample for the whole run
            self._sample_memory()
        super().stop()


# The seed's names for the device columns, on events and averages alike, so
# that attributes and table(sort_by="npu_time_total") work.
_NPU_ALIASES = {
    "npu_time": "device_time",
    "npu_time_total": "device_time_total",
    "self_npu_time_total": "self_device_time_total",
    "npu_memory_usage": "device_memory_usage",
    "self_npu_memory_usage": "self_device_memory_usage",
}


def _install_aliases():
    for cls in (FunctionEvent, FunctionEventAvg):
        for alias, name in _NPU_ALIASES.items():
            if not hasattr(cls, alias):
                _patches.patch(cls, alias, property(functools.partial(lambda self, n: getattr(self, n), n=name)),
                               GROUP, checked=("2.13",), expects=_patches.ABSENT,
                               reason="PyTorch names its device columns device_*; scripts and sort_by keys written "
                                      "for the npu use npu_* names, which PyTorch has no way to alias")


def _profile_npu_through_kineto():
    """``torch.autograd.profiler.profile(use_device="npu")`` defaults to Kineto
    (the same device activities as torch.profiler); ``use_kineto=False`` still
    works, timing each op with npu events."""
    def defaulting_to_kineto(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            bound = signature.bind_partial(self, *args, **kwargs)
            if bound.arguments.get("use_device") == "npu" and "use_kineto" not in bound.arguments:
                kwargs["use_kineto"] = True
            original(self, *args, **kwargs)
        return __init__

    _patches.wrap(_autograd_profiler.profile, "__init__", defaulting_to_kineto, GROUP,  # once per process
                  checked=("2.13",),
                  expects="(self, enabled=True, *, use_cuda=False, use_device=None, record_shapes=False, "
                          "with_flops=False, profile_memory=False, with_stack=False, with_modules=False, "
                          "use_kineto=False, use_cpu=True, experimental_config=None, acc_events=False, "
                          "custom_trace_id_callback=None, post_processing_timeout_s=None, activity_filters=None)",
                  reason="the legacy profiler defaults to use_kineto=False, which times a PrivateUse1 device "
                         "with events per op; use_device='npu' should see the npu's Kineto activities")


_install_aliases()
_profile_npu_through_kineto()
