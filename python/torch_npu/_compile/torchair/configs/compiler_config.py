"""``torchair.CompilerConfig``: the Ascend adapter's option tree, with its assignment checks.

The tree and its defaults are the adapter's (``config.debug.aclgraph.clone_input``,
``config.experimental_config.aclgraph._aclnn_static_shape_kernel``, ``config.mode``, ...):
code written for the adapter sets the same names. Which of them this project honours, and
what the others would do on the chip, is ``npugraph_ex.npu_fx_compiler``'s table
(``_UNHONOURED``): an option set to something other than its default that this project
cannot honour warns once, naming it.
"""
import os

from ..._ascend_options import (INT64_MAX, CallableValue, DictOptionValue, FileValue, IntListValue, IntRangeValue,
                           MustExistedPathValue, NpuBaseConfig, OptionValue, RegexValue, StrOptionValue)

__all__ = ["CompilerConfig"]

MODES = ("max-autotune", "reduce-overhead", "npugraph_ex")


class _DebugBase(NpuBaseConfig):
    def __init__(self):
        self._path = OptionValue(None, None)
        super().__init__()
        self._fixed_attrs.append("path")

    @property
    def enabled(self):
        return self.type.value is not None

    @property
    def path(self):
        return self._path.value

    @path.setter
    def path(self, value):
        self._path.value = os.path.realpath(value)


class _Dump(_DebugBase):
    def __init__(self):
        self.type = OptionValue(None, ["txt", "pbtxt", "py"])
        super().__init__()


class _DataDump(_DebugBase):
    def __init__(self):
        self.type = OptionValue(None, ["npy"])
        super().__init__()
        self._fixed_attrs.append("filter")
        self.filter = None


class _FxSummary(_DebugBase):
    def __init__(self):
        self.type = OptionValue(None, ["csv"])
        self.skip_compile = OptionValue(True, [True, False])
        super().__init__()


class _AclGraphDebugConfig(NpuBaseConfig):
    def __init__(self):
        self.disable_reinplace_inplaceable_ops_pass = OptionValue(False, [True, False])
        self.disable_reinplace_input_mutated_ops_pass = OptionValue(False, [True, False])
        self.disable_mempool_reuse_in_same_fx = OptionValue(False, [True, False])
        self.enable_output_clone = OptionValue(False, [True, False])
        self.static_capture_size_limit = IntRangeValue(64, 1, INT64_MAX)
        self.clone_input = OptionValue(True, [True, False])
        self.remove_cat_ops = OptionValue(True, [True, False])
        super().__init__()


class _DebugConfig(NpuBaseConfig):
    def __init__(self):
        self.graph_dump = _Dump()
        self.data_dump = _DataDump()
        self.fx_summary = _FxSummary()
        self.run_eagerly = OptionValue(False, [True, False])
        self.aclgraph = _AclGraphDebugConfig()
        self.deadlock_check = OptionValue(False, [True, False])
        super().__init__()


class _AoeConfig(NpuBaseConfig):
    def __init__(self):
        self.aoe_mode = OptionValue(None, ["2"])
        self.work_path = OptionValue("./", None)
        self.aoe_config_file = FileValue(None)
        super().__init__()


class _ExportExperimentalConfig(NpuBaseConfig):
    def __init__(self):
        self.enable_record_nn_module_stack = OptionValue(False, [True, False])
        self.auto_atc_config_generated = OptionValue(False, [True, False])
        self.enable_lite_export = OptionValue(False, [True, False])
        super().__init__()


class _ExportConfig(NpuBaseConfig):
    def __init__(self):
        self.export_mode = OptionValue(False, [False, True])
        self.export_path_dir = OptionValue("./", None)
        self.experimental = _ExportExperimentalConfig()
        super().__init__()
        self._fixed_attrs.extend(["export_name", "weight_name", "inputs_name"])
        self.export_name = self.weight_name = self.inputs_name = None


class _DataDumpConfig(NpuBaseConfig):
    def __init__(self):
        self.enable_dump = OptionValue(False, [False, True])
        self.dump_path = MustExistedPathValue("./")
        self.dump_mode = OptionValue("all", ["input", "output", "all"])
        self.quant_dumpable = OptionValue(False, [False, True])
        self.dump_step = RegexValue("", r"^(((\d+)|(\d+-{0,1}\d+))\|{0,1})*$", "0|1|2-5|6")
        self.dump_layer = RegexValue("", r'^[0-9a-zA-Z_" "/\\.]*$', "Mul_1 Add1 Conv2D_1")
        self.dump_data = OptionValue("tensor", ["tensor", "stats"])
        self.dump_config_path = FileValue(None)
        self.data_dump_stage = OptionValue("optimized", ["original", "optimized"])
        super().__init__()


class _FusionConfig(NpuBaseConfig):
    def __init__(self):
        self.fusion_switch_file = FileValue(None)
        super().__init__()


class _AclGraphExperimentalConfig(NpuBaseConfig):
    def __init__(self):
        self._aclnn_static_shape_kernel = OptionValue(False, [True, False])
        self._aclnn_static_shape_kernel_build_dir = StrOptionValue()
        self._aclnn_static_shape_kernel_sym_value_range = IntListValue(None)
        self._aclnn_static_shape_kernel_sym_index = IntRangeValue(0, 0, INT64_MAX)
        self._super_kernel_optimize = OptionValue(False, [True, False])
        self._super_kernel_optimize_options = DictOptionValue(None)
        self._super_kernel_debug_options = DictOptionValue(None)
        super().__init__()


class _ExperimentalConfig(NpuBaseConfig):
    def __init__(self):
        self.cc_parallel_enable = OptionValue(False, [False, True])
        self.keep_inference_input_mutations = OptionValue(True, [True, False])
        self.memory_efficiency = OptionValue(False, [True, False])
        self.frozen_parameter = OptionValue(False, [True, False])
        self.static_model_ops_lower_limit = IntRangeValue(None, -1, INT64_MAX)
        self.jit_compile = OptionValue("auto", ["auto"])
        self.npu_fx_pass = OptionValue(False, [True, False])
        self.aot_config_enable_joint_graph = OptionValue(False, [True, False])
        self.aot_config_output_loss_index = OptionValue(0, None)
        self.topology_sorting_strategy = OptionValue("DFS", ["BFS", "DFS", "RDFS", "StableRDFS"])
        self.enable_ref_data = OptionValue(False, [True, False])
        self.enable_view_optimize = OptionValue(True, [True, False])
        self.remove_noop_ops = OptionValue(True, [True, False])
        self.tiling_schedule_optimize = OptionValue(False, [True, False])
        self.pattern_fusion_pass = OptionValue(True, [True, False])
        self.aclgraph = _AclGraphExperimentalConfig()
        super().__init__()


class _InferenceConfig(NpuBaseConfig):
    def __init__(self):
        self.dynamic_gears_merge_policy = OptionValue("zip", ["zip", "product"])
        super().__init__()


class _GEConfig(NpuBaseConfig):
    def __init__(self):
        self.enable_single_stream = OptionValue(False, [True, False])
        self.oo_level = OptionValue("O3", ["O1", "O3"])
        self.oo_constant_folding = OptionValue(None, [True, False])
        self.oo_dead_code_elimination = OptionValue(None, [True, False])
        self.export_compile_stat = OptionValue("2", ["0", "1", "2"])
        self.aicore_num = OptionValue(None, None)
        self.optimization_switch = OptionValue(None, None)
        super().__init__()


class _AclGraphConfig:
    """``config.aclgraph_config.use_custom_pool``: a graph pool (``torch.npu.graph_pool_handle()``) or None."""

    def __init__(self):
        self.use_custom_pool = None


class CompilerConfig(NpuBaseConfig):
    """torchair's compiler configuration: ``config.mode`` is "max-autotune" (the default),
    "reduce-overhead" or "npugraph_ex"; the rest is the adapter's option tree."""

    def __init__(self):
        self.debug = _DebugConfig()
        self.aoe_config = _AoeConfig()
        self.export = _ExportConfig()
        self.dump_config = _DataDumpConfig()
        self.fusion_config = _FusionConfig()
        self.experimental_config = _ExperimentalConfig()
        self.inference_config = _InferenceConfig()
        self.ge_config = _GEConfig()
        self.mode = OptionValue("max-autotune", list(MODES))
        self.post_grad_custom_pre_pass = CallableValue(None)
        self.post_grad_custom_post_pass = CallableValue(None)
        super().__init__()
        self._fixed_attrs.append("aclgraph_config")
        self.aclgraph_config = _AclGraphConfig()

    def __eq__(self, other):
        return isinstance(other, CompilerConfig) and dict(self.leaves()) == dict(other.leaves())

    __hash__ = None


# The npugraph_ex option names that torchair's backend also takes (torch.compile(..., options=)
# and npugraph_ex's legacy config), each the torchair option it sets; "inverted" ones set
# the opposite boolean (inplace_pass=False is disable_reinplace_inplaceable_ops_pass=True).
OPTIONS_TO_CONFIG_MAP = {
    "force_eager": "debug.run_eagerly",
    "inplace_pass": "debug.aclgraph.disable_reinplace_inplaceable_ops_pass",
    "input_inplace_pass": "debug.aclgraph.disable_reinplace_input_mutated_ops_pass",
    "clone_input": "debug.aclgraph.clone_input",
    "clone_output": "debug.aclgraph.enable_output_clone",
    "capture_limit": "debug.aclgraph.static_capture_size_limit",
    "use_graph_pool": "aclgraph_config.use_custom_pool",
    "reuse_graph_pool_in_same_fx": "debug.aclgraph.disable_mempool_reuse_in_same_fx",
    "remove_cat_ops": "debug.aclgraph.remove_cat_ops",
    "static_kernel_compile": "experimental_config.aclgraph._aclnn_static_shape_kernel",
    "_vllm_aclnn_static_kernel_sym_index": "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_index",
    "_vllm_aclnn_static_kernel_sym_range": "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range",
    "super_kernel_optimize": "experimental_config.aclgraph._super_kernel_optimize",
    "super_kernel_optimize_options": "experimental_config.aclgraph._super_kernel_optimize_options",
    "super_kernel_debug_options": "experimental_config.aclgraph._super_kernel_debug_options",
    "remove_noop_ops": "experimental_config.remove_noop_ops",
    "pattern_fusion_pass": "experimental_config.pattern_fusion_pass",
    "frozen_parameter": "experimental_config.frozen_parameter",
    "post_grad_custom_pre_pass": "post_grad_custom_pre_pass",
    "post_grad_custom_post_pass": "post_grad_custom_post_pass",
    "dump_tensor_data": "dump_config.enable_dump",
    "data_dump_stage": "dump_config.data_dump_stage",
    "data_dump_dir": "dump_config.dump_path",
}
_INVERTED = {"inplace_pass", "input_inplace_pass", "reuse_graph_pool_in_same_fx"}


def _process_kwargs_options(config, kwargs):
    """Applies ``kwargs["options"]`` (npugraph_ex's flat names) to torchair's nested ``config``;
    an unknown name raises ValueError listing the allowed ones."""
    for option, value in (kwargs.get("options") or {}).items():
        if option not in OPTIONS_TO_CONFIG_MAP:
            raise ValueError(f"Invalid option '{option}', allowed options: {sorted(OPTIONS_TO_CONFIG_MAP)}")
        if option in _INVERTED and isinstance(value, bool):
            value = not value
        *parents, leaf = OPTIONS_TO_CONFIG_MAP[option].split(".")
        node = config
        for part in parents:
            node = getattr(node, part)
        setattr(node, leaf, value)
