"""``torch.compile(model, backend="npu")`` and ``torch_npu.compile(..., fallback="eager")``.

The "npu" backend is inductor after a pass over dynamo's graph that puts the
npu's fused ops in place of the compositions eager code writes:

* RMSNorm, ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight``
  (either order of the products, ``x * x`` for the square) and
  ``F.rms_norm(x, (d,), weight, eps)``  ->  ``torch.ops.npu.npu_rms_norm``;
  when ``x`` is a residual sum ``a + b``  ->  ``npu_add_rms_norm``;
* SwiGLU, ``F.silu(a) * b`` with ``a, b = x.chunk(2, dim=-1)``  ->  ``npu_swiglu``;
* rotary embeddings, ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x)``
  written as ``cat((-x2, x1), -1)`` of the halves (``chunk`` or slices)
  ->  ``npu_rotary_mul``;
* attention written out on 4-D q, k, v, ``softmax(q @ k.transpose(-2, -1) * scale
  [masked_fill(mask, -inf) or + bias], dim=-1) @ v``  ->
  ``F.scaled_dot_product_attention``, the npu's flash kernel (inductor itself
  only recognises the unmasked forms); a bias that requires grad is left alone.

The fused ops have autograd formulas, so training graphs get them too. Pick
"inductor" (the default) for generated kernels only; "npu" when the model is
written with these compositions (LLaMA-style blocks): one fused kernel replaces
several launches and the intermediates they keep for backward.
"""
import operator
import warnings

import torch
import torch.nn.functional as F
import torch.utils._pytree

from .. import _C
from .._core import patches as _patches
from . import GROUP

_npu = torch.ops.npu
_FLOATING = tuple(getattr(torch, name) for name in _C._floating_dtypes())   # the npu's, defined in C++
_MATMUL = (operator.matmul, torch.matmul)


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


def _stand_in(new, old, **kwargs):
    """``new`` replaces ``old`` for its users and carries its example value, so
    later passes can read shapes and dtypes from it."""
    old.replace_all_uses_with(new, **kwargs)
    if "example_value" in old.meta:
        new.meta["example_value"] = old.meta["example_value"]


def _rms_norm_before(graph, node, x, weight, eps):
    """Inserts ``npu_rms_norm(x, weight, eps)[0]`` before ``node`` and gives it ``node``'s users."""
    with graph.inserting_before(node):
        fused = graph.call_function(_npu.npu_rms_norm.default, (x, weight, eps))
        y = graph.call_function(operator.getitem, (fused, 0))
    _stand_in(y, node)


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
            _stand_in(total, x, delete_user_cb=lambda user: user not in pattern)
            _stand_in(y, scaled)
        else:
            _rms_norm_before(graph, scaled, x, weight, eps)
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
        _rms_norm_before(graph, node, x, weight, float(eps))
        replaced += 1
    return replaced


def _last_dim(node, dim):
    xv = _value(node)
    return isinstance(xv, torch.Tensor) and dim in (-1, xv.dim() - 1)


def _halved(chunk):
    """x when ``chunk`` is ``x.chunk(2, dim=-1)`` (``torch.chunk`` or the method), else None."""
    if not _is(chunk, torch.chunk, method="chunk"):
        return None
    args = list(chunk.args) + [None, None]
    chunks = chunk.kwargs.get("chunks", args[1])
    dim = chunk.kwargs.get("dim", args[2] if len(chunk.args) > 2 else 0)
    return args[0] if chunks == 2 and _last_dim(args[0], dim) else None


def _replace_swiglus(graph):
    replaced = 0
    for silu in list(graph.nodes):
        if not _is(silu, F.silu, torch.nn.functional.silu, method="silu"):
            continue
        first = silu.args[0]
        if not (_is(first, operator.getitem) and first.args[1] == 0):
            continue
        chunk = first.args[0]
        x = _halved(chunk)
        if x is None or _value(x).device.type != "npu":
            continue
        for product in list(silu.users):
            if not _is(product, operator.mul, torch.mul):
                continue
            second = _other(product, silu)
            if not (_is(second, operator.getitem) and second.args[0] is chunk and second.args[1] == 1):
                continue
            with graph.inserting_before(product):
                fused = graph.call_function(_npu.npu_swiglu.default, (x, -1))
            _stand_in(fused, product)
            replaced += 1
    return replaced


def _half_of(node):
    """(x, 0 or 1) when ``node`` is the first or second half of x's last dim
    (``x.chunk(2, -1)[i]`` or ``x[..., :h]`` / ``x[..., h:]``), else None."""
    if not _is(node, operator.getitem) or len(node.args) != 2:
        return None
    source, index = node.args
    if isinstance(index, int) and index in (0, 1) and _is(source, torch.chunk, method="chunk"):
        x = _halved(source)
        return (x, index) if x is not None else None
    xv = _value(source)
    if (isinstance(xv, torch.Tensor) and isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis
            and isinstance(index[1], slice) and index[1].step in (None, 1)):
        d = xv.shape[-1]
        start, stop = index[1].start, index[1].stop
        if start in (None, 0) and stop == d // 2:
            return source, 0
        if start == d // 2 and stop in (None, d):
            return source, 1
    return None


def _rotated(node):
    """x when ``node`` is ``cat((-x2, x1), dim=-1)`` of x's halves, else None."""
    if not _is(node, torch.cat, torch.concat, torch.concatenate):
        return None
    args = list(node.args) + [None]
    tensors, dim = args[0], node.kwargs.get("dim", args[1] if len(node.args) > 1 else 0)
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 2 or not _is(tensors[0], operator.neg,
                                                                             torch.neg, method="neg"):
        return None
    second, first = _half_of(tensors[0].args[0]), _half_of(tensors[1])
    if second is None or first is None or second[0] is not first[0] or (second[1], first[1]) != (1, 0):
        return None
    return first[0] if _last_dim(first[0], dim) else None


def _replace_rotaries(graph):
    replaced = 0
    for add in list(graph.nodes):
        if not _is(add, operator.add, torch.add) or len(add.args) != 2 or add.kwargs:
            continue
        products = add.args
        if not all(_is(p, operator.mul, torch.mul) and len(p.args) == 2 and not p.kwargs for p in products):
            continue
        for plain, turned in (products, products[::-1]):
            cat = next((a for a in turned.args if _rotated(a) is not None), None)
            x = _rotated(cat) if cat is not None else None
            if x is None or x not in plain.args:
                continue
            r1, r2 = _other(plain, x), _other(turned, cat)
            xv, c, s, out = _value(x), _value(r1), _value(r2), _value(add)
            if not (isinstance(xv, torch.Tensor) and xv.device.type == "npu" and xv.dtype in _FLOATING
                    and xv.shape[-1] % 2 == 0 and isinstance(out, torch.Tensor) and out.shape == xv.shape
                    and all(isinstance(r, torch.Tensor) and r.dtype == xv.dtype and r.dim() <= xv.dim()
                            and r.shape[-1] == xv.shape[-1] for r in (c, s))):
                continue
            with graph.inserting_before(add):
                fused = graph.call_function(_npu.npu_rotary_mul.default, (x, r1, r2, "half"))
            _stand_in(fused, add)
            replaced += 1
            break
    return replaced




def _is_matmul(node):
    return _is(node, *_MATMUL, method="matmul") and len(node.args) == 2 and not node.kwargs


def _transposed_last_two(node):
    """k when ``node`` is ``k.transpose(-2, -1)`` (any spelling of the last two dims), else None."""
    if not _is(node, torch.transpose, method="transpose") or len(node.args) != 3:
        return None
    k, a, b = node.args
    kv = _value(k)
    if not isinstance(kv, torch.Tensor) or not all(isinstance(d, int) for d in (a, b)):
        return None
    n = kv.dim()
    return k if {a % n, b % n} == {n - 2, n - 1} else None


def _softmax_input(node):
    """The input of ``softmax(x, dim=-1)`` in the input's dtype, else None."""
    if not _is(node, torch.softmax, F.softmax, method="softmax"):
        return None
    args = list(node.args)
    dtype_at = 3 if node.target is F.softmax else 2      # F.softmax(input, dim, _stacklevel, dtype)
    dim = node.kwargs.get("dim", args[1] if len(args) > 1 else None)
    dtype = node.kwargs.get("dtype", args[dtype_at] if len(args) > dtype_at else None)
    return args[0] if dtype is None and _last_dim(args[0], dim) else None


def _replace_attentions(graph):
    replaced = 0
    for out in list(graph.nodes):
        if not _is_matmul(out):
            continue
        probs, v = out.args
        scores = _softmax_input(probs)
        if scores is None or len(probs.users) != 1:
            continue
        mask = bias = None
        if _is(scores, torch.masked_fill, method="masked_fill") and len(scores.args) == 3:
            scores, mask, fill = scores.args
            if not (isinstance(fill, float) and fill == float("-inf")):
                continue
        elif _is(scores, operator.add, torch.add) and len(scores.args) == 2 and not scores.kwargs:
            a, b = scores.args
            scaled_first = _is_matmul(a) or _is(a, operator.mul, operator.truediv, torch.mul, torch.div)
            scores, bias = (a, b) if scaled_first else (b, a)
            if not isinstance(_value(bias), torch.Tensor):
                continue
        scale = 1.0
        if _is(scores, operator.mul, torch.mul) and len(scores.args) == 2:
            factor = next((a for a in scores.args if isinstance(a, (int, float))), None)
            scores, scale = (_other(scores, factor), float(factor)) if factor is not None else (None, None)
        elif _is(scores, operator.truediv, torch.div) and len(scores.args) == 2 and not scores.kwargs:
            divisor = scores.args[1]
            scores, scale = (scores.args[0], 1.0 / divisor) if isinstance(divisor, (int, float)) and divisor \
                else (None, None)
        if scores is None or not _is_matmul(scores) or len(scores.users) != 1:
            continue
        q, k = scores.args[0], _transposed_last_two(scores.args[1])
        qv, kv, vv, outv = _value(q), _value(k), _value(v), _value(out)
        if not (k is not None and all(isinstance(t, torch.Tensor) for t in (qv, kv, vv, outv))
                and qv.device.type == "npu" and qv.dtype in _FLOATING and qv.dim() == 4
                and qv.dim() == kv.dim() == vv.dim() and qv.dtype == kv.dtype == vv.dtype
                and qv.shape[:-2] == kv.shape[:-2] == vv.shape[:-2] and kv.shape[-2] == vv.shape[-2]
                and outv.shape == qv.shape[:-1] + vv.shape[-1:]):
            continue
        if mask is not None and getattr(_value(mask), "dtype", None) != torch.bool:
            continue
        # A learned bias stays a composition: the flash kernel gives no gradient for attn_mask.
        if bias is not None and (_value(bias).dtype != qv.dtype or _value(bias).requires_grad):
            continue
        with graph.inserting_before(out):
            attn_mask = graph.call_function(torch.logical_not, (mask,)) if mask is not None else bias
            fused = graph.call_function(F.scaled_dot_product_attention, (q, k, v),
                                        {"attn_mask": attn_mask, "scale": scale})
        _stand_in(fused, out)
        replaced += 1
    return replaced


def fuse_npu_ops(gm):
    """Rewrites ``gm`` (dynamo's graph) in place; returns {pattern: replacements}."""
    counts = {"rms_norm": _replace_rms_norms(gm.graph) + _replace_functional_rms_norms(gm.graph),
              "swiglu": _replace_swiglus(gm.graph),
              "rotary": _replace_rotaries(gm.graph),
              "attention": _replace_attentions(gm.graph)}
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


def npu_backend(gm, example_inputs, mode=None, options=None):
    """``torch.compile(model, backend="npu", mode=..., options=...)``: dynamo passes the
    mode and options to a backend given by name; they are inductor's."""
    return NpuBackend(mode, options)(gm, example_inputs)


FALLBACK_HINT = ('To run the graphs that fail to compile eagerly instead (with a warning): '
                 'torch_npu.compile(model, fallback="eager"), or torch._dynamo.config.suppress_errors = True.')


def register():
    """Names the backends "npu" and "npugraphs" for torch.compile and makes its compile errors say how to
    fall back to eager (run when dynamo's registry loads). The change to dynamo's
    ``BackendCompilerFailed`` goes through :mod:`torch_npu._patches` (group "compile")."""
    from torch._dynamo import exc
    register_name("npu", npu_backend)
    register_name("npugraphs", npugraphs_backend)   # the Ascend adapter's name for graph replay

    def hinting(init):
        def __init__(self, backend_fn, inner_exception, first_useful_frame):
            init(self, backend_fn, inner_exception, first_useful_frame)
            if _graph_on_npu(first_useful_frame):
                self.args = (f"{self.args[0]}\n\n{FALLBACK_HINT}",) + self.args[1:] if self.args else (FALLBACK_HINT,)
        return __init__

    _patches.wrap(exc.BackendCompilerFailed, "__init__", hinting, GROUP, checked=("2.13",),
                  expects="(self, backend_fn, inner_exception, first_useful_frame)",
                  reason="dynamo's error for a failed backend compiler has no hook for advice: an npu graph's error "
                         "says how to fall back to eager")


def register_name(name, compiler_fn):
    """Registers a dynamo backend name, unless it is registered already or is one of torch_npu's
    ``torch_dynamo_backends`` entry points that dynamo is loading now (dynamo registers what
    the entry point names, the same function, once the import of torch_npu it started ends)."""
    from torch._dynamo.backends import registry
    if name in registry._COMPILER_FNS:
        return
    pending = registry._BACKENDS.get(name)
    if pending is not None and str(getattr(pending, "value", "")).startswith("torch_npu."):
        return
    registry.register_backend(compiler_fn=compiler_fn, name=name)


def npugraphs_backend(gm, example_inputs):
    """torch.compile(backend="npugraphs") (npugraphs.py; imported when used: dynamo is still
    loading when the backends are registered)."""
    from .npugraphs import npugraphs
    return npugraphs(gm, example_inputs)


def _graph_on_npu(frame):
    """Whether the graph whose compilation failed has npu tensors: dynamo raises
    BackendCompilerFailed from the frame that called the backend (``first_useful_frame``),
    whose ``gm`` and ``example_inputs`` are the graph's."""
    if frame is None:
        return False
    local = frame.f_locals
    values = list(local.get("example_inputs") or ())
    gm = local.get("gm")
    if isinstance(gm, torch.fx.GraphModule):
        values += [node.meta.get("example_value") for node in gm.graph.nodes]
    return any(isinstance(v, torch.Tensor) and v.device.type == "npu"
               for v in torch.utils._pytree.tree_leaves(values))


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
