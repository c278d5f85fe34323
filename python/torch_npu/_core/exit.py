"""What torch_npu does when the interpreter exits.

Backward of npu graphs runs on PyTorch's autograd thread for the npu device, as
on CUDA. After ``backward()`` has returned, that thread may still hold the
finished graph task for a moment, and with it the thread-local state of the
call (PyTorch stashes a Python ``contextvars`` context there for every
backward). Dropping it then needs the GIL; during interpreter finalisation
taking the GIL ends the thread inside a noexcept destructor, and the process
aborts ("terminate called without an active exception", about one exit in
three right after a backward). So at exit each npu autograd thread runs one
last, trivial backward, started with an empty thread-local state: it finishes
only after the thread has let go of the earlier task, and leaves nothing behind
that needs the GIL.
"""
import atexit
import os

import torch

from .. import _C
from . import patches as _patches

_ENGINE = torch.autograd.Variable._execution_engine


def _autograd_threads_started() -> bool:
    """Whether PyTorch started its autograd device threads (named pt_autograd_N), which
    it does at the first backward; without /proc, assume so."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().startswith("pt_autograd_"):
                    return True
        except OSError:
            continue
    return False


def _drain_autograd_device_threads() -> None:
    if not _C._is_initialized() or _C._is_in_bad_fork() or not _autograd_threads_started():
        return  # no npu work, or no backward: no npu autograd thread holds anything
    for index in range(_C._device_count()):
        try:
            with torch.enable_grad():
                # float32 whatever the default dtype: a native kernel on every device, never a fallback
                x = torch.ones(1, dtype=torch.float32, device=torch.device("npu", index), requires_grad=True)
                out = (x * 1).sum()
            # The engine itself, not torch.autograd.backward, which would stash a context again.
            _ENGINE.run_backward((out,), (torch.ones_like(out),), False, False, (), True, True)
        except Exception:  # noqa: BLE001  a device left in an error state: the others still drain
            continue


def install() -> None:
    _patches.record("autograd: drain the npu's autograd threads at exit", group="autograd", checked=("2.13",),
                    target=(_ENGINE, "run_backward"), expects="builtin_function_or_method",
                    reason="the drain calls the engine's run_backward(tensors, grads, keep_graph, create_graph, "
                           "inputs, allow_unreachable, accumulate_grad) directly: torch.autograd.backward would "
                           "stash a contextvars context in the thread-local state again")
    atexit.register(_drain_autograd_device_threads)
