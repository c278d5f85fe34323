"""The Ascend adapter's overflow-status names, which its tools call (msprobe's overflow check
calls ``torch.npu.clear_npu_overflow_flag()`` before each API it reruns and
``torch_npu.npu.utils.npu_check_overflow(out)`` after), with their meaning on the Ascend adapter:

* A chip without inf/nan (the 910A and 310P profiles) saturates float16 overflow to +-65504 and
  raises its overflow flag (its float status register; one per process here). There
  ``get_npu_overflow_flag()`` says whether the flag is up, ``clear_npu_overflow_flag()`` lowers it,
  and ``npu_check_overflow(tensor)`` reads and lowers it.
* A chip with inf/nan (910B, A3, the generic profile) writes inf and nan as the CPU does; its
  flag is not how overflow shows. There ``npu_check_overflow(tensor)`` checks the tensor itself,
  ``get_npu_overflow_flag()`` raises (as on the Ascend adapter, which says to use
  npu_check_overflow) and ``clear_npu_overflow_flag()`` does nothing.
"""
import math

import torch

from torch_npu._emu import profiles as _profiles

__all__ = ["clear_npu_diff_flag", "clear_npu_overflow_flag", "get_npu_diff_flag", "get_npu_overflow_flag",
           "is_support_inf_nan", "npu_check_overflow"]


def is_support_inf_nan() -> bool:
    """Whether the chip writes inf/nan on overflow (True) or saturates and raises its flag (False)."""
    return _profiles.active().inf_nan


def _take_flag() -> bool:
    """Reads and lowers the runtime's flag. The runtime gives it to GradScaler's unscale kernel
    (its found_inf turns 1 when the flag was up), so that kernel, run on a zero tensor, reads it
    in stream order: after every kernel launched before."""
    found = torch.zeros(1, device="npu")
    torch._amp_foreach_non_finite_check_and_unscale_([torch.zeros(1, device="npu")], found,
                                                     torch.ones(1, device="npu"))
    return bool(found.item())


def _raise_flag() -> None:
    """Raises the flag again the way a kernel does: a float16 product that saturates."""
    torch.full((1,), 65504.0, dtype=torch.float16, device="npu") * 2


def get_npu_overflow_flag() -> bool:
    """Whether a kernel saturated a float16 overflow since the flag was last cleared."""
    if is_support_inf_nan():
        raise RuntimeError(f"torch.npu.get_npu_overflow_flag: the chip of profile '{_profiles.active().name}' "
                           f"writes inf/nan on overflow and raises no overflow flag; use "
                           f"torch_npu.npu.utils.npu_check_overflow(tensor), which checks the tensor")
    up = _take_flag()
    if up:
        _raise_flag()   # reading leaves it up, for GradScaler's next unscale as for the next read
    return up


def clear_npu_overflow_flag() -> None:
    """Lowers the overflow flag (nothing to lower on a chip with inf/nan)."""
    if not is_support_inf_nan():
        _take_flag()


def npu_check_overflow(grad) -> bool:
    """Whether ``grad`` overflowed: on a chip with inf/nan, whether it (a tensor or a float) holds
    inf or nan; on a saturating chip, whether the overflow flag is up (then lowered)."""
    if is_support_inf_nan():
        if isinstance(grad, torch.Tensor):
            total = float(grad.detach().float().sum())
        elif isinstance(grad, (float, int)):
            total = float(grad)
        else:
            raise TypeError(f"npu_check_overflow: expected a tensor or a float, got {type(grad).__name__}")
        return math.isinf(total) or math.isnan(total)
    return _take_flag()


_NO_DIFF_FLAG = (
    "is not provided: no version of the Ascend adapter defines it (Ascend/pytorch and op-plugin, 2026-08), so "
    "what would raise the flag is not known. msprobe 26.2 names it only in "
    "DiffCheckDataProcessor._analyze_maybe_diff_flag, which it never calls; its diff_check task compares each "
    "API's md5 with the bench dump instead, and works without it")


def get_npu_diff_flag() -> bool:
    """Refused by name: see ``_NO_DIFF_FLAG``."""
    raise NotImplementedError(f"torch_npu.npu.utils.get_npu_diff_flag {_NO_DIFF_FLAG}")


def clear_npu_diff_flag() -> None:
    """Refused by name: see ``_NO_DIFF_FLAG``."""
    raise NotImplementedError(f"torch_npu.npu.utils.clear_npu_diff_flag {_NO_DIFF_FLAG}")
