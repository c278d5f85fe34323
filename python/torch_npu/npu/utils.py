"""torch_npu.npu.utils: where the Ascend adapter keeps its overflow-status functions, which
its tools (msprobe) call by this path (defined in :mod:`torch_npu.npu._msprobe_names`), the
kernel dump (:mod:`torch_npu.npu._kernel_dump`), and ``get_cann_version``."""
from ._kernel_dump import finalize_dump, init_dump, set_dump
from ._msprobe_names import (
    clear_npu_diff_flag, clear_npu_overflow_flag, get_npu_diff_flag, get_npu_overflow_flag, is_support_inf_nan,
    npu_check_overflow,
)

__all__ = ["clear_npu_diff_flag", "clear_npu_overflow_flag", "finalize_dump", "get_cann_version",
           "get_npu_diff_flag", "get_npu_overflow_flag", "init_dump", "is_support_inf_nan", "npu_check_overflow",
           "set_dump"]


def get_cann_version(module: str = "CANN") -> str:
    """The installed CANN toolkit's version for ``module="CANN"``, as the Ascend adapter's; ""
    when no toolkit is installed (the emulated npu needs none) or for another module."""
    from torch_npu.utils.collect_env import get_cann_version as toolkit_version

    if not isinstance(module, str):
        raise TypeError(f"torch.npu.utils.get_cann_version: module must be a str, got {type(module).__name__}")
    version = toolkit_version() if module.upper() == "CANN" else "not known"
    return "" if version == "not known" else version
