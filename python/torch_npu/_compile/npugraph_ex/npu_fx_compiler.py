"""npugraph_ex's compiler, and torchair's for every mode: the Ascend adapter's graph modes
mapped onto this project's compile paths.

* mode "reduce-overhead" (torchair) and "npugraph_ex": AOTAutograd's forward and backward
  graphs pass through the FX passes of ``_optimize_fx`` (the user's pre pass, noop-op
  removal, the replacements of ``register_replacement``, reinplacing, the user's post
  pass), then run captured as npu graphs (``npugraphs._Replayer``: one graph per input
  shape set, replayed), as the adapter captures them into aclgraphs; ``force_eager`` /
  ``debug.run_eagerly`` runs them without a graph.
* mode "max-autotune" (torchair's default): on the chip, GE compiles the whole graph; here
  the "npu" backend does: the fused-op pass, then inductor, with the user's passes and the
  registered replacements as inductor's post-grad passes.

Each option is either honoured (``_HONOURED``, per mode) or, set to anything but its
default, warns once (per option, per process) saying what it would do on the chip
(``_ON_THE_CHIP``): nothing is ignored silently.
"""
import copy
import dataclasses
import functools
import logging
import warnings

import torch

from .configs.compiler_config import CompilerConfig, _process_kwargs_options

__all__ = ["get_npu_backend", "get_compiler", "compile_fx"]

logger = logging.getLogger("npugraph_ex")

ACLGRAPH_MODES = ("reduce-overhead", "npugraph_ex")

# ---- which options are honoured, and what the others do on the chip ----------------------------------

_GRAPH_DUMP = ("writes the graph to a file (debug.graph_dump.type: txt, pbtxt or py)")
_FX_DATA_DUMP = ("writes each FX op's inputs and outputs as .npy files (msprobe's torchair compare reads them); "
                 "here torchair's config.debug.data_dump (type npy) does that, npugraph_ex's dump options do not")
_GE = "an option of GE, the chip's graph engine, which compiles max-autotune graphs; here inductor compiles them"
_ACLGRAPH_ONLY = ("applies to the aclgraph modes (reduce-overhead, npugraph_ex) and has no effect in max-autotune, "
                  "as on the chip")
_STATIC_KERNEL = ("compiles aclnn kernels specialised to each captured shape (restricted to the listed symbol values) "
                  "and runs them in the graphs; the emulated device's kernels have no shape-specialised builds, so "
                  "the graphs run the ordinary ones")
_SUPER_KERNEL = ("merges the captured kernels into super kernels (one launch for many); the emulated device "
                 "replays each kernel of the graph")
_DEADLOCK = "watches graph replays for streams that wait on each other forever and reports them"

# Option path (torchair's nested ones, npugraph_ex's flat ones) -> what it does on the chip.
_ON_THE_CHIP = {
    # npugraph_ex (flat)
    "disable_static_kernel_compile_cache": "rebuilds the static kernels instead of reading them from the cache: "
                                           + _STATIC_KERNEL,
    "static_kernel_compile": _STATIC_KERNEL,
    "_vllm_aclnn_static_kernel_sym_index": _STATIC_KERNEL,
    "_vllm_aclnn_static_kernel_sym_range": _STATIC_KERNEL,
    "super_kernel_optimize": _SUPER_KERNEL,
    "super_kernel_optimize_options": _SUPER_KERNEL,
    "super_kernel_debug_options": _SUPER_KERNEL,
    "dump_tensor_data": _FX_DATA_DUMP,
    "data_dump_stage": _FX_DATA_DUMP,
    "data_dump_dir": _FX_DATA_DUMP,
    "deadlock_check": _DEADLOCK,
    # torchair (nested)
    "debug.graph_dump.type": _GRAPH_DUMP,
    "debug.graph_dump.path": _GRAPH_DUMP,
    "debug.graph_dump._path": _GRAPH_DUMP,
    "debug.data_dump.type": _FX_DATA_DUMP,
    "debug.data_dump.path": _FX_DATA_DUMP,
    "debug.data_dump._path": _FX_DATA_DUMP,
    "debug.data_dump.filter": _FX_DATA_DUMP,
    "debug.fx_summary.type": "writes a csv summary of the FX graph's ops and whether GE supports each",
    "debug.fx_summary.path": "writes a csv summary of the FX graph's ops and whether GE supports each",
    "debug.fx_summary._path": "writes a csv summary of the FX graph's ops and whether GE supports each",
    "debug.fx_summary.skip_compile": "skips GE's compile after writing the FX summary",
    "debug.deadlock_check": _DEADLOCK,
    "aoe_config.aoe_mode": "tunes the GE graph's operators with AOE (" + _GE + ")",
    "aoe_config.work_path": "where AOE writes its tuning results (" + _GE + ")",
    "aoe_config.aoe_config_file": "AOE's tuning configuration (" + _GE + ")",
    "dump_config.enable_dump": ("dumps each op's tensors while the graph runs (GE's dump in max-autotune, "
                                "aclgraph's in the other modes); this project has no graph data dump"),
    "dump_config.dump_path": "where the graph data dump writes",
    "dump_config.dump_mode": "which tensors the graph data dump writes",
    "dump_config.quant_dumpable": "dumps quantized ops' tensors too",
    "dump_config.dump_step": "the steps the graph data dump writes",
    "dump_config.dump_layer": "the ops the graph data dump writes",
    "dump_config.dump_data": "tensors or statistics in the graph data dump",
    "dump_config.dump_config_path": "GE's dump configuration file",
    "dump_config.data_dump_stage": "dumps the original or the optimised graph's tensors",
    "fusion_config.fusion_switch_file": "switches GE's fusion passes on or off (" + _GE + ")",
    "inference_config.dynamic_gears_merge_policy": "how GE merges the dynamic-shape gears (" + _GE + ")",
    "experimental_config.cc_parallel_enable": "runs GE's communication and computation in parallel (" + _GE + ")",
    "experimental_config.memory_efficiency": "GE's refreshable feature-map memory (" + _GE + ")",
    "experimental_config.static_model_ops_lower_limit": "GE's static-model op threshold (" + _GE + ")",
    "experimental_config.jit_compile": "GE's kernel compile mode (" + _GE + ")",
    "experimental_config.npu_fx_pass": "torchair's FX passes before GE (" + _GE + ")",
    "experimental_config.aot_config_enable_joint_graph": "compiles forward and backward as one GE graph (" + _GE + ")",
    "experimental_config.aot_config_output_loss_index": "the loss output of the joint GE graph (" + _GE + ")",
    "experimental_config.topology_sorting_strategy": "GE's topological order of the graph (" + _GE + ")",
    "experimental_config.enable_ref_data": "GE's RefData inputs for mutated inputs (" + _GE + ")",
    "experimental_config.enable_view_optimize": "GE's view optimisation (" + _GE + ")",
    "experimental_config.tiling_schedule_optimize": "GE's tiling schedule optimisation (" + _GE + ")",
    "experimental_config.frozen_parameter": ("GE treats the parameters as constants of the graph (" + _GE + "; in the "
                                             "aclgraph modes this option is honoured: parameters keep their address)"),
    "experimental_config.keep_inference_input_mutations": "(" + _GE + ")",
    "experimental_config.remove_noop_ops": "inductor always removes noop ops in max-autotune",
    "experimental_config.aclgraph._aclnn_static_shape_kernel": _STATIC_KERNEL,
    "experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir": _STATIC_KERNEL,
    "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range": _STATIC_KERNEL,
    "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_index": _STATIC_KERNEL,
    "experimental_config.aclgraph._super_kernel_optimize": _SUPER_KERNEL,
    "experimental_config.aclgraph._super_kernel_optimize_options": _SUPER_KERNEL,
    "experimental_config.aclgraph._super_kernel_debug_options": _SUPER_KERNEL,
    "export.export_mode": "torchair.dynamo_export writes an offline GE model (" + _GE + ")",
    "export.export_path_dir": "where dynamo_export writes (" + _GE + ")",
    "export.export_name": "the name of dynamo_export's model (" + _GE + ")",
    "export.weight_name": "dynamo_export's weight names (" + _GE + ")",
    "export.inputs_name": "dynamo_export's input names (" + _GE + ")",
    "export.experimental.enable_record_nn_module_stack": "dynamo_export records module stacks (" + _GE + ")",
    "export.experimental.auto_atc_config_generated": "dynamo_export writes an ATC configuration (" + _GE + ")",
    "export.experimental.enable_lite_export": "dynamo_export writes a lite model (" + _GE + ")",
    "ge_config.enable_single_stream": _GE,
    "ge_config.oo_level": _GE,
    "ge_config.oo_constant_folding": _GE,
    "ge_config.oo_dead_code_elimination": _GE,
    "ge_config.export_compile_stat": _GE,
    "ge_config.aicore_num": _GE,
    "ge_config.optimization_switch": _GE,
}
for _path in ("debug.aclgraph.disable_reinplace_inplaceable_ops_pass",
              "debug.aclgraph.disable_reinplace_input_mutated_ops_pass", "debug.aclgraph.disable_mempool_reuse_in_same_fx",
              "debug.aclgraph.enable_output_clone", "debug.aclgraph.static_capture_size_limit",
              "debug.aclgraph.clone_input", "debug.aclgraph.remove_cat_ops", "aclgraph_config.use_custom_pool"):
    _ON_THE_CHIP[_path] = _ACLGRAPH_ONLY

# Rewrites the adapter does by default and this project never does (results are equal): the options that
# switch them are read by nothing here, so a value other than the default warns with what the chip does.
_NOT_DONE = "; this project never does this rewrite, so either value behaves as the rewrite switched off"
_REMOVE_CAT = "with True (the default) a cat's inputs are written straight into slices of its output" + _NOT_DONE
_INPUT_INPLACE = ("with the pass on (the default) an op that mutates a graph input writes that input in place "
                  "rather than a copy written back" + _NOT_DONE)
_ON_THE_CHIP["remove_cat_ops"] = _REMOVE_CAT
_ON_THE_CHIP["input_inplace_pass"] = _INPUT_INPLACE
_ON_THE_CHIP["debug.aclgraph.remove_cat_ops"] = _REMOVE_CAT
_ON_THE_CHIP["debug.aclgraph.disable_reinplace_input_mutated_ops_pass"] = _INPUT_INPLACE

_NPUGRAPH_EX_HONOURED = frozenset((
    "force_eager", "use_graph_pool", "reuse_graph_pool_in_same_fx", "capture_limit", "clone_input", "clone_output",
    "frozen_parameter", "remove_noop_ops", "inplace_pass",
    "pattern_fusion_pass", "post_grad_custom_pre_pass", "post_grad_custom_post_pass", "capture_error_mode", "mode",
    "force_recapture"))
_TORCHAIR_COMMON = ("mode", "debug.run_eagerly", "post_grad_custom_pre_pass", "post_grad_custom_post_pass",
                    "experimental_config.pattern_fusion_pass", "debug.data_dump.type", "debug.data_dump.path",
                    "debug.data_dump.filter")
_HONOURED = {
    "npugraph_ex_config": _NPUGRAPH_EX_HONOURED,
    "max-autotune": frozenset(_TORCHAIR_COMMON + ("experimental_config.keep_inference_input_mutations",)),
    "aclgraph": frozenset(_TORCHAIR_COMMON + (
        "debug.aclgraph.disable_reinplace_inplaceable_ops_pass",
        "debug.aclgraph.disable_mempool_reuse_in_same_fx", "debug.aclgraph.enable_output_clone",
        "debug.aclgraph.static_capture_size_limit", "debug.aclgraph.clone_input",
        "aclgraph_config.use_custom_pool", "experimental_config.keep_inference_input_mutations",
        "experimental_config.frozen_parameter", "experimental_config.remove_noop_ops")),
}
_warned = set()   # the options that already warned in this process


def _is_torchair(config):
    return hasattr(config, "debug") and hasattr(config, "experimental_config")


def _warn_unhonoured(config, mode):
    """One warning per option (and process) set to a value this project cannot honour in ``mode``."""
    if _is_torchair(config):
        honoured = _HONOURED["max-autotune" if mode == "max-autotune" else "aclgraph"]
        who = "torchair"
    else:
        honoured, who = _HONOURED["npugraph_ex_config"], "npugraph_ex"
    defaults = dict(type(config)().leaves())
    for path, value in config.leaves():
        if path in honoured or path in _warned or _same(value, defaults.get(path)):
            continue
        _warned.add(path)
        what = _ON_THE_CHIP.get(path, "an option of the Ascend adapter that this project does not implement")
        warnings.warn(f"{who} config {path} = {value!r} is accepted but not honoured by this project in mode "
                      f"{mode!r}. On the chip: {what}.", UserWarning, stacklevel=3)


def _same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001  (an object without a usable ==: compare identities)
        return a is b


# ---- the settings the compile paths read, from either config -------------------------------------------

@dataclasses.dataclass
class _Settings:
    mode: str
    force_eager: bool
    capture_limit: int
    clone_input: bool
    clone_output: bool
    frozen_parameter: bool
    remove_noop_ops: bool
    pattern_fusion_pass: bool
    inplace_pass: bool
    pre_pass: object
    post_pass: object
    pool: object
    capture_error_mode: str
    force_recapture: bool
    keep_inference_input_mutations: bool
    fx_dump: object = None     # torchair's debug.data_dump when its type is "npy": the node


def _settings(config):
    if _is_torchair(config):
        d, e, acl = config.debug, config.experimental_config, config.debug.aclgraph
        custom_pool = config.aclgraph_config.use_custom_pool
        return _Settings(
            mode=config.mode._value, force_eager=bool(d.run_eagerly), capture_limit=acl.static_capture_size_limit._value,
            clone_input=bool(acl.clone_input), clone_output=bool(acl.enable_output_clone),
            frozen_parameter=bool(e.frozen_parameter), remove_noop_ops=bool(e.remove_noop_ops),
            pattern_fusion_pass=bool(e.pattern_fusion_pass),
            inplace_pass=not acl.disable_reinplace_inplaceable_ops_pass,
            pre_pass=config.post_grad_custom_pre_pass._value, post_pass=config.post_grad_custom_post_pass._value,
            pool=custom_pool if custom_pool is not None else (None if acl.disable_mempool_reuse_in_same_fx
                                                              else "shared"),
            capture_error_mode="global", force_recapture=False,
            keep_inference_input_mutations=bool(e.keep_inference_input_mutations),
            fx_dump=d.data_dump if d.data_dump.type._value == "npy" else None)
    c = config
    return _Settings(
        mode=c.mode._value, force_eager=bool(c.force_eager), capture_limit=c.capture_limit._value,
        clone_input=bool(c.clone_input), clone_output=bool(c.clone_output), frozen_parameter=bool(c.frozen_parameter),
        remove_noop_ops=bool(c.remove_noop_ops), pattern_fusion_pass=bool(c.pattern_fusion_pass),
        inplace_pass=bool(c.inplace_pass), pre_pass=c.post_grad_custom_pre_pass._value,
        post_pass=c.post_grad_custom_post_pass._value,
        pool=c.use_graph_pool if c.use_graph_pool is not None else ("shared" if c.reuse_graph_pool_in_same_fx
                                                                     else None),
        capture_error_mode=c.capture_error_mode._value, force_recapture=bool(c.force_recapture),
        keep_inference_input_mutations=True)


# ---- the FX passes ----------------------------------------------------------------------------------

def _fake_mode(gm, example_inputs):
    from torch._guards import detect_fake_mode
    values = list(example_inputs or ()) + [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])


def _reinplace(gm):
    """Inductor's reinplacing of auto-functionalized ops (a mutating op on a tensor nothing
    else reads runs in place instead of on a copy), then their decomposition."""
    from torch._inductor.fx_passes.post_grad import decompose_auto_functionalized
    from torch._inductor.fx_passes.reinplace import reinplace_inplaceable_ops
    from torch._inductor.fx_utils import FakeTensorUpdater
    hops = (torch.ops.higher_order.auto_functionalized, torch.ops.higher_order.auto_functionalized_v2)
    if not any(n.op == "call_function" and n.target in hops for n in gm.graph.nodes):
        return
    reinplace_inplaceable_ops(FakeTensorUpdater(gm), gm.graph)
    decompose_auto_functionalized(gm.graph)


def _optimize_fx(gm, example_inputs=None, config=None):
    """The passes over an AOTAutograd graph before it runs (or is captured), in the adapter's
    order: post_grad_custom_pre_pass(gm), remove_noop_ops, the registered replacements
    (pattern_fusion_pass), reinplacing (inplace_pass), post_grad_custom_post_pass(gm).
    A module attribute, called through the module: a test may wrap it, as on the adapter."""
    from torch._inductor.virtualized import V
    from . import _patterns
    s = _settings(config if config is not None else CompilerConfig())
    fake_mode = _fake_mode(gm, example_inputs)
    if s.pre_pass is not None:
        s.pre_pass(gm)
    with V.set_fake_mode(fake_mode) if fake_mode is not None else _nothing():
        if s.remove_noop_ops:
            from torch._inductor.fx_passes.post_grad import remove_noop_ops
            remove_noop_ops(gm.graph)
        if s.pattern_fusion_pass:
            _patterns.apply(gm.graph)
        if s.inplace_pass:
            _reinplace(gm)
    if s.post_pass is not None:
        s.post_pass(gm)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# ---- the compiled graph ---------------------------------------------------------------------------

@dataclasses.dataclass
class _CompiledFxArtifacts:
    """What a compiled graph's cache holds on the adapter (its generated Python code)."""
    version: str = "0.1"
    py_code: str = None


class _CompiledFxGraph:
    """A compiled graph: called with the graph's inputs, returns its outputs."""

    def __init__(self, runner, config=None, gm=None):
        self.runner, self.config, self.gm = runner, config, gm

    def __call__(self, *args):
        return self.runner(list(args))

    def get_code(self, extend_config=None):
        """The graph after the passes as a self-contained Python module whose ``forward(self,
        *inputs)`` runs it (what ``load_artifacts`` loads: vllm-ascend caches it). None for a graph
        that reads module attributes (constants), which its code alone cannot rebuild."""
        if self.gm is None or any(n.op == "get_attr" for n in self.gm.graph.nodes):
            return None
        from torch.fx.graph_module import _format_import_block
        from torch.package import sys_importer
        code = self.gm.graph.python_code(root_module="self")
        return _format_import_block(code.globals, sys_importer) + code.src

    def dump_artifacts(self):
        code = self.get_code()
        if code is None:
            raise RuntimeError("npugraph_ex: this graph reads module constants; its code alone cannot be cached")
        return _CompiledFxArtifacts(py_code=code)

    @classmethod
    def load_artifacts(cls, artifacts):
        """A compiled graph from ``get_code()``'s code: it runs the graph's ops eagerly (capture
        it with torch.npu.graph as the caller captured the original)."""
        if artifacts.version != _CompiledFxArtifacts.version:
            raise RuntimeError(f"Unsupported artifacts version: {artifacts.version}, "
                               f"expected: {_CompiledFxArtifacts.version}.")
        namespace = {}
        exec(compile(artifacts.py_code, "<npugraph_ex cached graph>", "exec"), namespace)  # noqa: S102
        forward = namespace["forward"]

        def run(inputs):
            out = forward(None, *inputs)
            return list(out) if isinstance(out, (tuple, list)) else [out]
        return cls(run)


_GRAPH_IDS = iter(range(1, 1 << 62))


class _NpuFxCompiler:
    """Compiles one AOTAutograd graph: ``_optimize_fx``, then a runner (npu graphs, or eager)."""

    def __init__(self, compiler_config):
        self.config = compiler_config
        self._static_inputs = ()   # the forward graph's parameter inputs (set by the backend per graph)

    def __call__(self, gm, example_inputs):
        return self._get_compiled_gm(gm, example_inputs)

    def _get_compiled_gm(self, gm, example_inputs):
        static = self._static_inputs
        dump = _settings(self.config).fx_dump
        if dump is not None:   # the adapter's FX data dump: the graph as traced, op by op, no graph capture
            from ._fx_dump import FxDumper
            name = f"graph_{next(_GRAPH_IDS)}"
            return _CompiledFxGraph(FxDumper(gm, dump.path, name, dump.filter), self.config, gm)
        gm = _optimize_fx(gm, example_inputs, self.config)
        s = _settings(self.config)
        name = f"graph_{next(_GRAPH_IDS)}"
        if s.force_eager:
            runner = _eager_runner(gm)
        else:
            from ..npugraphs import _mutates_inputs, _Replayer
            runner = _Replayer(_eager_runner(gm), name, mutates_inputs=_mutates_inputs(gm),
                               static=static if s.frozen_parameter else (), copy_inputs=s.clone_input,
                               clone_outputs=s.clone_output, capture_limit=s.capture_limit, pool=s.pool,
                               capture_error_mode=s.capture_error_mode, force_recapture=s.force_recapture)
        return _CompiledFxGraph(runner, self.config, gm)

    def _update_config(self, compiler_config):
        self.config = compiler_config


def _eager_runner(gm):
    def run(inputs):
        out = gm(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]
    return run


def get_compiler(compiler_config=None):
    """The FX compiler alone (what AOTAutograd calls with each of its graphs)."""
    return _NpuFxCompiler(compiler_config if compiler_config is not None else CompilerConfig())


# ---- the backend ------------------------------------------------------------------------------------

def _apply_kwargs(config, kwargs):
    unknown = sorted(set(kwargs) - {"options", "mode"})
    if unknown:
        raise TypeError(f"npugraph_ex backend: unexpected arguments {unknown}; torch.compile passes options= "
                        f"(the config's option names) to it")
    if kwargs.get("mode") not in (None, "default"):
        warnings.warn(f"npugraph_ex backend: torch.compile's mode={kwargs['mode']!r} is inductor's and is not used; "
                      f"this backend's settings come from options= or the CompilerConfig", UserWarning, stacklevel=3)
    if _is_torchair(config):
        from ..torchair.configs.compiler_config import _process_kwargs_options as torchair_options
        torchair_options(config, kwargs)
    else:
        _process_kwargs_options(config, kwargs)


def _static_inputs():
    """The forward graph's inputs AOTAutograd knows to be static (parameters, buffers)."""
    from torch._guards import TracingContext
    context = TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    return tuple(getattr(metadata, "static_input_indices", ()) or ())


def _npu_backend(gm, example_inputs, compiler_config=None, decompositions=None, **kwargs):
    """The backend ``get_npu_backend`` returns, ``(gm, example_inputs, **kwargs)``."""
    config = compiler_config if compiler_config is not None else CompilerConfig()
    if kwargs.get("options"):
        # options= belong to this torch.compile: applied to a copy, so that the caller's config (reused by
        # later compiles) keeps its own values
        config = copy.deepcopy(config)
    _apply_kwargs(config, kwargs)
    mode = config.mode._value
    if mode not in ("max-autotune",) + ACLGRAPH_MODES:
        raise ValueError(f"Unsupported npu backend mode {mode!r}")
    _warn_unhonoured(config, mode)
    if mode == "reduce-overhead":
        warnings.warn('torchair: the "reduce-overhead" mode configuration will be deprecated; use the "npugraph_ex" '
                      'backend', DeprecationWarning, stacklevel=2)
    s = _settings(config)
    if mode == "max-autotune" and not s.force_eager and s.fx_dump is None:
        return _inductor(gm, example_inputs, s, decompositions)
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    compiler = get_compiler(config)

    def forward(aot_gm, aot_inputs):
        compiler._static_inputs = _static_inputs()
        return make_boxed_func(compiler._get_compiled_gm(aot_gm, aot_inputs))

    def backward(aot_gm, aot_inputs):
        compiler._static_inputs = ()
        return make_boxed_func(compiler._get_compiled_gm(aot_gm, aot_inputs))

    return aot_autograd(fw_compiler=forward, bw_compiler=backward, inference_compiler=forward,
                        decompositions=dict(decompositions or {}),
                        keep_inference_input_mutations=s.keep_inference_input_mutations)(gm, example_inputs)


class _GmPasses:
    """Passes over the graph module, as one inductor post-grad pass (no uuid: inductor's FX
    graph cache is bypassed for graphs compiled with it)."""

    def __init__(self, *passes):
        self.passes = [p for p in passes if p is not None]

    def __call__(self, graph):
        for p in self.passes:
            p(graph.owning_module if p is not _patterns_pass else graph)

    def uuid(self):
        return None


def _patterns_pass(graph):
    from . import _patterns
    _patterns.apply(graph)


def _inductor(gm, example_inputs, s, decompositions):
    """max-autotune: the "npu" backend (the fused-op pass, then inductor)."""
    from torch._inductor.compile_fx import compile_fx as inductor_compile_fx
    from torch._inductor.custom_graph_pass import CustomGraphPass
    from torch._inductor.decomposition import select_decomp_table
    from ..backend import fuse_npu_ops

    class _Pass(_GmPasses, CustomGraphPass):
        pass

    fuse_npu_ops(gm)
    patches = {}
    pre = _Pass(s.pre_pass, _patterns_pass if s.pattern_fusion_pass else None)
    if pre.passes:
        patches["post_grad_custom_pre_pass"] = pre
    if s.post_pass is not None:
        patches["post_grad_custom_post_pass"] = _Pass(s.post_pass)
    decomps = {**select_decomp_table(), **decompositions} if decompositions else None
    return inductor_compile_fx(gm, example_inputs, config_patches=patches or None, decompositions=decomps)


def get_npu_backend(*, compiler_config=None, custom_decompositions={}):  # noqa: B006  (the adapter's signature)
    """The dynamo backend for ``compiler_config`` (a fresh ``CompilerConfig()`` when None):
    ``torch.compile(model, backend=get_npu_backend(compiler_config=config))``."""
    if compiler_config is None:
        compiler_config = CompilerConfig()
    return functools.partial(_npu_backend, compiler_config=compiler_config,
                             decompositions=dict(custom_decompositions or {}))


def compile_fx(gm, example_inputs=None, options=None):
    """Compiles ``gm`` with a fresh config and ``options`` (npugraph_ex's option names)."""
    return get_npu_backend()(gm, example_inputs, options=options or {})


def _npugraph_ex_backend(gm, example_inputs, **kwargs):
    """The dynamo backend "npugraph_ex": ``torch.compile(model, backend="npugraph_ex", options={...})``."""
    return get_npu_backend(compiler_config=CompilerConfig())(gm, example_inputs, **kwargs)
