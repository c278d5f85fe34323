"""Inductor's C++ backend for the npu: the changes to inductor that make npu graphs compile as cpu graphs do.

The emulated npu's memory is host memory, so the npu reuses inductor's C++ (CPU) backend
(``_codegen.Scheduling`` is its ``CppScheduling``). Inductor asks "is this the cpu?" at
places where it means "is this compiled by the C++ backend?"; where the answer changes the
kernels, each function below answers yes for the npu, so an npu graph gets the kernels a cpu
graph gets (the benchmarks compare them). None of this has an extension point in inductor
(``register_backend_for_device`` picks the scheduling, not these rules); they exist only
because the backend is the host's, and belong with it: a device whose kernels are not host
code replaces this module and ``_codegen.Scheduling``, not the rest of ``_compile``.

Every change goes through :mod:`torch_npu._patches` in the group ``"compile"``, each with the
reason inductor's own rule does not serve the npu; ``install()`` makes them once, when inductor
first registers the npu (``_codegen.register()``). The source of this module is part of the
version inductor's cache keys carry (``_codegen._CodegenVersion``): it decides the kernels.
"""
import contextlib
import functools
import sys
import threading

import sympy

import torch
from torch._inductor import ir as _ir
from torch._inductor import lowering as _lowering
from torch._inductor import scheduler as _scheduler
from torch._inductor import utils as _utils
from torch._inductor.utils import sympy_product
from torch._inductor.virtualized import V

from .._core import patches as _patches
from . import GROUP

CHECKED = ("2.13",)   # the torch versions every change below was checked against (torch_npu._patches)


def _served_by_cpp(device):
    return device is not None and device.type in ("cpu", "npu")


def _on_npu(node):
    device = node.get_device() if hasattr(node, "get_device") else None
    return device is not None and device.type == "npu"


def _patch(owner, name, value, *, reason, expects):
    """``owner.name = value`` (``owner[name]`` for a dict), undone by ``_patches.undo("compile")``."""
    return _patches.patch(owner, name, value, GROUP, reason=reason, checked=CHECKED, expects=expects)


def _wrap(owner, name, make, *, reason, expects):
    """Replaces ``owner.name`` by ``make(original)`` there only."""
    return _patches.wrap(owner, name, lambda original: functools.wraps(original)(make(original)), GROUP,
                         reason=reason, checked=CHECKED, expects=expects)


def _replace(module, name, make, *, reason, expects):
    """Replaces ``module.name`` by ``make(original)``, also where other inductor modules
    imported it by name and where it is registered as a lowering."""
    original = getattr(module, name)
    replacement = functools.wraps(original)(make(original))
    for m in list(sys.modules.values()):
        if getattr(m, "__name__", "").startswith("torch._inductor") and getattr(m, name, None) is original:
            _patch(m, name, replacement, reason=reason, expects=expects)
    for op, lowering in list(_lowering.lowerings.items()):
        if lowering is original:
            _patch(_lowering.lowerings, op, replacement, reason=reason, expects=expects)


# What the current thread's lowering has asked for (see _arg_reductions, _division).
_lowering_state = threading.local()


@contextlib.contextmanager
def _flagged(name):
    """Sets ``_lowering_state.<name>`` for this thread for the duration."""
    previous = getattr(_lowering_state, name, False)
    setattr(_lowering_state, name, True)
    try:
        yield
    finally:
        setattr(_lowering_state, name, previous)


# Inductor asks "is this the cpu?" where it means "is this compiled by the C++
# backend?". Each function below answers yes for the npu at one such place, so
# an npu graph gets the kernels a cpu graph gets (the benchmarks compare them).

def _scheduler_nodes():
    # Loop reordering after fusion is for Triton; inductor skips it for "cpu" nodes only.
    _patch(_scheduler.BaseSchedulerNode, "is_cpu", lambda node: _served_by_cpp(node.get_device()), expects="(self)",
           reason="the scheduler asks node.is_cpu() where it means 'compiled by the C++ backend' (loop reordering "
                  "after fusion is for Triton)")


def _realization_heuristics():
    # When to materialise a pointwise result (op counts, reads, reuse of heavy ops).
    _replace(_ir, "is_cpu", lambda original: lambda x: original(x) or _ir.get_device_type(x) == "npu",
             expects="(x)", reason="inductor's realization heuristics ask ir.is_cpu(x) where they mean 'compiled "
                                   "by the C++ backend'")


def _backend_rules():
    # Which backend's rules (dtypes, CSE) apply: "cpp" for the npu, not Triton's.
    def make(original):
        def get_current_backend(device_type=None):
            if not device_type:
                device_type = V.graph.get_current_device_or_throw().type
            if device_type == "npu":
                return torch._inductor.config.cpu_backend
            return original(device_type)
        return get_current_backend
    _replace(_utils, "get_current_backend", make, expects="(device_type=None)",
             reason="inductor picks a backend's rules by device type and knows no backend for 'npu': the npu's is "
                    "the C++ backend (config.cpu_backend)")


def _concatenation():
    # The C++ backend concatenates by writing each input into its slice of the
    # result (ConcatKernel); a masked "pointwise cat", Triton's choice, does not
    # vectorise there (2.4x slower for the backward of a SwiGLU). Right-padding
    # is not rewritten into a cat either, as on the cpu.
    def make_cat(original):
        def pointwise_cat(inputs, dim=0):
            if _on_npu(inputs[0]) and not torch._inductor.config.force_pointwise_cat:
                return _lowering.TensorBox(_ir.ConcatKernel.create(inputs, dim))
            return original(inputs, dim)
        return pointwise_cat

    def make_pad(original):
        def pad_as_cat(x, padding, fill_value):
            return None if _on_npu(x) else original(x, padding, fill_value)
        return pad_as_cat

    _replace(_lowering, "pointwise_cat", make_cat, expects="(inputs, dim=0)",
             reason="inductor concatenates with a masked pointwise kernel except on device.type == 'cpu'; the C++ "
                    "backend's ConcatKernel is the fast one for the npu too")
    _replace(_lowering, "_pad_as_cat", make_pad, expects="(x, padding, fill_value)",
             reason="inductor rewrites right-padding into a cat except on device.type == 'cpu'; the npu is served "
                    "by the C++ backend, where it does not pay")


_ARG_REDUCTIONS = frozenset(("argmax", "argmin", "argmax_value", "argmin_value", "argmax_with_value",
                             "argmin_with_value"))


def _arg_reductions():
    # argmax/argmin over several dims of a transposed or strided tensor must
    # count positions in the logical order; inductor does so for Triton and the
    # C++ backend ("is_triton(x) or cpu"). Without this the npu returned the
    # position in memory: a wrong answer, not a slow one.
    def make_inner(original):
        def make_reduction_inner(x, *, reduction_type=None, **kwargs):
            if reduction_type in _ARG_REDUCTIONS and _on_npu(x):
                with _flagged("arg_reduction"):
                    return original(x, reduction_type=reduction_type, **kwargs)
            return original(x, reduction_type=reduction_type, **kwargs)
        return make_reduction_inner

    def make_is_triton(original):
        def is_triton(node):
            return (getattr(_lowering_state, "arg_reduction", False) and _on_npu(node)) or original(node)
        return is_triton

    _replace(_lowering, "_make_reduction_inner", make_inner,
             expects="(x, *, axis, keepdims, dtype, override_return_dtype, reduction_type=None)",
             reason="inductor counts argmax/argmin positions in logical order only for Triton or device.type == "
                    "'cpu': it flags those reductions of npu inputs (without it they return memory positions)")
    _wrap(_lowering, "is_triton", make_is_triton, expects="(x)",
          reason="inductor counts argmax/argmin positions in logical order only for Triton or device.type == "
                 "'cpu': a flagged npu reduction answers yes")


def _division():
    # x / constant stays a division, as on the cpu: multiplying by the
    # reciprocal (the GPU rewrite) rounds differently from eager's kernels.
    def make_div(original):
        def div_prim(a, b):
            if _on_npu(a) or _on_npu(b):
                with _flagged("keep_division"):
                    return original(a, b)
            return original(a, b)
        return div_prim

    def make_constant(original):
        def get_constant_value(x):
            return None if getattr(_lowering_state, "keep_division", False) else original(x)
        return get_constant_value

    _replace(_lowering, "div_prim", make_div, expects="(a, b)",
             reason="inductor turns x / constant into a multiplication by the reciprocal except on device.type == "
                    "'cpu': npu divisions are flagged to stay divisions, rounding as eager does")
    _wrap(_lowering, "get_constant_value", make_constant, expects="(x)",
          reason="inductor turns x / constant into a multiplication by the reciprocal except on device.type == "
                 "'cpu': a flagged npu division sees no constant")


def _variance():
    # var/var_mean of up to config.cpp.use_two_step_variance_threshold elements
    # are computed in two passes (mean, then squared deviations), as on the cpu
    # (inductor's rule for "cpu", restated: it tests the device type).
    def make(original):
        def use_two_step_variance(x, axis, keepdim, input_dtype):
            if not _on_npu(x):
                return original(x, axis, keepdim, input_dtype)
            kwargs = _lowering._make_reduction_inner(x, axis=axis, keepdims=keepdim, dtype=None,
                                                     override_return_dtype=None)
            numel = sympy_product(kwargs["reduction_ranges"])
            if not isinstance(numel, sympy.Integer):
                return False
            return (int(numel) <= torch._inductor.config.cpp.use_two_step_variance_threshold
                    and sympy_product(kwargs["ranges"]) != 1)
        return use_two_step_variance
    _replace(_lowering, "use_two_step_variance", make, expects="(x, axis, keepdim, input_dtype)",
             reason="inductor's two-pass variance rule for small reductions tests device.type == 'cpu': npu "
                    "reductions, compiled by the C++ backend, need the same rule")


def _scatter():
    # scatter_reduce(sum) runs ATen's kernel rather than generated atomics, as on the cpu.
    def make(original):
        def use_scatter_fallback(op_overload, reduction_type, self_dtype, src_dtype, src_device_type, src_is_tensor):
            device_type = "cpu" if src_device_type == "npu" else src_device_type
            return original(op_overload, reduction_type, self_dtype, src_dtype, device_type, src_is_tensor)
        return use_scatter_fallback
    _replace(_utils, "use_scatter_fallback", make,
             expects="(op_overload, reduction_type, self_dtype, src_dtype, src_device_type, src_is_tensor)",
             reason="inductor keeps ATen's scatter_reduce(sum) only for src_device_type == 'cpu'; the npu's C++ "
                    "backend has no atomics either")


def _layout():
    # The npu's convolution returns contiguous results (PyTorch's promise for a
    # PrivateUse1 convolution), so laying npu graphs out channels-last, which
    # inductor's GPU heuristics may choose, would only add copies around each conv.
    from torch._inductor.graph import GraphLowering

    def make(decide):
        def decide_layout_opt(gm, *, is_inference):
            convs = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
            if convs and all(n.args[0].meta["val"].device.type == "npu" for n in convs):
                return False
            return decide(gm, is_inference=is_inference)
        return staticmethod(decide_layout_opt)

    _patches.wrap(GraphLowering, "decide_layout_opt", make, GROUP, checked=CHECKED,
                  expects="staticmethod (gm, *, is_inference)",
                  reason="inductor may lay convolution graphs out channels-last by GPU heuristics; the npu's "
                         "convolution returns contiguous results, so that only adds copies")


@functools.cache
def install():
    """Teaches inductor that npu nodes are compiled by its C++ backend (once: ``_patches.undo("compile")``
    takes it back for the rest of the process)."""
    for teach in (_scheduler_nodes, _realization_heuristics, _backend_rules, _concatenation, _arg_reductions,
                  _division, _variance, _scatter, _layout):
        teach()
