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

__all__ = ["NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables"]


def is_current_stream_capturing() -> bool:
    """Whether the current npu stream of the current device is capturing a graph."""
    return _C._is_current_stream_capturing(-1)


def graph_pool_handle() -> Tuple[int, int]:
    """A memory pool id that several graphs can share (``graph(g, pool=...)``)."""
    return _C._new_pool_id(False)


class NPUGraph(_C._NPUGraph):
    """A captured graph of npu work (torch.cuda.CUDAGraph's API)."""

    def __new__(cls, keep_graph: bool = False):
        return super().__new__(cls, keep_graph)

    def __init__(self, keep_graph: bool = False):
        super().__init__(keep_graph)

    def capture_begin(self, pool: Optional[Tuple[int, int]] = None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        """``check_input_liveness`` (a CUDA debugging aid) is accepted; the npu's replay keeps
        nothing of the inputs but their memory, which the caller keeps alive, as on CUDA."""
        a, b = pool if pool is not None else (0, 0)
        super().capture_begin(a, b, capture_error_mode)

    def replay(self) -> None:
        """Queues the captured work on the current stream (a profiler sees each kernel)."""
        if torch.autograd.profiler._is_profiler_enabled:
            with torch.autograd.profiler.record_function("NPUGraph.replay"):
                super().replay()
        else:
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
                 enable_annotations: bool = False, check_input_liveness: bool = False):
        if self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = torch.npu.Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = torch.npu.stream(self.capture_stream)
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode

    def __enter__(self):
        torch.npu.synchronize()
        gc.collect()
        torch.npu.empty_cache()
        self.stream_ctx.__enter__()
        self.npu_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, exc_type, exc, tb):
        try:
            self.npu_graph.capture_end()
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)
        return False


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool=None):
    """torch.cuda.make_graphed_callables on the npu: each callable (a function or an
    ``nn.Module``) runs forward and backward from graphs captured on ``sample_args``.
    Inputs must keep the sample's shapes, dtypes and devices."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if torch.is_autocast_enabled("npu"):
        raise RuntimeError("torch.npu.make_graphed_callables: call it with autocast disabled (autocast's cache "
                           "would keep tensors of the capture alive); autocast inside the callable is fine")
    pool = graph_pool_handle() if pool is None else pool
    graphed = []
    for fn, args in zip(callables, sample_args):
        if not isinstance(args, tuple):
            raise TypeError("torch.npu.make_graphed_callables: sample_args must be a tuple of tensors per callable")
        if isinstance(fn, torch.nn.Module) and (fn._forward_hooks or fn._forward_pre_hooks):
            raise RuntimeError("torch.npu.make_graphed_callables: modules with hooks cannot be graphed (the hooks "
                               "would run once, at capture)")
        graphed.append(_graph_one(fn, args, num_warmup_iters, allow_unused_input, pool))
    return graphed[0] if single else tuple(graphed)


def _graph_one(fn, sample_args, warmup, allow_unused, pool):
    params = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
    inputs = tuple(a for a in sample_args if isinstance(a, torch.Tensor))
    needs_grad = tuple(t for t in inputs + params if t.requires_grad)
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):                     # warm up: lazy initialisations happen outside the capture
        for _ in range(warmup):
            outs = _as_tuple(fn(*sample_args))
            grads_out = tuple(torch.ones_like(o) for o in outs if o.requires_grad)
            if needs_grad and grads_out:
                torch.autograd.grad(tuple(o for o in outs if o.requires_grad), needs_grad, grads_out,
                                    allow_unused=allow_unused)
        del outs
    torch.npu.current_stream().wait_stream(side)
    torch.npu.synchronize()

    static_inputs = tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                          for a in sample_args)
    static_tensors = tuple(a for a in static_inputs if isinstance(a, torch.Tensor))
    capture_needs = tuple(t for t in static_tensors + params if t.requires_grad)
    forward_graph, backward_graph = NPUGraph(), NPUGraph()
    with graph(forward_graph, pool=pool):
        static_outputs = _as_tuple(fn(*static_inputs))
    differentiable = tuple(o for o in static_outputs if o.requires_grad)
    static_grad_outputs = tuple(torch.empty_like(o) for o in differentiable)
    static_grad_inputs = ()
    if capture_needs and differentiable:
        with graph(backward_graph, pool=pool):
            static_grad_inputs = torch.autograd.grad(differentiable, capture_needs, static_grad_outputs,
                                                     allow_unused=allow_unused)
    detached_outputs = tuple(o.detach() for o in static_outputs)

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            for static, given in zip(static_tensors, args[:len(static_tensors)]):
                if static.data_ptr() != given.data_ptr():
                    static.copy_(given)
            forward_graph.replay()
            return tuple(o.detach() for o in detached_outputs)   # views of the static outputs, like CUDA's

        @staticmethod
        def backward(ctx, *grads):
            if not capture_needs or not differentiable:
                return tuple(None for _ in static_tensors + params)
            k = 0
            for o, g in zip(static_outputs, grads):
                if o.requires_grad:
                    if g is None:
                        static_grad_outputs[k].zero_()
                    else:
                        static_grad_outputs[k].copy_(g)
                    k += 1
            backward_graph.replay()
            by_tensor = dict(zip(map(id, capture_needs), static_grad_inputs))
            return tuple(None if by_tensor.get(id(t)) is None else by_tensor[id(t)].detach().clone()
                         for t in static_tensors + params)

    def run(*args):
        tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        if len(tensors) != len(static_tensors):
            raise TypeError(f"torch.npu.make_graphed_callables: the graphed callable takes {len(static_tensors)} "
                            f"tensors, as its sample did; got {len(tensors)}")
        for static, given in zip(static_tensors, tensors):
            if given.shape != static.shape or given.dtype != static.dtype or given.device != static.device:
                raise ValueError(f"torch.npu.make_graphed_callables: an input of shape {tuple(given.shape)} "
                                 f"({given.dtype}, {given.device}) differs from the sample's "
                                 f"{tuple(static.shape)} ({static.dtype}, {static.device}): a graph replays "
                                 f"fixed shapes; graph the callable again for these")
        outs = Graphed.apply(*tensors, *params)
        return outs[0] if len(outs) == 1 else outs

    if isinstance(fn, torch.nn.Module):
        eager_forward = fn.forward

        def forward(*args, **kwargs):
            if fn.training == graphed_training and not kwargs:
                return run(*args)
            return eager_forward(*args, **kwargs)

        graphed_training = fn.training
        fn.forward = forward
        fn._npu_graphs = (forward_graph, backward_graph)   # kept alive with the module
        return fn
    run._npu_graphs = (forward_graph, backward_graph)
    return run


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)
