"""The positional and sampling operators of LLM serving and training (csrc/ops/fused/position.cpp).

Exposed as ``torch.ops.npu.<name>`` and ``torch_npu.<name>`` with the Ascend adapter's signatures,
defaults and results. The kernels serve npu and cpu tensors; their meta kernels (C++) let
torch.compile trace them. Derivatives, registered here:

- ``npu_scaled_masked_softmax``: its backward op, as on Ascend;
- ``npu_mrope`` (query, key) and ``npu_interleave_rope`` (x): the inverse rotation, so rotary
  embeddings built on them can be trained; their cos/sin tables are constants (an error if they
  require grad, rather than a silently missing gradient);
- ``npu_top_k_top_p`` (logits) and ``npu_transpose_batchmatmul`` (input, weight; not the quantized
  form), inference operators on Ascend: their exact derivatives, so that a graph through them
  gets gradients rather than autograd's silent None.

``npu_apply_rotary_pos_emb`` updates query and key in place and, as on Ascend, has no backward (its
autograd kernel refuses tensors that require grad).
"""
import torch

__all__ = [
    "npu_apply_rotary_pos_emb",
    "npu_mrope",
    "npu_interleave_rope",
    "npu_top_k_top_p",
    "npu_scaled_masked_softmax",
    "npu_transpose_batchmatmul",
]

_ops = torch.ops.npu


def _refuse_grad(op, **tables):
    for name, table in tables.items():
        if isinstance(table, torch.Tensor) and table.requires_grad:
            raise RuntimeError(
                f"torch_npu.{op}: {name} requires grad, but the op treats it as a constant table (no gradient "
                f"for it, as on Ascend); pass {name}.detach(), or compose the embedding from torch ops to learn it")


# ---- derivatives ------------------------------------------------------------------------------

def _scaled_masked_softmax_setup(ctx, inputs, output):
    _, mask, scale, fixed_triu_mask = inputs
    ctx.save_for_backward(output, mask)
    ctx.scale, ctx.fixed_triu_mask = scale, fixed_triu_mask


def _scaled_masked_softmax_backward(ctx, grad):
    y, mask = ctx.saved_tensors
    dx = _ops.npu_scaled_masked_softmax_backward(grad.contiguous(), y, mask, ctx.scale, ctx.fixed_triu_mask)
    return dx, None, None, None


torch.library.register_autograd("npu::npu_scaled_masked_softmax", _scaled_masked_softmax_backward,
                                setup_context=_scaled_masked_softmax_setup)


def _mrope_setup(ctx, inputs, keyword_only_inputs, output):
    positions, query, key, cache, head_size = inputs
    _refuse_grad("npu_mrope", cos_sin_cache=cache)
    ctx.save_for_backward(positions, cache)
    ctx.head_size, ctx.options = head_size, keyword_only_inputs
    ctx.shapes = (query.shape, key.shape)


def _mrope_backward(ctx, grad_query, grad_key):
    positions, cache = ctx.saved_tensors
    # An unused output's gradient arrives as None: it is zero.
    if grad_query is None:
        grad_query = cache.new_zeros(ctx.shapes[0])
    if grad_key is None:
        grad_key = cache.new_zeros(ctx.shapes[1])
    dq, dk = _ops.npu_mrope_backward(positions, grad_query.contiguous(), grad_key.contiguous(), cache,
                                     ctx.head_size, **ctx.options)
    return None, dq, dk, None, None


torch.library.register_autograd("npu::npu_mrope", _mrope_backward, setup_context=_mrope_setup)


def _interleave_rope_setup(ctx, inputs, output):
    _, cos, sin = inputs
    _refuse_grad("npu_interleave_rope", cos=cos, sin=sin)
    ctx.save_for_backward(cos, sin)


def _interleave_rope_backward(ctx, grad):
    cos, sin = ctx.saved_tensors
    return _ops.npu_interleave_rope_backward(grad.contiguous(), cos, sin), None, None


torch.library.register_autograd("npu::npu_interleave_rope", _interleave_rope_backward,
                                setup_context=_interleave_rope_setup)


def _top_k_top_p_setup(ctx, inputs, output):
    logits, _, _ = inputs
    ctx.save_for_backward(logits, output)


def _top_k_top_p_backward(ctx, grad):
    # The kept logits pass through unchanged; the filtered ones became a constant (-inf).
    logits, output = ctx.saved_tensors
    return grad * (output == logits), None, None


torch.library.register_autograd("npu::npu_top_k_top_p", _top_k_top_p_backward, setup_context=_top_k_top_p_setup)


def _transpose_batchmatmul_setup(ctx, inputs, output):
    input_, weight, scale, perm_x1, perm_x2, split = inputs
    if scale is not None:
        raise RuntimeError("torch_npu.npu_transpose_batchmatmul: the quantized form (scale=...) gives int8 and has "
                           "no backward; call it under torch.no_grad()")
    ctx.save_for_backward(input_, weight)
    ctx.perm_x1, ctx.perm_x2, ctx.split = list(perm_x1), list(perm_x2), split


def _transpose_batchmatmul_backward(ctx, grad):
    # y[m, b, :] = a[b, m, :] @ w[b]: the bmm's gradients, permuted back to the inputs' layouts.
    input_, weight = ctx.saved_tensors
    a, w = input_.permute(ctx.perm_x1), weight.permute(ctx.perm_x2)  # [B, M, K], [B, K, N]
    if ctx.split > 1:  # [split, M, B*N/split] -> [M, B*N]
        grad = grad.transpose(0, 1).reshape(grad.shape[1], -1)
    g = grad.reshape(a.shape[1], a.shape[0], w.shape[2]).transpose(0, 1)  # [B, M, N]
    da = (g @ w.transpose(1, 2)).permute(ctx.perm_x1) if ctx.needs_input_grad[0] else None
    dw = (a.transpose(1, 2) @ g).permute(ctx.perm_x2) if ctx.needs_input_grad[1] else None
    return da, dw, None, None, None, None


# (on the kernel's op: the public one, whose tensors are keyword-only after the first two, composes it)
torch.library.register_autograd("npu::npu_transpose_batchmatmul_core", _transpose_batchmatmul_backward,
                                setup_context=_transpose_batchmatmul_setup)


# ---- the public names ---------------------------------------------------------------------------

def npu_apply_rotary_pos_emb(query, key, cos, sin, layout="BSH", rotary_mode="half"):
    """Rotary embedding of ``query`` and ``key`` **in place**: ``x = x * cos + rotate(x) * sin`` with
    ``rotate`` by halves ("half") or by neighbouring pairs ("interleave"); returns ``(query, key)``.
    ``layout`` "BSND", "SBND", "BNSD" (4-D) or "TND" (3-D); cos/sin are query's shape with N = 1."""
    return _ops.npu_apply_rotary_pos_emb(query, key, cos, sin, layout, rotary_mode)


def npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half",
              cache_mode="default"):
    """Rotary embedding from a ``[max_pos, rotary_dim]`` cos|sin cache, per token: ``positions``
    ``[T]`` (rope), or ``[3 or 4, T]`` with ``mrope_section`` (multimodal rope: each section of the
    rotary half-dimensions takes its own position row). Returns new ``(query, key)``, 2-D
    ``[T, heads * head_size]``; dimensions past rotary_dim pass unchanged."""
    return _ops.npu_mrope(positions, query, key, cos_sin_cache, head_size, mrope_section=mrope_section,
                          rotary_mode=rotary_mode, cache_mode=cache_mode)


def npu_interleave_rope(x, cos, sin):
    """Rotary embedding of interleaved pairs: ``q = x`` de-interleaved (``x[..., 0::2]`` then
    ``x[..., 1::2]``), ``q * cos + rotate_half(q) * sin``; x ``[B, N, S, 64]`` float16/bfloat16."""
    return _ops.npu_interleave_rope(x, cos, sin)


def npu_top_k_top_p(logits, p=None, k=None):
    """The top-k / top-p filter: logits outside the ``k[b]`` largest, or outside the smallest set of
    largest values whose softmax mass reaches ``p[b]``, become -inf (at least one value kept)."""
    return _ops.npu_top_k_top_p(logits, p, k)


def npu_scaled_masked_softmax(x, mask, scale=1, fixed_triu_mask=False):
    """``softmax((x * scale).masked_fill(mask, -10000), -1)`` computed in float, in x's dtype.
    ``fixed_triu_mask=True``: the mask is the causal upper triangle of x's (H, W), ``w > h`` masked
    (MindSpeed's ScaledUpperTriangMaskedSoftmax); the mask given is checked but not read."""
    return _ops.npu_scaled_masked_softmax(x, mask, scale, fixed_triu_mask)


def npu_transpose_batchmatmul(input, weight, *, bias=None, scale=None, perm_x1=None, perm_x2=None, perm_y=None,
                              batch_split_factor=1):
    """``(input^perm_x1 @ weight^perm_x2)^perm_y``: ``[B, M, K]`` (or ``[M, B, K]`` with perm_x1
    ``[1, 0, 2]``) times ``[B, K, N]`` gives ``[M, B, N]``; with ``scale`` (packed int64, one per
    ``B * N`` column) the int8 ``[M, 1, B * N]`` quantized result."""
    return _ops.npu_transpose_batchmatmul(input, weight, bias=bias, scale=scale, perm_x1=perm_x1,
                                          perm_x2=perm_x2, perm_y=perm_y, batch_split_factor=batch_split_factor)
