"""Inductor's code generation for the npu: its C++ kernels, launched in stream order.

The emulated npu's memory is host memory, so the kernels inductor's C++ backend
writes for the CPU run on npu tensors as they are. What differs from the CPU is
order: eager npu work is queued to a stream, while a generated kernel runs on the
thread that calls it. So before each kernel the wrapper waits for the current
stream (``_C._wait_current_stream``; an idle stream costs a check), and the work
queued after it is ordered behind it because it was launched later.

Loaded by inductor's backend registration through ``torch.npu.Scheduling`` etc.
(``register()`` runs on first access), which also teaches inductor, in three
places that test for ``device.type == "cpu"``, that the npu is served by its C++
backend.
"""
import functools

import torch
from torch._inductor import scheduler as _scheduler
from torch._inductor import utils as _utils
from torch._inductor.codegen import common as _common
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen  # noqa: F401  (torch.npu.WrapperFxCodegen)
from torch._inductor.virtualized import V

_CPU = torch.device("cpu")

# The C++ kernels take the stream they run after from here.
_WAIT = "torch_npu._C._wait_current_stream"

Scheduling = CppScheduling


class _StreamOrdered:
    """Makes a wrapper launch C++ kernels of npu buffers after the current stream's work."""

    def write_header(self):
        super().write_header()
        self.imports.writeline("import torch_npu._C")

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if not triton and device.type == "npu":
            self.writeline(f"{_WAIT}({device.index if device.index is not None else -1})")
            device = _CPU
        return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)


class _NpuSubgraphWrapperCodegen(_StreamOrdered, SubgraphPythonWrapperCodegen):
    def write_header(self):   # a subgraph's code lives in its parent's module
        SubgraphPythonWrapperCodegen.write_header(self)


class NpuWrapperCodegen(_StreamOrdered, PythonWrapperCodegen):
    """The Python wrapper of a compiled npu graph."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return _NpuSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NpuWrapperCodegen()


class NpuCppWrapperCodegen(CppWrapperCpu):
    """cpp_wrapper=True (AOTInductor's C++ wrapper) is not available for the npu."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        raise RuntimeError(
            "torch.compile on the npu: the C++ wrapper (torch._inductor.config.cpp_wrapper=True, AOTInductor) "
            "is not supported for the npu; compile with the default Python wrapper (cpp_wrapper=False)")


class NpuDeviceOpOverrides(CpuDeviceOpOverrides):
    def import_get_raw_stream_as(self, name):
        return f"def {name}(index):\n    return torch.npu.current_stream(index).stream_id\n"

    def set_device(self, device_idx):
        return f"torch.npu.set_device({device_idx})"

    def synchronize(self):
        return "torch.npu.synchronize()"

    def device_guard(self, device_idx):
        return f"torch.npu.device({device_idx})"


def _served_by_cpp(device):
    return device is not None and device.type in ("cpu", "npu")


@functools.cache
def register():
    """Teaches inductor that npu nodes are compiled by its C++ backend."""
    _common.register_device_op_overrides("npu", NpuDeviceOpOverrides())

    # Loop reordering after fusion is for Triton; inductor skips it for "cpu" nodes only.
    def is_cpu(node):
        return _served_by_cpp(node.get_device())

    _scheduler.BaseSchedulerNode.is_cpu = is_cpu

    # Which backend's rules (dtypes, CSE) apply: "cpp" for the npu, not Triton's.
    original = _utils.get_current_backend

    @functools.wraps(original)
    def get_current_backend(device_type=None):
        if not device_type:
            device_type = V.graph.get_current_device_or_throw().type
        if device_type == "npu":
            return torch._inductor.config.cpu_backend
        return original(device_type)

    # The npu's convolution returns contiguous results (PyTorch's promise for a
    # PrivateUse1 convolution), so laying npu graphs out channels-last, which
    # inductor's GPU heuristics may choose, would only add copies around each conv.
    from torch._inductor.graph import GraphLowering
    decide = GraphLowering.decide_layout_opt

    def decide_layout_opt(gm, *, is_inference):
        convs = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
        if convs and all(n.args[0].meta["val"].device.type == "npu" for n in convs):
            return False
        return decide(gm, is_inference=is_inference)

    GraphLowering.decide_layout_opt = staticmethod(decide_layout_opt)

    for module in (_utils, _common, _scheduler):
        if getattr(module, "get_current_backend", None) is original:
            module.get_current_backend = get_current_backend
    try:
        from torch._inductor.kernel import mm_common
        if mm_common.get_current_backend is original:
            mm_common.get_current_backend = get_current_backend
    except ImportError:
        pass
