"""torch_npu.npu.utils: where the Ascend adapter keeps its overflow-status functions, which
its tools (msprobe) call by this path. Defined in :mod:`torch_npu.npu._msprobe_names`."""
from ._msprobe_names import clear_npu_overflow_flag, get_npu_overflow_flag, is_support_inf_nan, npu_check_overflow

__all__ = ["clear_npu_overflow_flag", "get_npu_overflow_flag", "is_support_inf_nan", "npu_check_overflow"]
