"""``npugraph_ex.CompilerConfig``: the flat option set of the Ascend adapter's npugraph_ex backend.

``torch.compile(model, backend="npugraph_ex", options={...})`` sets these names through
``_process_kwargs_options``; an unknown name raises ValueError listing the supported ones,
a value the option does not allow raises as on the adapter. What each option does here,
and what the ones this project cannot honour would do on the chip, is in
``npugraph_ex.npu_fx_compiler``.
"""
from ..._ascend_options import (INT64_MAX, CallableValue, DictOptionValue, IntListValue,
                                              IntRangeValue, MustExistedPathValue, NpuBaseConfig, OptionValue)

__all__ = ["CompilerConfig"]


class CompilerConfig(NpuBaseConfig):
    """npugraph_ex's compiler configuration (flat: ``config.capture_limit = 8``)."""

    _bool_as_string = False

    def __init__(self):
        self.force_eager = OptionValue(False, [True, False])
        self.reuse_graph_pool_in_same_fx = OptionValue(True, [True, False])
        self.capture_limit = IntRangeValue(64, 1, INT64_MAX)
        self.clone_input = OptionValue(True, [True, False])
        self.clone_output = OptionValue(False, [True, False])
        self.disable_static_kernel_compile_cache = OptionValue(False, [True, False])
        self.static_kernel_compile = OptionValue(False, [True, False])
        self.frozen_parameter = OptionValue(False, [True, False])
        self.remove_noop_ops = OptionValue(True, [True, False])
        self.remove_cat_ops = OptionValue(True, [True, False])
        self.inplace_pass = OptionValue(True, [True, False])
        self.input_inplace_pass = OptionValue(True, [True, False])
        self.pattern_fusion_pass = OptionValue(True, [True, False])
        self.post_grad_custom_pre_pass = CallableValue(None)
        self.post_grad_custom_post_pass = CallableValue(None)
        self.dump_tensor_data = OptionValue(False, [True, False])
        self.data_dump_stage = OptionValue("optimized", ["original", "optimized"])
        self.data_dump_dir = MustExistedPathValue("./")
        self._vllm_aclnn_static_kernel_sym_index = IntRangeValue(0, 0, INT64_MAX)
        self._vllm_aclnn_static_kernel_sym_range = IntListValue(None)
        self.super_kernel_optimize = OptionValue(False, [True, False])
        self.super_kernel_optimize_options = DictOptionValue(None)
        self.super_kernel_debug_options = DictOptionValue(None)
        self.deadlock_check = OptionValue(False, [True, False])
        self.capture_error_mode = OptionValue("global", ["global", "thread_local", "relaxed"])
        self.mode = OptionValue("npugraph_ex", ["npugraph_ex"])
        self.force_recapture = OptionValue(False, [True, False])
        super().__init__()
        self._fixed_attrs.append("use_graph_pool")
        self.use_graph_pool = None

    def __eq__(self, other):
        return isinstance(other, CompilerConfig) and dict(self.leaves()) == dict(other.leaves())

    __hash__ = None


def _process_kwargs_options(config, kwargs):
    """Sets each entry of ``kwargs["options"]`` on ``config``; a name the config lacks raises
    ValueError naming it and the supported ones."""
    for option, value in (kwargs.get("options") or {}).items():
        if option not in config._fixed_attrs:
            raise ValueError(f"Invalid option '{option}'. The '{type(config).__name__}' object does not have "
                             f"attribute '{option}'. Supported attributes are: {sorted(config._fixed_attrs)}")
        setattr(config, option, value)
