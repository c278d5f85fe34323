"""What ``import torch_npu`` does, in order: one table.

``torch_npu/__init__.py`` runs ``install()`` (every row of STEPS, top to bottom), binds the
public names, then runs ``install_opt_ins()`` (OPT_INS). Each row names the step, says what
it installs and why it comes where it does; the step's function does only that. Changes to
PyTorch's own objects are made by the features themselves, through the ledger
(``torch_npu._core.patches``), in the groups the rows name.

This module is the package's composition root: it is the one module of ``_core`` that
imports upward (inside the steps, because the order of the imports is the order of the
installation), and nothing but ``torch_npu/__init__.py`` imports it.
"""
import os
from typing import Callable, NamedTuple

import torch


class Step(NamedTuple):
    name: str
    run: Callable[[], None]
    why: str    # what it installs, and why here


def _ascend_environment():
    from . import env
    env.apply()


def _host_allocator():
    from .. import _C  # noqa: F401  (loading the extension wraps the CPU allocator: host_execution.cpp)
    from . import patches
    patches.record_host_allocator_redirect()


def _chip_profile():
    from .._emu import profiles
    profiles.from_environment()


def _runtime_environment():
    from .. import _C
    problem = _C._runtime_environment_error()
    if problem:
        raise RuntimeError(f"torch_npu: {problem}")


def _device():
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    from .. import npu   # (its classes need the renamed backend)
    torch._register_device_module("npu", npu)
    if not hasattr(torch.Tensor, "npu"):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)


def _ops():
    from ..ops import attention, custom, formats, fused, inference, moe_quant, position, registry  # noqa: F401


def _optimizers_and_utils():
    from .. import optim, utils  # noqa: F401


def _profiler():
    from .. import profiler  # noqa: F401


def _fallback():
    from .. import fallback
    fallback._install()


def _data_parallel():
    from ..npu import comm
    comm.install()


def _compile():
    from .._compile import _hooks
    _hooks.install()


def _distributed():
    from .. import distributed  # noqa: F401


def _multiprocessing():
    from ..npu import _multiprocessing
    _multiprocessing.install()


def _exit():
    from . import exit
    exit.install()


STEPS = (
    Step("ascend_env", _ascend_environment,
         "the Ascend adapter's switches (ASCEND_LAUNCH_BLOCKING, ASCEND_RT_VISIBLE_DEVICES, ...) become torch_npu's "
         "own NPU_* ones: first, before anything reads those"),
    Step("host_allocator", _host_allocator,
         "loading torch_npu._C wraps the process's CPU allocator: entered in the ledger (group host_execution)"),
    Step("chip_profile", _chip_profile,
         "NPU_EMU_PROFILE picks the emulated chip, whose memory becomes NPU_EMU_MEMORY's default: before the "
         "emulator reads NPU_EMU_MEMORY"),
    Step("runtime_environment", _runtime_environment,
         "a bad NPU_HAL or NPU_EMU_* value fails the import, naming it, rather than the first npu call"),
    Step("device", _device,
         "PyTorch's PrivateUse1 backend is named npu, torch.npu is registered as its device module, and "
         "tensor.npu(), module.npu() ... are generated (official APIs); everything below uses the npu device"),
    Step("ops", _ops,
         "the npu ops' Python kernels and derivatives (torch.library) and the op registry; the C++ ops are "
         "registered by _C"),
    Step("optim_utils", _optimizers_and_utils,
         "torch_npu.optim (the Ascend fused optimizers) and torch_npu.utils (the names tools reach by path)"),
    Step("profiler", _profiler,
         "torch_npu.profiler: use_device='npu' through Kineto and the chip projections (ledger group profiler)"),
    Step("fallback", _fallback,
         "the CPU fallback's NPU_FALLBACK_* settings (a bad value fails the import) and its logger"),
    Step("data_parallel", _data_parallel,
         "torch.nn.parallel.comm takes npu tensors (nn.DataParallel; ledger group comm)"),
    Step("compile", _compile,
         "import hooks register the npu with dynamo and inductor when PyTorch loads them (nothing heavy now)"),
    Step("distributed", _distributed,
         "the 'hccl' c10d backend for npu and cpu tensors (ledger group distributed)"),
    Step("multiprocessing", _multiprocessing,
         "torch.multiprocessing shares npu tensors by handle and refuses npu storages (ledger group "
         "multiprocessing): after npu.streams, whose Event it sends"),
    Step("exit", _exit,
         "at exit, the npu's autograd threads are drained (an atexit handler; ledger group autograd)"),
)


def _switched_on(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _transfer_to_npu():
    if _switched_on("TORCH_TRANSFER_TO_NPU"):
        from ..contrib import transfer_to_npu  # noqa: F401


OPT_INS = (
    Step("transfer_to_npu", _transfer_to_npu,
         "TORCH_TRANSFER_TO_NPU=1: a script written for CUDA runs on the npu with no change at all, not even an "
         "import of torch_npu (torch imports the package through its torch.backends entry point), as when it "
         "imports torch_npu.contrib.transfer_to_npu itself: on the complete package, after its public names"),
)


def install():
    """Runs STEPS, in order."""
    for step in STEPS:
        step.run()


def install_opt_ins():
    """Runs OPT_INS (each does something only when its switch is on)."""
    for step in OPT_INS:
        step.run()
