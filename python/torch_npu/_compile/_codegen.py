"""Inductor's code generation for the npu: its C++ kernels, launched in stream order.

The emulated npu's memory is host memory, so the kernels inductor's C++ backend
writes for the CPU run on npu tensors as they are. What differs from the CPU is
order: eager npu work is queued to a stream, while a generated kernel runs on the
thread that calls it. So each kernel runs as work of the current stream
(``_C._run_in_stream_order(device, name, kernel, *args)``: it holds the stream while the kernel runs, after the
work queued before it; an idle stream costs a check), and the work queued after it
is ordered behind it because it was launched later.

Registered through inductor's own extension points: ``register_backend()`` (when
``torch._inductor.compile_fx`` loads) calls ``register_backend_for_device`` and
``register_device_op_overrides``; inductor's own registration, which reads
``torch.npu.Scheduling`` and the wrappers, finds them too (torch_npu._compile provides
those names on torch.npu). ``register()`` also installs what has no extension point:
the rules that make inductor compile npu graphs as cpu graphs (``_host_codegen``: the
C++ backend is the host's) and the npu's graph policy (``npugraphs.install()``).
"""
import functools
import hashlib
import pathlib

import torch
from torch._inductor.custom_graph_pass import CustomGraphModulePass
from torch._inductor.codegen import common as _common
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen  # noqa: F401  (torch.npu.WrapperFxCodegen)
from torch._inductor.virtualized import V

from . import _host_codegen, npugraphs

_CPU = torch.device("cpu")

# The C++ kernels run as work of the current stream through this: in stream order.
_RUN = "torch_npu._C._run_in_stream_order"

Scheduling = CppScheduling


class _StreamOrdered:
    """Makes a wrapper launch C++ kernels of npu buffers after the current stream's work."""

    def write_header(self):
        super().write_header()
        self.imports.writeline("import torch_npu._C")

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if not triton and device.type == "npu":
            index = device.index if device.index is not None else -1
            return super()._generate_kernel_call_helper(_RUN, [str(index), repr(kernel_name), kernel_name, *call_args],
                                                        device=_CPU,
                                                        triton=triton, **kwargs)
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


# The sources that decide the code inductor generates for the npu: this module and its host rules.
SOURCES = (pathlib.Path(__file__), pathlib.Path(_host_codegen.__file__))


class _CodegenVersion(CustomGraphModulePass):
    """The npu's pass over its graphs in inductor's post-grad passes: none, but its uuid
    enters inductor's cache keys, so code cached by another version of these modules
    (SOURCES: their source differs) is never loaded for the npu."""

    _uuid = hashlib.sha256(b"".join(path.read_bytes() for path in SOURCES)).hexdigest()

    def __call__(self, gm):
        pass

    def uuid(self):
        return self._uuid


def register_backend():
    """Registers the npu's scheduling and wrappers with inductor (its official
    ``register_backend_for_device``), with the pass whose uuid versions its cache."""
    _common.register_backend_for_device("npu", Scheduling, NpuWrapperCodegen, NpuCppWrapperCodegen,
                                        WrapperFxCodegen, device_custom_pass=_CodegenVersion())
    register()


@functools.cache
def register():
    """The npu's device op overrides (inductor's extension point), then what has none: the host
    backend's rules (``_host_codegen.install()``) and the graph policy (``npugraphs.install()``),
    once (``_patches.undo("compile")`` takes those back for the rest of the process)."""
    _common.register_device_op_overrides("npu", NpuDeviceOpOverrides())
    _host_codegen.install()
    npugraphs.install()
