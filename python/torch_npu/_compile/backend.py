"""``torch.compile(model, backend="npu")`` and ``torch_npu.compile(..., fallback="eager")``.

The "npu" backend is inductor after a pass over dynamo's graph that puts the
npu's fused ops in place of the compositions eager code writes:

* RMSNorm, ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight``
  (either order of the products, ``x * x`` for the square) and
  ``F.rms_norm(x, (d,), weight, eps)``  ->  ``torch.ops.npu.npu_rms_norm``;
  when ``x`` is a residual sum ``a + b``  ->  ``npu_add_rms_norm``;
* SwiGLU, ``F.silu(a) * b`` with ``a, b = x.chunk(2, dim=-1)``  ->  ``npu_swiglu``.

The fused ops have autograd formulas, so training graphs get them too. Pick
"inductor" (the default) for generated kernels only; "npu" when the model is
written with these compositions (LLaMA-style blocks): one fused kernel replaces
several launches and the intermediates they keep for backward.
"""
import operator
import warnings

import torch
import torch.nn.functional as F

_npu = torch.ops.npu


def _is(node, *targets, method=None):
    if node is None or not isinstance(node, torch.fx.Node):
        return False
    if node.op == "call_function" and node.target in targets:
        return True
    return method is not None and node.op == "call_method" and node.target == method


def _value(node):
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _last_dim_mean(node):
    """The input of ``t.mean(-1, keepdim=True)``, else None."""
    if not _is(node, torch.mean, method="mean"):
        return None
    args, kwargs = list(node.args), dict(node.kwargs)
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if dim in (-1, [-1], (-1,)) and keepdim is True:
        return args[0]
    return None


def _squared(node):
    """``x`` of ``x.pow(2)``, ``x ** 2`` or ``x * x``, else None."""
    if _is(node, torch.pow, operator.pow, method="pow") and len(node.args) == 2 and node.args[1] == 2:
        return node.args[0]
    if _is(node, operator.mul, torch.mul, method="mul") and len(node.args) == 2 and node.args[0] is node.args[1]:
        return node.args[0]
    return None


def _other(node, known):
    """The operand of a binary ``node`` that is not ``known``."""
    a, b = node.args[:2]
    return b if a is known else a if b is known else None


def _replace_rms_norms(graph):
    replaced = 0
    for rsqrt in list(graph.nodes):
        if not _is(rsqrt, torch.rsqrt, method="rsqrt"):
            continue
        add = rsqrt.args[0]
        if not _is(add, operator.add, torch.add, method="add") or len(add.args) != 2:
            continue
        mean, eps = add.args
        if isinstance(mean, (int, float)):
            mean, eps = eps, mean
        if not isinstance(eps, (int, float)):
            continue
        x = _squared(_last_dim_mean(mean))
        if x is None:
            continue
        normed = [u for u in rsqrt.users if _is(u, operator.mul, torch.mul) and _other(u, rsqrt) is x]
        if len(normed) != 1 or len(normed[0].users) != 1:
            continue
        scaled = next(iter(normed[0].users))
        if not _is(scaled, operator.mul, torch.mul):
            continue
        weight = _other(scaled, normed[0])
        xv, wv = _value(x), _value(weight)
        if not (isinstance(xv, torch.Tensor) and isinstance(wv, torch.Tensor) and xv.device.type == "npu"
                and wv.dim() == 1 and wv.shape[0] == xv.shape[-1] and wv.dtype == xv.dtype):
            continue
        pattern = {mean.args[0], normed[0]}   # the nodes that read x and become dead
        residual = (_is(x, operator.add, torch.add) and len(x.args) == 2 and weight.op in ("placeholder", "get_attr")
                    and all(isinstance(_value(a), torch.Tensor) and _value(a).shape == xv.shape for a in x.args))
        if residual:
            # The sum's other readers take it from the fused op, which stands where the sum stood.
            with graph.inserting_after(x):
                fused = graph.call_function(_npu.npu_add_rms_norm.default, (x.args[0], x.args[1], weight, eps))
            with graph.inserting_after(fused):
                total = graph.call_function(operator.getitem, (fused, 2))
            with graph.inserting_after(total):
                y = graph.call_function(operator.getitem, (fused, 0))
            x.replace_all_uses_with(total, delete_user_cb=lambda user: user not in pattern)
        else:
            with graph.inserting_before(scaled):
                fused = graph.call_function(_npu.npu_rms_norm.default, (x, weight, eps))
                y = graph.call_function(operator.getitem, (fused, 0))
        scaled.replace_all_uses_with(y)
        replaced += 1
    return replaced


def _replace_functional_rms_norms(graph):
    replaced = 0
    for node in list(graph.nodes):
        if not _is(node, F.rms_norm, torch.rms_norm):
            continue
        args = list(node.args) + [None] * 4
        x, shape = args[0], args[1]
        weight = node.kwargs.get("weight", args[2])
        eps = node.kwargs.get("eps", args[3])
        xv, wv = _value(x), _value(weight)
        if eps is None or not (isinstance(xv, torch.Tensor) and isinstance(wv, torch.Tensor)
                               and xv.device.type == "npu" and wv.dim() == 1 and wv.dtype == xv.dtype
                               and tuple(shape) == tuple(wv.shape)):
            continue
        with graph.inserting_before(node):
            fused = graph.call_function(_npu.npu_rms_norm.default, (x, weight, float(eps)))
            y = graph.call_function(operator.getitem, (fused, 0))
        node.replace_all_uses_with(y)
        replaced += 1
    return replaced


def _replace_swiglus(graph):
    replaced = 0
    for silu in list(graph.nodes):
        if not _is(silu, F.silu, torch.nn.functional.silu, method="silu"):
            continue
        first = silu.args[0]
        if not (_is(first, operator.getitem) and first.args[1] == 0):
            continue
        chunk = first.args[0]
        if not _is(chunk, torch.chunk, method="chunk"):
            continue
        cargs = list(chunk.args) + [chunk.kwargs.get("chunks"), chunk.kwargs.get("dim")]
        chunks = cargs[1]
        dim = chunk.kwargs.get("dim", cargs[2] if len(chunk.args) > 2 else 0)
        xv = _value(cargs[0])
        if chunks != 2 or not isinstance(xv, torch.Tensor) or xv.device.type != "npu":
            continue
        if dim not in (-1, xv.dim() - 1):
            continue
        for product in list(silu.users):
            if not _is(product, operator.mul, torch.mul):
                continue
            second = _other(product, silu)
            if not (_is(second, operator.getitem) and second.args[0] is chunk and second.args[1] == 1):
                continue
            with graph.inserting_before(product):
                fused = graph.call_function(_npu.npu_swiglu.default, (cargs[0], -1))
            product.replace_all_uses_with(fused)
            replaced += 1
    return replaced


def fuse_npu_ops(gm):
    """Rewrites ``gm`` (dynamo's graph) in place; returns {pattern: replacements}."""
    counts = {"rms_norm": _replace_rms_norms(gm.graph) + _replace_functional_rms_norms(gm.graph),
              "swiglu": _replace_swiglus(gm.graph)}
    if any(counts.values()):
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return counts


class NpuBackend:
    """The "npu" dynamo backend: the fused-op pass, then inductor (with torch.compile's mode/options)."""

    def __init__(self, mode=None, options=None, dynamic=None):
        self.inductor = torch._TorchCompileInductorWrapper(mode, options, dynamic)
        self.fused = {}   # the last graph's replacements, for tests and curious users

    def __call__(self, gm, example_inputs):
        self.fused = fuse_npu_ops(gm)
        return self.inductor(gm, example_inputs)


def npu_backend(gm, example_inputs, **kwargs):
    """Entry point of the "npu" backend (torch_dynamo_backends): torch.compile(model, backend="npu")."""
    fuse_npu_ops(gm)
    from torch._inductor.compile_fx import compile_fx
    return compile_fx(gm, example_inputs, **kwargs)


def register():
    """Names the backend "npu" for torch.compile (run when dynamo's registry loads)."""
    from torch._dynamo.backends import registry
    if "npu" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=npu_backend, name="npu")


def _eager_fallback(backend, name):
    def compile_or_run_eagerly(gm, example_inputs):
        try:
            return backend(gm, example_inputs)
        except Exception as e:  # noqa: BLE001  the point: any compile failure runs the graph eagerly
            why = str(e).strip().splitlines()[0] if str(e).strip() else ""
            ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
            warnings.warn(f"torch_npu.compile: the {name} backend failed on a graph of {ops} ops "
                          f"({type(e).__name__}: {why[:300]}); that graph runs eagerly on the npu instead",
                          RuntimeWarning, stacklevel=2)
            return gm.forward
    return compile_or_run_eagerly


def compile(model=None, *, fallback="error", backend="inductor", mode=None, options=None, dynamic=None,
            fullgraph=False, **kwargs):
    """``torch.compile`` for npu models, with ``fallback="eager"``: a graph whose compilation
    fails (an op inductor cannot generate, a backend error) warns and runs eagerly, instead
    of raising. ``fallback="error"`` (the default) is torch.compile's behaviour.
    ``backend`` is "inductor", "npu" (inductor + fused npu ops) or any dynamo backend."""
    if fallback not in ("error", "eager"):
        raise ValueError(f"torch_npu.compile: fallback must be 'error' or 'eager', got {fallback!r}")
    if fallback == "error":
        return torch.compile(model, backend=backend, mode=mode, options=options, dynamic=dynamic,
                             fullgraph=fullgraph, **kwargs)
    if backend == "inductor":
        inner = torch._TorchCompileInductorWrapper(mode, options, dynamic)
    elif backend == "npu":
        inner = NpuBackend(mode, options, dynamic)
    else:
        if mode is not None or options is not None:
            raise ValueError(f"torch_npu.compile: mode and options are inductor's; backend {backend!r} takes "
                             f"neither")
        inner = torch._dynamo.lookup_backend(backend) if isinstance(backend, str) else backend
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", "given")
    compiled = _eager_fallback(inner, name)
    if model is None:
        return lambda m: torch.compile(m, backend=compiled, dynamic=dynamic, fullgraph=fullgraph, **kwargs)
    return torch.compile(model, backend=compiled, dynamic=dynamic, fullgraph=fullgraph, **kwargs)
