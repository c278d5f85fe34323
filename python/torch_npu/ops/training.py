"""The training operators MindSpeed and diffusers call (csrc/ops/fused/training.cpp).

Exposed as ``torch.ops.npu.<name>`` and ``torch_npu.<name>`` with the Ascend adapter's signatures,
defaults and results; their kernels serve npu and cpu tensors and their meta kernels let
torch.compile trace them. Derivatives, registered here, through the backward ops Ascend has:

- ``npu_geglu`` (``npu_geglu_grad``), ``npu_fast_gelu`` and ``fast_gelu`` (``npu_fast_gelu_backward``),
  ``npu_mish`` (``npu_mish_backward``), ``npu_confusion_transpose``
  (``npu_confusion_transpose_backward``), ``npu_linear`` (``npu_linear_backward``);
- ``npu_layer_norm_eval`` is ``F.layer_norm`` and differentiates as it does;
- ``npu_group_norm_silu`` and ``npu_sort_v2``, forward-only on Ascend: their exact derivatives
  (composed from aten ops), so that a graph through them gets gradients rather than a silent None.

``npu_apply_adam_w`` and ``npu_apply_adam`` are optimizer steps: with ``out=(var, m, v)`` they
update the three in place (their functional forms raise, as on Ascend) and refuse tensors that
require grad while grad mode is on.

``npu_geglu`` and ``npu_group_norm_silu`` are aclnn kernels on Ascend: under the profile of a chip
without them (910A, 310P) they raise NotImplementedError naming the chip.
"""
import torch

__all__ = [
    "npu_geglu",
    "npu_apply_adam_w",
    "npu_apply_adam",
    "npu_fast_gelu",
    "fast_gelu",
    "npu_group_norm_silu",
    "npu_confusion_transpose",
    "npu_mish",
    "npu_layer_norm_eval",
    "npu_linear",
    "npu_sort_v2",
]

_ops = torch.ops.npu


def _gelu_mode(approximate):
    return "tanh" if approximate == 1 else "none"


# ---- derivatives ------------------------------------------------------------------------------

def _geglu_setup(ctx, inputs, output):
    self, dim, approximate, activate_left = inputs
    ctx.save_for_backward(self, output[1])
    ctx.args = (dim, approximate, activate_left)
    ctx.set_materialize_grads(False)  # an unused result's gradient stays None


def _geglu_backward(ctx, grad_y, grad_gelu):
    self, gelu = ctx.saved_tensors
    dim, approximate, activate_left = ctx.args
    if grad_y is None:  # an unused output's gradient arrives as None: it is zero
        grad_y = torch.zeros_like(gelu)
    dx = _ops.npu_geglu_grad(grad_y.contiguous(), self, gelu, dim, approximate, activate_left)
    if grad_gelu is not None:
        # The gelu result's own gradient (Ascend's backward takes y's only): into the gate half.
        gate = self.chunk(2, dim)[0 if activate_left else 1]
        d_gate = torch.ops.aten.gelu_backward(grad_gelu.to(gate.dtype), gate, approximate=_gelu_mode(approximate))
        zero = torch.zeros_like(d_gate)
        dx = dx + torch.cat([d_gate, zero] if activate_left else [zero, d_gate], dim)
    return dx, None, None, None


torch.library.register_autograd("npu::npu_geglu", _geglu_backward, setup_context=_geglu_setup)


def _save_input(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _fast_gelu_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return _ops.npu_fast_gelu_backward(grad.contiguous(), x)


torch.library.register_autograd("npu::npu_fast_gelu", _fast_gelu_backward, setup_context=_save_input)


def _mish_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return _ops.npu_mish_backward(grad.contiguous(), x)


torch.library.register_autograd("npu::npu_mish", _mish_backward, setup_context=_save_input)


def _confusion_transpose_setup(ctx, inputs, output):
    self, perm, shape, transpose_first = inputs
    ctx.args = (list(perm), list(self.shape), transpose_first)


def _confusion_transpose_backward(ctx, grad):
    perm, shape, transpose_first = ctx.args
    # As op-plugin's derivative: the input's shape, transpose_first inverted.
    return _ops.npu_confusion_transpose_backward(grad, perm, shape, not transpose_first), None, None, None


torch.library.register_autograd("npu::npu_confusion_transpose", _confusion_transpose_backward,
                                setup_context=_confusion_transpose_setup)


def _linear_setup(ctx, inputs, output):
    input_, weight, bias = inputs
    ctx.save_for_backward(input_, weight)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad):
    input_, weight = ctx.saved_tensors
    dx, dw = _ops.npu_linear_backward(grad.contiguous(), input_, weight)
    db = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return dx, dw, db


torch.library.register_autograd("npu::npu_linear", _linear_backward, setup_context=_linear_setup)


def _group_norm_silu_setup(ctx, inputs, output):
    input_, weight, bias, group, eps = inputs
    ctx.save_for_backward(input_, weight, bias)
    ctx.group, ctx.eps = group, eps
    ctx.set_materialize_grads(False)  # unused results' gradients stay None


def _group_norm_silu_backward(ctx, dy, dmean, drstd):
    if (dmean is not None and dmean.any()) or (drstd is not None and drstd.any()):
        raise RuntimeError("torch_npu.npu_group_norm_silu: a loss through its mean or rstd results has no derivative "
                           "here (Ascend's op has no backward at all); use them detached (.detach())")
    x, weight, bias = ctx.saved_tensors
    if dy is None:
        return None, None, None, None, None
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // max(n * c, 1)
    # GroupNorm recomputed in float, then SiLU's and GroupNorm's derivatives.
    xf = x.float()
    wf = None if weight is None else weight.float()
    bf = None if bias is None else bias.float()
    y, mean, rstd = torch.ops.aten.native_group_norm(xf, wf, bf, n, c, hw, ctx.group, ctx.eps)
    s = torch.sigmoid(y)
    dgn = dy.float() * s * (1 + y * (1 - s))
    mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1],
            bias is not None and ctx.needs_input_grad[2]]
    dx, dw, db = torch.ops.aten.native_group_norm_backward(dgn, xf, mean, rstd, wf, n, c, hw, ctx.group, mask)
    return (None if dx is None else dx.to(x.dtype), None if dw is None else dw.to(weight.dtype),
            None if db is None else db.to(bias.dtype), None, None)


torch.library.register_autograd("npu::npu_group_norm_silu", _group_norm_silu_backward,
                                setup_context=_group_norm_silu_setup)


def _sort_v2_setup(ctx, inputs, output):
    self, dim, descending = inputs
    ctx.save_for_backward(self)
    ctx.descending = descending


def _sort_v2_backward(ctx, grad):
    # Each sorted value's gradient back to where it came from.
    (x,) = ctx.saved_tensors
    order = torch.sort(x, dim=-1, descending=ctx.descending, stable=True).indices
    return torch.zeros_like(x).scatter_(-1, order, grad), None, None


torch.library.register_autograd("npu::npu_sort_v2", _sort_v2_backward, setup_context=_sort_v2_setup)


# ---- the public names ---------------------------------------------------------------------------

def npu_geglu(self, dim=-1, approximate=1, activate_left=False):
    """GEGLU: ``self`` split in halves ``a, b`` along ``dim``; returns ``(a * gelu(b), gelu(b))``
    (``activate_left=True``: ``(gelu(a) * b, gelu(a))``); ``approximate`` 1 tanh, 0 erf GELU."""
    return _ops.npu_geglu(self, dim, approximate, activate_left)


def _out(op, out):
    if not isinstance(out, (tuple, list)) or len(out) != 3 or not all(isinstance(t, torch.Tensor) for t in out):
        raise TypeError(f"torch_npu.{op}: out must be a tuple of three tensors (var, m, v), got {out!r}")
    return dict(var=out[0], m=out[1], v=out[2])


def npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad, max_grad_norm=None,
                     amsgrad=None, maximize=None, *, out=None):
    """One AdamW step on ``out=(var, m, v)``, in place (returns them). ``beta1_power`` and
    ``beta2_power`` are ``beta ** (step - 1)``: the op multiplies them by beta once more."""
    if out is None:
        return _ops.npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad,
                                     max_grad_norm, amsgrad, maximize)
    return _ops.npu_apply_adam_w.out(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad,
                                     max_grad_norm, amsgrad, maximize, **_out("npu_apply_adam_w", out))


def npu_apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking=None, use_nesterov=None,
                   *, out=None):
    """TensorFlow's ApplyAdam on ``out=(var, m, v)``, in place (returns them); ``beta1_power`` and
    ``beta2_power`` are ``beta ** step``. Deprecated on Ascend in favour of torch.optim.Adam."""
    if out is None:
        return _ops.npu_apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking,
                                   use_nesterov)
    return _ops.npu_apply_adam.out(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking,
                                   use_nesterov, **_out("npu_apply_adam", out))


def npu_fast_gelu(self):
    """``x * sigmoid(1.702 * x)``."""
    return _ops.npu_fast_gelu(self)


def fast_gelu(self):
    """``npu_fast_gelu`` under its older name."""
    return _ops.fast_gelu(self)


def npu_group_norm_silu(input, weight, bias, group, eps=1e-5):
    """``silu(group_norm(input, group, weight, bias, eps))`` with the groups' ``mean`` and ``rstd``
    ``[N, group]``: returns ``(out, mean, rstd)``."""
    return _ops.npu_group_norm_silu(input, weight, bias, group, eps)


def npu_confusion_transpose(self, perm, shape, transpose_first):
    """``self.permute(perm).reshape(shape)`` (``transpose_first``) or ``self.reshape(shape).permute(perm)``,
    contiguous."""
    return _ops.npu_confusion_transpose(self, perm, shape, transpose_first)


def npu_mish(self):
    """``x * tanh(softplus(x))`` (``torch.nn.functional.mish``); float16, float32."""
    return _ops.npu_mish(self)


def npu_layer_norm_eval(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``torch.nn.functional.layer_norm`` (no statistics kept)."""
    return _ops.npu_layer_norm_eval(input, normalized_shape, weight, bias, eps)


def npu_linear(input, weight, bias=None):
    """``input @ weight.T + bias`` for 2-D input ``[M, K]`` and weight ``[N, K]``."""
    return _ops.npu_linear(input, weight, bias)


def npu_sort_v2(self, dim=-1, descending=False, *, out=None):
    """The values of ``torch.sort`` along the last dimension (the only one Ascend sorts), without
    indices."""
    if out is None:
        return _ops.npu_sort_v2(self, dim, descending)
    return _ops.npu_sort_v2.out(self, dim, descending, out=out)
