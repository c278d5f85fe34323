"""The mixture-of-experts and quantization ops of LLM serving and training.

``torch_npu.<name>`` and ``torch.ops.npu.<name>`` with the Ascend adapter's
signatures, defaults and result tuples (csrc/ops/fused/moe_quant.cpp holds
the schemas and meta kernels, csrc/ops/host/fused/moe_quant_kernels.cpp the kernels). Here: their derivatives, where training
code differentiates through them, and the public names.

- ``npu_moe_gating_top_k_softmax``: the top-k of softmax(x); backward through the
  softmax (Ascend registers none: training code gets the router's gradient here).
- ``npu_grouped_matmul``: float operands differentiate for x, weight and bias;
  the backward is itself grouped matmuls (along m for x, along k for weight).
- ``npu_moe_init_routing_v2``: unquantized, the gradient of the row gather to x (and scale).
- ``npu_moe_token_unpermute``: backward is ``npu_moe_token_unpermute_grad``.
- ``npu_moe_token_permute``: defined here, as a composition of aten ops the npu runs
  natively (a stable argsort and a row gather), so autograd, compile and the meta
  kernels come from theirs.
"""
import torch

__all__ = [
    "npu_moe_gating_top_k_softmax",
    "npu_moe_init_routing_v2",
    "npu_grouped_matmul",
    "npu_moe_token_permute",
    "npu_moe_token_unpermute",
    "npu_dynamic_quant",
    "npu_quant_matmul",
    "npu_convert_weight_to_int4pack",
    "npu_trans_quant_param",
]

_ops = torch.ops.npu


# ---- derivatives ------------------------------------------------------------------------

# The gating is small (a row of experts per token), so the autograd wrapper's own cost shows: a
# plain autograd.Function behind an Autograd kernel costs ~40 us less per call than
# register_autograd's wrapper at 256 tokens.
class _Gating(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, finished, k):
        with torch._C._AutoDispatchBelowAutograd():
            y, expert_idx, row_idx = _ops.npu_moe_gating_top_k_softmax(x, finished, k)
        ctx.save_for_backward(x)
        ctx.k = k
        ctx.mark_non_differentiable(expert_idx, row_idx)
        return y, expert_idx, row_idx

    @staticmethod
    def backward(ctx, grad_y, _grad_idx, _grad_row_idx):
        (x,) = ctx.saved_tensors  # the kernel recomputes the top-k (finished rows too: their y is real)
        return _ops._npu_moe_gating_top_k_softmax_backward(grad_y.contiguous(), x, ctx.k), None, None


def _gating_autograd_kernel(x, finished=None, k=1):
    if torch.is_grad_enabled() and x.requires_grad:
        return _Gating.apply(x, finished, k)
    with torch._C._AutoDispatchBelowAutograd():
        return _ops.npu_moe_gating_top_k_softmax(x, finished, k)


def _unpermute_setup(ctx, inputs, output):
    permuted, sorted_indices, probs, padded_mode, restore_shape = inputs
    ctx.save_for_backward(permuted, sorted_indices, probs)
    ctx.padded_mode, ctx.restore_shape = padded_mode, restore_shape


def _unpermute_backward(ctx, grad):
    permuted, sorted_indices, probs = ctx.saved_tensors
    grad_permuted, grad_probs = _ops.npu_moe_token_unpermute_grad(
        permuted, grad.contiguous(), sorted_indices, probs, ctx.padded_mode, ctx.restore_shape)
    return grad_permuted, None, grad_probs, None, None


torch.library.register_autograd("npu::npu_moe_token_unpermute", _unpermute_backward, setup_context=_unpermute_setup)


# npu_moe_init_routing_v2 (unquantized): expanded_x and expanded_scale gather rows of x and
# scale, so their gradients are sums over the rows each token went to. An Autograd kernel, as
# register_autograd refuses the kwarg-only scale.

class _InitRouting(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, call, x, scale):
        with torch._C._AutoDispatchBelowAutograd():
            outs = op(x, scale=scale, **call)
        ctx.save_for_backward(call["expert_idx"], outs[1])
        ctx.call, ctx.x_shape, ctx.x_dtype, ctx.rows_out = call, x.shape, x.dtype, outs[0].numel() // max(x.shape[1], 1)
        ctx.scale_like = (scale.shape, scale.dtype) if scale is not None else None
        ctx.mark_non_differentiable(outs[1], outs[2])
        return outs

    @staticmethod
    def backward(ctx, grad_x, _grad_row_idx, _grad_counts, grad_scale):
        expert_idx, row_idx = ctx.saved_tensors
        call, (tokens, hidden) = ctx.call, ctx.x_shape
        k = expert_idx.shape[1]
        row_idx = row_idx.long()
        # (token, row, kept) for each gathered row; shapes fixed by the arguments (compile traces it)
        if call["row_idx_type"] == 0:  # row_idx[pair] = its row (-1: dropped; past rows_out: not active)
            kept = (row_idx >= 0) & (row_idx < ctx.rows_out)
            rows = torch.where(kept, row_idx, torch.zeros_like(row_idx))
            token_of = torch.arange(tokens * k, device=row_idx.device) // k
        else:  # row_idx[row] = its pair, for the first `active` rows
            start, end = call["active_expert_range"] or [0, call["expert_num"] if call["expert_num"] > 0 else 2**31]
            active = ((expert_idx >= start) & (expert_idx < end)).sum()
            if call["active_num"] > 0:
                active = active.clamp(max=call["active_num"])
            rows = torch.arange(min(ctx.rows_out, tokens * k), device=row_idx.device)
            kept = rows < active
            token_of = row_idx[:rows.shape[0]] // k
        dx = None
        if grad_x is not None:
            g = grad_x.reshape(-1, hidden).float()[rows] * kept.unsqueeze(-1)
            dx = torch.zeros(tokens, hidden, dtype=torch.float32, device=g.device).index_add_(0, token_of, g)
            dx = dx.to(ctx.x_dtype)
        dscale = None
        if grad_scale is not None and ctx.scale_like is not None:
            g = grad_scale.float()[rows] * kept
            dscale = torch.zeros(tokens, dtype=torch.float32, device=g.device).index_add_(0, token_of, g)
            dscale = dscale.to(ctx.scale_like[1])
        return None, None, dx, dscale


def _init_routing_autograd_kernel(op):
    def kernel(*args, **kwargs):
        call = _bind(op, args, kwargs)
        x, scale = call.pop("x"), call.pop("scale")
        wants_grad = torch.is_grad_enabled() and (x.requires_grad or (scale is not None and scale.requires_grad))
        if not wants_grad or call["quant_mode"] != -1:  # int8 results have no gradient
            with torch._C._AutoDispatchBelowAutograd():
                return op(x, scale=scale, **call)
        return _InitRouting.apply(op, call, x, scale)
    return kernel


# npu_grouped_matmul: torch.library.register_autograd takes no kwarg-only tensors (Ascend's bias,
# scale, ... are), so an Autograd kernel runs an autograd.Function over the flattened lists.

def _bind(op, args, kwargs):
    """The op's arguments by name, defaults filled in (the dispatcher passes only those given)."""
    bound = {}
    for i, arg in enumerate(op._schema.arguments):
        if i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        else:
            bound[arg.name] = arg.default_value if arg.has_default_value() else None
    return bound


class _GroupedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, call, n_x, n_weight, n_bias, *tensors):
        xs, weights = list(tensors[:n_x]), list(tensors[n_x:n_x + n_weight])
        bias = list(tensors[n_x + n_weight:n_x + n_weight + n_bias]) or None
        with torch._C._AutoDispatchBelowAutograd():
            outs = op(xs, weights, bias=bias, **call)
        group_list = call["group_list"]
        ctx.n_x, ctx.n_weight, ctx.n_bias = n_x, n_weight, n_bias
        ctx.bias_dtype = bias[0].dtype if bias else None
        ctx.group_ints = list(group_list) if isinstance(group_list, (list, tuple)) else None
        ctx.split_item = call["split_item"] if call["split_item"] is not None else 0
        ctx.group_list_type = call["group_list_type"] if call["group_list_type"] is not None else 0
        ctx.group_type = call["group_type"]
        if ctx.group_type is None:
            ctx.group_type = 0 if group_list is not None else -1
        quantized = any(call[name] is not None for name in ("scale", "antiquant_scale", "per_token_scale"))
        ctx.differentiable = not quantized and xs[0].is_floating_point() and weights[0].is_floating_point()
        saved = xs + weights + ([group_list] if isinstance(group_list, torch.Tensor) else [None])
        ctx.save_for_backward(*saved)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        grad_x, grad_weight, grad_bias = _gmm_backward(ctx, list(grads))
        return (None, None, None, None, None, *grad_x, *grad_weight, *(grad_bias or [None] * ctx.n_bias))


def _gmm_backward(ctx, grads):
    if not ctx.differentiable:
        raise NotImplementedError("npu::npu_grouped_matmul: no backward for quantized (int8 or antiquant) operands")
    if ctx.group_type == 2:
        raise NotImplementedError("npu::npu_grouped_matmul: no backward for k-axis grouping (group_type=2)")
    saved = ctx.saved_tensors
    xs, weights, group_tensor = list(saved[:ctx.n_x]), list(saved[ctx.n_x:ctx.n_x + ctx.n_weight]), saved[-1]
    single_weight = len(weights) == 1 and weights[0].dim() == 3
    experts = weights[0].shape[0] if single_weight else len(weights)

    def weight_of(e):
        return weights[0][e] if single_weight else weights[e]

    if ctx.group_type == -1 or len(xs) > 1:
        # x[i] @ weight[i]: results apart (one per x) or stacked along m
        if ctx.split_item in (2, 3):
            grads = list(grads[0].split([x.shape[0] for x in xs]))
        grad_x, grad_w, grad_b = [], [], []
        for i, x in enumerate(xs):
            g = grads[i] if grads[i] is not None else x.new_zeros(*x.shape[:-1], weight_of(i).shape[-1])
            g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
            grad_x.append((g2 @ weight_of(i).t()).reshape(x.shape))
            grad_w.append(x2.t() @ g2)
            if ctx.n_bias:
                grad_b.append(g2.sum(0, dtype=torch.float32).to(ctx.bias_dtype))
        return grad_x, ([torch.stack(grad_w)] if single_weight else grad_w), grad_b
    # one x, its rows grouped: dx is grouped along m by weight^T, dweight grouped along k
    x = xs[0]
    if ctx.group_ints is not None:
        group_list, list_type = torch.tensor(ctx.group_ints, dtype=torch.int64, device=x.device), 0
    else:
        group_list, list_type = group_tensor, ctx.group_list_type
    if ctx.split_item in (2, 3):
        grad_y = grads[0]
    else:  # one result per group (group_list as ints)
        sizes = [end - start for start, end in zip([0] + ctx.group_ints, ctx.group_ints)]
        grad_y = torch.cat([g if g is not None else x.new_zeros(size, weight_of(e).shape[-1])
                            for e, (g, size) in enumerate(zip(grads, sizes))])
        grad_y = torch.cat([grad_y, grad_y.new_zeros(x.shape[0] - grad_y.shape[0], grad_y.shape[1])])
    grad_y = grad_y.contiguous()
    transposed = [weights[0].transpose(1, 2)] if single_weight else [w.t() for w in weights]
    grad_x = _ops.npu_grouped_matmul([grad_y], transposed, group_list=group_list, group_list_type=list_type,
                                     group_type=0, split_item=3)
    grad_w = _ops.npu_grouped_matmul([x.t()], [grad_y], group_list=group_list, group_list_type=list_type,
                                     group_type=2, split_item=3)[0]
    grad_b = []
    if ctx.n_bias:  # each row's group by its place among the cumulative counts (rows past them: none)
        ends = group_list.cumsum(0) if list_type == 1 else group_list
        owner = torch.searchsorted(ends, torch.arange(x.shape[0], device=x.device), right=True)
        sums = torch.zeros(experts + 1, grad_y.shape[1], dtype=torch.float32, device=x.device)
        sums = sums.index_add_(0, owner, grad_y.float())[:experts].to(ctx.bias_dtype)
        grad_b = [sums] if single_weight else list(sums.unbind(0))
    return grad_x, ([grad_w] if single_weight else list(grad_w.unbind(0))), grad_b


def _gmm_autograd_kernel(op):
    def kernel(*args, **kwargs):
        call = _bind(op, args, kwargs)
        xs, weights, bias = list(call.pop("x")), list(call.pop("weight")), call.pop("bias")
        bias = list(bias) if bias is not None else []
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in xs + weights + bias)):
            with torch._C._AutoDispatchBelowAutograd():
                return op(xs, weights, bias=bias or None, **call)
        return list(_GroupedMatmul.apply(op, call, len(xs), len(weights), len(bias), *xs, *weights, *bias))
    return kernel


# ---- npu_moe_token_permute ----------------------------------------------------------------

def _permute_check(ok, tokens, message):
    if not ok:
        raise RuntimeError(f"npu::npu_moe_token_permute ({tokens.device}): {message}")


def _token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    """(permuted_tokens, sorted_indices): the (token, slot) pairs of ``indices`` ordered by
    expert, stably; ``sorted_indices[pair]`` is the row the pair lands on (int32), the index
    npu_moe_token_unpermute takes. ``num_out_tokens`` keeps that many rows (0 or None: all;
    negative: as a slice end)."""
    _permute_check(not padded_mode, tokens, "padded_mode=True is not supported by Ascend's kernel; pass "
                   "padded_mode=False (tokens routed without capacity padding)")
    _permute_check(tokens.dim() == 2, tokens, f"tokens must be 2-d [tokens, hidden], got {tuple(tokens.shape)}")
    _permute_check(tokens.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.int8), tokens,
                   f"tokens must be float16, bfloat16, float32 or int8, got {tokens.dtype}")
    _permute_check(indices.dtype in (torch.int32, torch.int64) and indices.dim() in (1, 2)
                   and indices.shape[0] == tokens.shape[0], tokens,
                   f"indices must be int32 or int64 of shape [{tokens.shape[0]}] or [{tokens.shape[0]}, topk], got "
                   f"{indices.dtype} {tuple(indices.shape)}")
    topk = 1 if indices.dim() == 1 else indices.shape[1]
    _permute_check(1 <= topk <= 512, tokens, f"topk (indices.size(1)) must be in [1, 512], got {topk}")
    order = torch.argsort(indices.reshape(-1), stable=True)
    sorted_indices = torch.argsort(order).to(torch.int32)
    kept = order[:num_out_tokens] if num_out_tokens else order
    return tokens.index_select(0, kept // topk), sorted_indices


_def = torch.library.Library("npu", "FRAGMENT")
_def.define("npu_moe_token_permute(Tensor tokens, Tensor indices, int? num_out_tokens=None, bool padded_mode=False) "
            "-> (Tensor, Tensor)")
_def.impl("npu_moe_token_permute", _token_permute, "CompositeImplicitAutograd")

_lib = torch.library.Library("npu", "IMPL")
_lib.impl("npu_moe_gating_top_k_softmax", _gating_autograd_kernel, "Autograd")
_lib.impl("npu_moe_init_routing_v2", _init_routing_autograd_kernel(_ops.npu_moe_init_routing_v2.default), "Autograd")
_lib.impl("npu_grouped_matmul", _gmm_autograd_kernel(_ops.npu_grouped_matmul.default), "Autograd")
_lib.impl("npu_grouped_matmul.List", _gmm_autograd_kernel(_ops.npu_grouped_matmul.List), "Autograd")


# ---- the public names ---------------------------------------------------------------------

def npu_moe_gating_top_k_softmax(x, finished=None, k=1):
    """``(y, expert_idx, row_idx)``: the ``k`` largest of ``softmax(x, -1)`` per row, their experts
    (int32; the expert count for rows ``finished`` marks) and ``row_idx[r, j] = j * rows + r``."""
    return _ops.npu_moe_gating_top_k_softmax(x, finished, k)


def npu_moe_init_routing_v2(x, expert_idx, *, scale=None, offset=None, active_num=-1, expert_capacity=-1,
                            expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False,
                            quant_mode=0, active_expert_range=[], row_idx_type=0):  # noqa: B006 (Ascend's defaults)
    """``(expanded_x, expanded_row_idx, expert_token_cumsum_or_count, expanded_scale)``: the tokens
    ordered by expert (optionally int8-quantized), as Ascend's MoeInitRoutingV2 gives them. As on Ascend,
    ``quant_mode`` defaults to 0, static int8 quantization (needs ``scale`` and ``offset``); pass -1 to
    route without quantization, 1 for dynamic int8."""
    return _ops.npu_moe_init_routing_v2(
        x, expert_idx, scale=scale, offset=offset, active_num=active_num, expert_capacity=expert_capacity,
        expert_num=expert_num, drop_pad_mode=drop_pad_mode, expert_tokens_num_type=expert_tokens_num_type,
        expert_tokens_num_flag=expert_tokens_num_flag, quant_mode=quant_mode,
        active_expert_range=list(active_expert_range), row_idx_type=row_idx_type)


def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None, antiquant_offset=None,
                       per_token_scale=None, group_list=None, activation_input=None, activation_quant_scale=None,
                       activation_quant_offset=None, split_item=0, group_type=None, group_list_type=0, act_type=0,
                       output_dtype=None, tuning_config=None, x_dtype=None, weight_dtype=None, scale_dtype=None,
                       per_token_scale_dtype=None):
    """``List[Tensor]``: ``x_i @ weight_i (+ bias_i)`` for each group; group_list as a Tensor
    (cumsum, counts or [group, count] pairs by ``group_list_type``) or a list of ints (cumsum).
    ``x_dtype``, ``weight_dtype``, ``scale_dtype`` and ``per_token_scale_dtype`` (hifloat8/float4/
    float8_e8m0fnu data, as torch_npu's dtype codes) are refused by name: this npu's kernels do not
    take those formats."""
    extra = dict(x_dtype=_code(x_dtype), weight_dtype=_code(weight_dtype), scale_dtype=_code(scale_dtype),
                 per_token_scale_dtype=_code(per_token_scale_dtype))
    if isinstance(group_list, (list, tuple)) and any(v is not None for v in extra.values()):
        given = ", ".join(f"{k}={_describe(v)}" for k, v in extra.items() if v is not None)
        raise RuntimeError(f"npu::npu_grouped_matmul ({x[0].device if len(x) else 'cpu'}): {given}: x_dtype, "
                           f"weight_dtype, scale_dtype and per_token_scale_dtype reinterpret the data as hifloat8/"
                           f"float4/float8_e8m0fnu (Ascend 950), which this npu's kernels do not take; leave them None")
    kwargs = dict(bias=bias, scale=scale, offset=offset, antiquant_scale=antiquant_scale,
                  antiquant_offset=antiquant_offset, per_token_scale=per_token_scale, group_list=group_list,
                  activation_input=activation_input, activation_quant_scale=activation_quant_scale,
                  activation_quant_offset=activation_quant_offset, split_item=split_item, group_type=group_type,
                  group_list_type=group_list_type, act_type=act_type, output_dtype=output_dtype)
    if isinstance(group_list, (list, tuple)):
        return _ops.npu_grouped_matmul.List(list(x), list(weight), **kwargs)
    return _ops.npu_grouped_matmul(list(x), list(weight), tuning_config=tuning_config, **extra, **kwargs)


def npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    """``(permuted_tokens, sorted_indices)``: ``permuted_tokens[sorted_indices[t * topk + j]] = tokens[t]``,
    rows ordered by expert (``indices[t, j]``), the first ``num_out_tokens`` kept."""
    return _ops.npu_moe_token_permute(tokens, indices, num_out_tokens, padded_mode)


def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    """``out[i] = sum_j probs[i, j] * permuted_tokens[sorted_indices[i * topk + j]]``."""
    return _ops.npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs, padded_mode, restore_shape)


def npu_dynamic_quant(x, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                      dst_type_max=0.0):
    """``(y, scale)``: per-token symmetric quantization, ``scale = absmax(x * smooth) / 127`` (float32)
    and ``y = round(x * smooth / scale)`` (int8; ``dst_type=torch.quint4x2``: int4, eight to an int32)."""
    return _ops.npu_dynamic_quant(x, smooth_scales=smooth_scales, group_index=group_index, dst_type=_code(dst_type),
                                  quant_mode=quant_mode, dst_type_max=dst_type_max)


def npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
                     x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None, group_sizes=None,
                     y_scale=None):
    """``(x1 @ x2 [+ int32 bias]) * scale * pertoken_scale + offset [+ float bias]`` for int8 (or
    int32-packed int4) operands; int8 result by default, else ``output_dtype`` (a torch.dtype or a
    torch_npu dtype code such as ``torch_npu.bfloat16``). ``x1_dtype``, ``x2_dtype``,
    ``pertoken_scale_dtype`` and ``scale_dtype`` (float8/float4/hifloat8 data: ``torch_npu.float8_e8m0fnu``,
    ...) are refused by name: this npu's kernels do not take those formats."""
    return _ops.npu_quant_matmul(x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale, bias=bias,
                                 output_dtype=_code(output_dtype), x1_dtype=_code(x1_dtype),
                                 x2_dtype=_code(x2_dtype), pertoken_scale_dtype=_code(pertoken_scale_dtype),
                                 scale_dtype=_code(scale_dtype), group_sizes=group_sizes, y_scale=y_scale)


def _describe(dtype):
    """How an error names a dtype argument: ``torch_npu.hifloat8 (290)``, ``torch.int8``."""
    from torch_npu import _C
    return _C._cd._describe(dtype) if isinstance(dtype, int) else str(dtype)


def _code(dtype):
    """An op's ``int`` dtype argument: a torch.dtype, a torch_npu dtype code (an int) or None."""
    if dtype is None or isinstance(dtype, int):
        return dtype
    if isinstance(dtype, torch.dtype):
        return dtype
    raise TypeError(f"expected a torch.dtype or a torch_npu dtype code (torch_npu.float8_e8m0fnu, ...), "
                    f"got {type(dtype).__name__}")


def npu_convert_weight_to_int4pack(weight, inner_k_tiles=0):
    """int32 values in [-8, 7] to int4, eight to an int32 along the last dimension."""
    return _ops.npu_convert_weight_to_int4pack(weight, inner_k_tiles)


def npu_trans_quant_param(scale, offset=None, round_mode=0):
    """int64 quantization parameters for npu_quant_matmul: the float32 scale's bits cut to FP19
    (bits 0-31, bit 46 set) and round(offset) in [-256, 255] at bits 37-45."""
    return _ops.npu_trans_quant_param(scale, offset, round_mode)
