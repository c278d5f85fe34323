"""Compiled graphs replayed as npu graphs.

``torch.compile(model, backend="npugraphs")`` (the Ascend adapter's name):
AOTAutograd splits the graph into forward and backward, which run eagerly.
``torch.compile(model, mode="reduce-overhead")``: inductor's compiled code for the
npu (``NPUGraphPolicy``, inductor's CUDA-graph policy hook).

Either way each graph runs once eagerly (a warm-up: lazy initialisations), then is
captured with torch.npu.graph on its inputs' shapes; later calls copy their inputs
into the captured (static) inputs, except inductor's static inputs (parameters and
buffers), whose memory is part of the key (another tensor there is another graph),
and replay. The "npugraphs" backend copies every input. A call with new
shapes captures again (one graph per shape set). A graph that mutates its inputs,
or that cannot be captured (an op whose output shape depends on the data, a host
read), runs as compiled without a graph, with one warning saying why.
"""
import functools
import warnings

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from .._core import patches as _patches
from . import GROUP

__all__ = ["npugraphs"]


def _mutates_inputs(gm):
    placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            for arg in node.target._schema.arguments:
                value = node.kwargs[arg.name] if arg.name in node.kwargs else None
                if value is None and not arg.kwarg_only:
                    index = node.target._schema.arguments.index(arg)
                    value = node.args[index] if index < len(node.args) else None
                if arg.alias_info is not None and arg.alias_info.is_write and value in placeholders:
                    return True
    return False


def _key(inputs):
    return tuple((tuple(t.shape), tuple(t.stride()), t.dtype, t.device) if isinstance(t, torch.Tensor) else t
                 for t in inputs)


class _Replayer:
    """Runs one compiled graph, ``run(list of inputs)``, from npu graphs, one per input
    shape set; the inputs at ``static`` indices keep their memory from call to call.

    The keywords are npugraph_ex's settings (``npugraph_ex.npu_fx_compiler``); the defaults are
    the "npugraphs" backend's and reduce-overhead's behaviour:

    * ``copy_inputs``: copy each call's inputs into the graph's own (False: the graph reads the
      caller's tensors, so their addresses join the key: new addresses are a new capture);
    * ``clone_outputs``: hand back copies (False: the graph's own outputs, overwritten by the
      next replay);
    * ``capture_limit``: at most this many captured graphs; later input sets run without one;
    * ``pool``: None (a private pool per capture), ``"shared"`` (one pool for every capture
      of this graph) or a ``torch.npu.graph_pool_handle()``;
    * ``capture_error_mode``: torch.npu.graph's; ``force_recapture``: capture before every replay.
    """

    def __init__(self, run, name, mutates_inputs=False, static=(), *, copy_inputs=True, clone_outputs=True,
                 capture_limit=None, pool=None, capture_error_mode="global", force_recapture=False):
        self.run, self.name, self.static = run, name, frozenset(static)
        self.captured = {}   # input key -> (graph, static inputs, static outputs)
        self.eager_because = "it mutates its inputs" if mutates_inputs else None
        self.warmed = set()
        self.copy_inputs, self.clone_outputs = copy_inputs, clone_outputs
        self.capture_limit, self.capture_error_mode, self.force_recapture = \
            capture_limit, capture_error_mode, force_recapture
        self.pool = torch.npu.graph_pool_handle() if pool == "shared" else pool
        self.captures = 0          # how many graphs were captured (recaptures included)
        self.over_limit = False

    def _key(self, inputs):
        addresses = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)
                     and (i in self.static or not self.copy_inputs)]
        return _key(inputs), tuple(inputs[i].data_ptr() for i in addresses)

    def __call__(self, inputs):
        inputs = list(inputs)
        if self.eager_because is not None or not any(
                isinstance(t, torch.Tensor) and t.device.type == "npu" for t in inputs):
            return self.run(inputs)
        if any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in inputs):
            # A cpu tensor (a scalar dynamo passes as a tensor) would be captured by value.
            self.eager_because = "it takes cpu tensors, which a graph would capture by value"
            warnings.warn(f"torch_npu npu graphs: the {self.name} graph runs without a graph: {self.eager_because}",
                          RuntimeWarning, stacklevel=2)
            return self.run(inputs)
        # Static inputs keep their memory: another tensor there (another model's parameter)
        # is another graph, never copied into the first one's.
        key = self._key(inputs)
        entry = self.captured.get(key)
        if entry is None or self.force_recapture:
            if key not in self.warmed:          # first call on these shapes: no graph, a warm-up
                self.warmed.add(key)
                return self.run(inputs)
            if entry is None and self.capture_limit is not None and len(self.captured) >= self.capture_limit:
                if not self.over_limit:
                    self.over_limit = True
                    warnings.warn(f"torch_npu npu graphs: the {self.name} graph has captured {self.capture_limit} "
                                  f"input shapes (its capture limit): other shapes run without a graph",
                                  RuntimeWarning, stacklevel=2)
                return self.run(inputs)
            try:
                entry = self.captured[key] = self._capture(inputs)
            except RuntimeError as e:
                self.eager_because = str(e).splitlines()[0][:300]
                warnings.warn(f"torch_npu npu graphs: the {self.name} graph runs without a graph: "
                              f"{self.eager_because}", RuntimeWarning, stacklevel=2)
                return self.run(inputs)
        graph, static_inputs, static_outputs = entry
        if self.copy_inputs:
            for i, (static, given) in enumerate(zip(static_inputs, inputs)):
                if (i not in self.static and isinstance(static, torch.Tensor)
                        and static.data_ptr() != given.data_ptr()):
                    static.copy_(given)
        graph.replay()
        if not self.clone_outputs:
            return list(static_outputs)
        # The static outputs are overwritten by the next replay: the caller gets its own.
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in static_outputs]

    def _capture(self, inputs):
        static_inputs = [t.clone() if isinstance(t, torch.Tensor) and i not in self.static and self.copy_inputs
                         else t for i, t in enumerate(inputs)]
        graph = torch.npu.NPUGraph()
        with torch.npu.graph(graph, pool=self.pool, capture_error_mode=self.capture_error_mode):
            static_outputs = self.run(list(static_inputs))
        self.captures += 1
        return graph, static_inputs, list(static_outputs)


def npu_graph_policy():
    """Inductor's CUDA-graph policy with the npu's graphs for npu code (installed as
    ``torch._inductor.config.cudagraph_policy`` when inductor loads; other devices get
    inductor's own cudagraph trees, install())."""
    from torch._inductor.cudagraph_utils import CUDAGraphPolicy

    class NPUGraphPolicy(CUDAGraphPolicy):
        def cudagraphify(self, model, example_inputs, static_input_idxs, *, device_index, is_backward,
                         is_inference, **kwargs):
            if not any(isinstance(t, torch.Tensor) and t.device.type == "npu" for t in example_inputs):
                return super().cudagraphify(model, example_inputs, static_input_idxs, device_index=device_index,
                                            is_backward=is_backward, is_inference=is_inference, **kwargs)
            replayer = _Replayer(model, "backward" if is_backward else "forward",
                                 mutates_inputs=bool(kwargs.get("mutated_input_idxs")), static=static_input_idxs)
            return replayer   # inductor calls it with the list of inputs

    return NPUGraphPolicy()


def install():
    """mode="reduce-overhead" replays npu graphs: inductor wraps compiled code through its
    CUDA-graph policy (npu_graph_policy(), for npu code) once its device check lets a graph
    on one npu device through. Run once, when inductor first registers the npu (_codegen);
    both changes go through torch_npu._patches in the group "compile"."""
    from torch._inductor import config, cudagraph_utils

    if config.cudagraph_policy is None:   # (a policy of the user's stays: npu code then runs without graphs)
        config.cudagraph_policy = npu_graph_policy()   # through the config module's own setter
        _patches.record("torch._inductor.config.cudagraph_policy = NPUGraphPolicy()", group=GROUP, checked=("2.13",),
                        undo=lambda: setattr(config, "cudagraph_policy", None),
                        reason="inductor wraps compiled code in graphs through this policy, its one hook for a "
                               "device's graphs; the npu's replays npu graphs for npu code and leaves other devices "
                               "to inductor's cudagraph trees")

    def one_npu_device_passes(original):
        @functools.wraps(original)
        def check(device_node_mapping):
            devices = {d for d in device_node_mapping if d.type != "meta"}
            if len(devices) == 1 and next(iter(devices)).type == "npu":
                return None
            return original(device_node_mapping)
        return check

    _patches.wrap(cudagraph_utils, "check_multiple_devices_or_any_cpu_nodes", one_npu_device_passes, GROUP,
                  checked=("2.13",), expects="(device_node_mapping)",
                  reason="inductor's check that a graph may be captured accepts a single cuda device only, with no "
                         "hook for another device: a graph on one npu device may be captured too")


def npugraphs(gm, example_inputs):
    """The dynamo backend: AOTAutograd's forward and backward graphs, replayed as npu graphs."""
    def compiler(name):
        def compile_graph(aot_gm, aot_inputs):
            replayer = _Replayer(lambda inputs: aot_gm(*inputs), name, mutates_inputs=_mutates_inputs(aot_gm))
            return make_boxed_func(lambda *args: replayer(list(args)))
        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))(gm, example_inputs)
