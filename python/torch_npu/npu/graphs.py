"""Graph capture and replay on the npu, with torch.cuda.graphs' names and meanings.

While a stream captures, the kernels and asynchronous copies launched on it are
recorded instead of run; ``replay()`` queues them again on the current stream as one
launch: no Python, no dispatcher, no allocation (csrc/core/graph.h). Memory allocated
during capture comes from the graph's private pool and stays reserved until
``reset()``. Random ops draw fresh numbers from the npu generator at every replay, as
CUDA's philox offsets advance. Waiting for the device, host reads (``.item()``,
``.cpu()``) and ops whose output shape depends on the data raise during capture,
naming what was refused.
"""
import gc
from typing import Optional, Tuple

import torch

from torch_npu import _C


# torch.accelerator.Graph on the npu: PyTorch's graph interface finds the implementation by
# the backend's name, which exists once the PrivateUse1 backend is renamed (before this import).
_C._register_graph_impl()

__all__ = ["NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables",
           "graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin", "graph_task_update_end",
           "NpuGraphOpHandler", "register_npu_graph_handler"]


def is_current_stream_capturing() -> bool:
    """Whether the current npu stream of the current device is capturing a graph."""
    return _C._is_current_stream_capturing(-1)


def graph_pool_handle() -> Tuple[int, int]:
    """A memory pool id that several graphs can share (``graph(g, pool=...)``)."""
    return _C._new_pool_id(False)


def _npu_stream(stream, what: str):
    if not isinstance(stream, torch.Stream) or stream.device.type != "npu":
        raise TypeError(f"torch.npu.{what}: expected a torch.npu.Stream, got {type(stream).__name__}")
    return stream.stream_id, stream.device_index


def graph_task_group_begin(stream: "torch.npu.Stream") -> None:
    """Begins a task group on ``stream``, which captures a graph: the work captured until
    :func:`graph_task_group_end` can later be replaced by :func:`graph_task_update_begin`."""
    _C._graph_task_group_begin(*_npu_stream(stream, "graph_task_group_begin"))


def graph_task_group_end(stream: "torch.npu.Stream") -> "_C._NPUTaskGroupHandle":
    """Ends the task group begun on ``stream``; returns its handle."""
    return _C._graph_task_group_end(*_npu_stream(stream, "graph_task_group_end"))


def graph_task_update_begin(stream: "torch.npu.Stream", handle: "_C._NPUTaskGroupHandle") -> None:
    """On ``stream`` (not the capturing one, and not capturing), the work launched until
    :func:`graph_task_update_end` is recorded, not run, and replaces the work of the task group
    ``handle`` names: the graph's next replay runs it in the group's place (new arguments, such as
    new sequence lengths, without a new capture)."""
    if not isinstance(handle, _C._NPUTaskGroupHandle):
        raise TypeError(f"torch.npu.graph_task_update_begin: expected the handle graph_task_group_end() returned, "
                        f"got {type(handle).__name__}")
    _C._graph_task_update_begin(*_npu_stream(stream, "graph_task_update_begin"), handle)


def graph_task_update_end(stream: "torch.npu.Stream") -> None:
    """Ends the update begun on ``stream`` and puts its work in the task group's place for the
    next replays; replays already queued keep running the old work (the call waits for none)."""
    _C._graph_task_update_end(*_npu_stream(stream, "graph_task_update_end"))


class NpuGraphOpHandler:
    """How ``torch.npu.graph(g, auto_dispatch_capture=True)`` captures one op (the Ascend
    adapter's handler classes): each registered op is captured in a task group, after an
    ExternalEvent wait, so that ``g.update([...])`` can run it again with new arguments.
    Subclasses override the class methods; ``UPDATE_KEYS`` names the keyword arguments an
    update may replace."""

    UPDATE_KEYS: Tuple[str, ...] = ()

    @classmethod
    def prepare_capture(cls, func, args, kwargs):
        """(func, args, kwargs) to capture: e.g. the op's out= form writing into tensors made here."""
        return func, args, kwargs

    @classmethod
    def postprocess_result(cls, result, kwargs):
        """What the captured call returns to its caller."""
        return result

    @classmethod
    def update_args(cls, record, update_input):
        """Puts the update's values into the recorded call's keyword arguments. A key that is
        neither in ``UPDATE_KEYS`` nor among the recorded keyword arguments raises ValueError
        (a misspelt key would otherwise leave the old value in place)."""
        unknown = [key for key in update_input if key not in cls.UPDATE_KEYS and key not in record.kwargs]
        if unknown:
            raise ValueError(f"NPUGraph.update: {cls.__name__} cannot update {', '.join(map(repr, unknown))}: "
                             f"it updates {sorted(cls.UPDATE_KEYS)} and the recorded keyword arguments "
                             f"{sorted(record.kwargs)}; check the key's spelling")
        for key, value in update_input.items():
            record.kwargs[key] = value


_NPU_GRAPH_OP_HANDLERS = {}


def register_npu_graph_handler(op_names):
    """Class decorator: ``op_names`` (``"op"`` or ``"op.overload"``) are captured by the handler."""
    names = [op_names] if isinstance(op_names, str) else list(op_names)

    def register(handler):
        if not (isinstance(handler, type) and issubclass(handler, NpuGraphOpHandler)):
            raise TypeError(f"torch.npu.register_npu_graph_handler: expected an NpuGraphOpHandler subclass, got "
                            f"{handler!r}")
        for name in names:
            _NPU_GRAPH_OP_HANDLERS[name] = handler
        return handler
    return register


def _meta_like(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta_like(v) for v in value)
    return value


class _FusedInferAttentionHandler(NpuGraphOpHandler):
    """npu_fused_infer_attention_score (and _v2): captured in its out= form, into results made
    from its Meta kernel; an update may give new sequence lengths, block table, etc."""

    UPDATE_KEYS = ("actual_seq_lengths", "actual_seq_lengths_kv", "actual_seq_qlen", "actual_seq_kvlen",
                   "block_table")

    @classmethod
    def prepare_capture(cls, func, args, kwargs):
        if func._overloadname == "out":
            return func, args, kwargs
        shapes = func(*_meta_like(args), **{k: _meta_like(v) for k, v in kwargs.items()})
        device = args[0].device
        attention_out, softmax_lse = (torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
                                      for t in shapes)
        kwargs = dict(kwargs, attention_out=attention_out, softmax_lse=softmax_lse)
        return func.overloadpacket.out, args, kwargs

    @classmethod
    def postprocess_result(cls, result, kwargs):
        return (kwargs["attention_out"], kwargs["softmax_lse"])


register_npu_graph_handler(["npu_fused_infer_attention_score.default", "npu_fused_infer_attention_score.out",
                            "npu_fused_infer_attention_score_v2.default",
                            "npu_fused_infer_attention_score_v2.out"])(_FusedInferAttentionHandler)


class _GraphDispatchRecord:
    __slots__ = ("event", "handle", "func", "args", "kwargs", "handler")

    def __init__(self, event, handle, func, args, kwargs, handler):
        self.event, self.handle, self.func, self.args, self.kwargs, self.handler = (
            event, handle, func, args, kwargs, handler)


class _GraphDispatchMode(torch.utils._python_dispatch.TorchDispatchMode):
    """While ``torch.npu.graph(g, auto_dispatch_capture=True)`` captures: each op with a handler
    is captured in a task group behind an ExternalEvent wait, and recorded for ``g.update``."""

    update_stream = None

    def __init__(self):
        super().__init__()
        self.records = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _NPU_GRAPH_OP_HANDLERS.get(func.__name__) or _NPU_GRAPH_OP_HANDLERS.get(
            func.overloadpacket.__name__)
        if handler is None:
            return func(*args, **kwargs)
        stream = torch.npu.current_stream()
        event = torch.npu.ExternalEvent()
        event.wait(stream)
        event.reset(stream)
        func, args, kwargs = handler.prepare_capture(func, args, kwargs)
        graph_task_group_begin(stream)
        result = func(*args, **kwargs)
        handle = graph_task_group_end(stream)
        self.records.append(_GraphDispatchRecord(event, handle, func, list(args), dict(kwargs), handler))
        return handler.postprocess_result(result, kwargs)

    def update(self, cpu_update_input):
        if isinstance(cpu_update_input, dict):
            cpu_update_input = [cpu_update_input]
        if len(cpu_update_input) == 1:
            cpu_update_input = [dict(cpu_update_input[0]) for _ in self.records]
        if len(cpu_update_input) != len(self.records):
            raise RuntimeError(f"NPUGraph.update: the graph captured {len(self.records)} updatable ops, and "
                               f"cpu_update_input has {len(cpu_update_input)} entries: give one dict per op, in "
                               f"capture order, or one dict for all")
        if _GraphDispatchMode.update_stream is None:
            _GraphDispatchMode.update_stream = torch.npu.Stream()
        update = _GraphDispatchMode.update_stream
        with torch.npu.stream(update):
            for record, update_input in zip(self.records, cpu_update_input):
                record.handler.update_args(record, update_input)   # raises before the group changes
                graph_task_update_begin(update, record.handle)
                try:
                    record.func(*record.args, **record.kwargs)
                finally:
                    graph_task_update_end(update)
                record.event.record(update)


class NPUGraph(_C._NPUGraph):
    """A captured graph of npu work (torch.cuda.CUDAGraph's API)."""

    def __new__(cls, keep_graph: bool = False):
        return super().__new__(cls, keep_graph)

    def __init__(self, keep_graph: bool = False):
        super().__init__(keep_graph)
        self.auto_dispatch_capture = False
        self.graph_dispatch_mode = _GraphDispatchMode()

    def update(self, cpu_update_input) -> None:
        """The Ascend adapter's: runs each op captured by ``torch.npu.graph(g, auto_dispatch_capture=True)``
        again, on an update stream, with the keyword arguments ``cpu_update_input`` gives (a list of
        dicts, one per op in capture order, or one dict for all); the next replay uses them."""
        if not self.auto_dispatch_capture:
            raise RuntimeError("NPUGraph.update: this graph was not captured with torch.npu.graph(g, "
                               "auto_dispatch_capture=True), so it recorded no op to update; capture it so")
        self.graph_dispatch_mode.update(cpu_update_input)

    def reset(self) -> None:
        self.graph_dispatch_mode.records.clear()
        super().reset()

    def capture_begin(self, pool: Optional[Tuple[int, int]] = None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        """``check_input_liveness`` (a CUDA debugging aid) is accepted; the npu's replay keeps
        nothing of the inputs but their memory, which the caller keeps alive, as on CUDA."""
        a, b = pool if pool is not None else (0, 0)
        super().capture_begin(a, b, capture_error_mode)

    def replay(self) -> None:
        """Queues the captured work on the current stream (a profiler sees it as the op
        "NPUGraph.replay" with each of its kernels)."""
        super().replay()

    def instantiate(self) -> None:
        """Nothing to do: a captured npu graph is ready to replay (CUDA instantiates here)."""

    def pool(self) -> Tuple[int, int]:
        return super().pool()

    def debug_dump(self, debug_path: str) -> None:
        """Writes the recorded nodes, one per line (CUDA writes a DOT file)."""
        super().debug_dump(debug_path)


class graph:
    """``with torch.npu.graph(g):`` captures the npu work of the block into ``g``
    (torch.cuda.graph's meaning: on a side stream unless ``stream`` is given, after a
    synchronize and an empty_cache, into ``pool`` when given)."""

    default_capture_stream: Optional["torch.npu.Stream"] = None

    def __init__(self, npu_graph: NPUGraph, pool=None, stream=None, capture_error_mode: str = "global",
                 enable_annotations: bool = False, check_input_liveness: bool = False,
                 auto_dispatch_capture: bool = False):
        if self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = torch.npu.Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = torch.npu.stream(self.capture_stream)
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode
        self.auto_dispatch_capture = auto_dispatch_capture
        npu_graph.auto_dispatch_capture = auto_dispatch_capture

    def __enter__(self):
        torch.npu.synchronize()
        gc.collect()
        torch.npu.empty_cache()
        self.stream_ctx.__enter__()
        self.npu_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
        if self.auto_dispatch_capture:
            self.npu_graph.graph_dispatch_mode.records.clear()
            self.npu_graph.graph_dispatch_mode.__enter__()

    def __exit__(self, exc_type, exc, tb):
        try:
            if self.auto_dispatch_capture:
                self.npu_graph.graph_dispatch_mode.__exit__(exc_type, exc, tb)
            self.npu_graph.capture_end()
        except RuntimeError:
            if exc_type is None:
                raise
            # The block raised (a refused call invalidated the capture): that error is the one to see.
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)
        return False


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool=None):
    """torch.cuda.make_graphed_callables on the npu: each callable (a function or an
    ``nn.Module``) runs its forward and its backward from graphs captured on
    ``sample_args`` (a tuple of tensors, or of nested tuples and lists of tensors, per
    callable). Later calls must pass tensors of the samples' shapes, dtypes and devices.
    Several callables share one memory pool: their forwards are captured in order, then
    their backwards in reverse order, the order in which they run."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if torch.is_autocast_enabled("npu") and torch.is_autocast_cache_enabled():
        raise RuntimeError("torch.npu.make_graphed_callables: call it with autocast's cache disabled "
                           "(torch.autocast('npu', cache_enabled=False)): the cache would keep tensors of the capture")
    flat_samples, specs, params = [], [], []
    for fn, args in zip(callables, sample_args):
        if not isinstance(args, tuple):
            raise TypeError("torch.npu.make_graphed_callables: sample_args must be a tuple per callable")
        if isinstance(fn, torch.nn.Module):
            if fn._backward_hooks or fn._forward_hooks or fn._forward_pre_hooks:
                raise RuntimeError("torch.npu.make_graphed_callables: modules with hooks cannot be graphed (the "
                                   "hooks would run once, at capture)")
            if any(b.requires_grad for b in fn.buffers()):
                raise RuntimeError("torch.npu.make_graphed_callables: modules with buffers that require grad cannot "
                                   "be graphed")
        flat, spec = torch.utils._pytree.tree_flatten(args)
        for leaf in flat:
            if not isinstance(leaf, torch.Tensor):
                raise TypeError(f"torch.npu.make_graphed_callables: sample_args may hold tensors only (a graph "
                                f"replays fixed values), got {type(leaf).__name__}")
        flat_samples.append(tuple(flat))
        specs.append(spec)
        params.append(tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ())
    pool = graph_pool_handle() if pool is None else pool
    # The samples are the static inputs; the parameters keep their memory.
    statics = [flat + p for flat, p in zip(flat_samples, params)]

    def run(i):
        return torch.utils._pytree.tree_flatten(callables[i](*torch.utils._pytree.tree_unflatten(
            list(flat_samples[i]), specs[i])))

    def differentiable(i, outputs):
        return tuple(o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad)

    def needing_grad(i):
        return tuple(t for t in statics[i] if t.requires_grad)

    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):                      # warm up: lazy initialisations happen outside the captures
        for i in range(len(callables)):
            for _ in range(num_warmup_iters):
                outputs, _ = run(i)
                outs, needs = differentiable(i, outputs), needing_grad(i)
                if outs and needs:
                    torch.autograd.grad(outs, needs, tuple(torch.ones_like(o) for o in outs),
                                        allow_unused=allow_unused_input)
            del outputs
    torch.npu.current_stream().wait_stream(side)
    torch.npu.synchronize()

    forward_graphs = [NPUGraph() for _ in callables]
    backward_graphs = [NPUGraph() for _ in callables]
    static_outputs, output_specs = [], []
    for i in range(len(callables)):                   # forwards in order ...
        with graph(forward_graphs[i], pool=pool):
            outputs, spec = run(i)
        static_outputs.append(tuple(outputs))
        output_specs.append(spec)
    static_grad_outputs = [None] * len(callables)
    static_grad_inputs = [None] * len(callables)
    for i in reversed(range(len(callables))):         # ... then backwards in reverse: the order they run in
        outs, needs = differentiable(i, static_outputs[i]), needing_grad(i)
        grad_outputs = tuple(torch.empty_like(o) for o in outs)
        grads = ()
        if outs and needs:
            with graph(backward_graphs[i], pool=pool):
                grads = torch.autograd.grad(outs, needs, grad_outputs, allow_unused=allow_unused_input)
        by_input = iter(grads)
        static_grad_inputs[i] = tuple(next(by_input) if t.requires_grad else None for t in statics[i])
        static_grad_outputs[i] = grad_outputs

    graphed = tuple(_graphed(callables[i], statics[i], len(flat_samples[i]), specs[i], static_outputs[i],
                             output_specs[i], static_grad_outputs[i], static_grad_inputs[i],
                             forward_graphs[i], backward_graphs[i])
                    for i in range(len(callables)))
    return graphed[0] if single else graphed


def _graphed(fn, statics, n_inputs, spec, static_outputs, output_spec, static_grad_outputs, static_grad_inputs,
             forward_graph, backward_graph):
    """The callable that replays one callable's captured forward and backward."""
    has_backward = any(g is not None for g in static_grad_inputs)

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            for static, given in zip(statics, inputs):
                if static.data_ptr() != given.data_ptr():
                    static.copy_(given)
            forward_graph.replay()
            return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in static_outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            if not has_backward:
                return tuple(None for _ in statics)
            k = 0
            for output, grad in zip(static_outputs, grads):
                if isinstance(output, torch.Tensor) and output.requires_grad:
                    if grad is None:
                        static_grad_outputs[k].zero_()
                    elif grad.data_ptr() != static_grad_outputs[k].data_ptr():
                        static_grad_outputs[k].copy_(grad)
                    k += 1
            backward_graph.replay()
            # Copies: the next replay overwrites the static gradients, which .grad must not alias.
            return tuple(None if g is None else g.detach().clone() for g in static_grad_inputs)

    samples = statics[:n_inputs]

    def run(*args, **kwargs):
        if kwargs:
            raise TypeError("torch.npu.make_graphed_callables: a graphed callable takes positional arguments only")
        flat, given_spec = torch.utils._pytree.tree_flatten(args)
        if given_spec != spec:
            raise TypeError(f"torch.npu.make_graphed_callables: the graphed callable takes arguments structured as "
                            f"its sample ({spec}), got {given_spec}")
        for static, given in zip(samples, flat):
            if (not isinstance(given, torch.Tensor) or given.shape != static.shape or given.dtype != static.dtype
                    or given.device != static.device):
                what = (f"{tuple(given.shape)} ({given.dtype}, {given.device})" if isinstance(given, torch.Tensor)
                        else type(given).__name__)
                raise ValueError(f"torch.npu.make_graphed_callables: an input {what} differs from the sample's "
                                 f"{tuple(static.shape)} ({static.dtype}, {static.device}): a graph replays fixed "
                                 f"shapes; graph the callable again for these")
        outputs = Graphed.apply(*flat, *statics[n_inputs:])
        return torch.utils._pytree.tree_unflatten(list(outputs), output_spec)

    if isinstance(fn, torch.nn.Module):
        eager_forward, graphed_training = fn.forward, fn.training

        def forward(*args, **kwargs):
            if fn.training == graphed_training and not kwargs:
                return run(*args)
            return eager_forward(*args, **kwargs)

        fn.forward = forward
        fn._npu_graphs = (forward_graph, backward_graph)   # kept alive with the module
        return fn
    run._npu_graphs = (forward_graph, backward_graph)
    return run
