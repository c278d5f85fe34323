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

import torch

from . import _C


def _drain_autograd_device_threads() -> None:
    if not _C._is_initialized() or _C._is_in_bad_fork():
        return  # no npu work ran here (or it cannot run): no npu autograd thread to drain
    engine = torch.autograd.Variable._execution_engine
    for index in range(_C._device_count()):
        try:
            with torch.enable_grad():
                x = torch.ones(1, device=torch.device("npu", index), requires_grad=True)
                out = (x * 1).sum()
            # The engine itself, not torch.autograd.backward, which would stash a context again.
            engine.run_backward((out,), (torch.ones_like(out),), False, False, (), True, True)
        except Exception:  # noqa: BLE001  a device left in an error state: nothing more to do at exit
            return


def install() -> None:
    atexit.register(_drain_autograd_device_threads)
