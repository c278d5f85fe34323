"""The fused C++ ops (csrc/ops/fused): their derivatives.

Exposed as ``torch.ops.npu.<name>`` and ``torch_npu.<name>`` with the Ascend
adapter's signatures. The kernels serve npu and cpu tensors; autograd uses the
fused backward kernels; their meta kernels (C++, beside the kernels: one
definition of each op's checks and shapes) let torch.compile and torch.export
trace them on fake tensors without running them.
"""
import torch

__all__ = ["npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_rotary_mul", "npu_fused_add_matmul"]

_ops = torch.ops.npu


# ---- derivatives ------------------------------------------------------------------------

def _rms_norm_setup(ctx, inputs, output):
    x, gamma, _ = inputs
    ctx.save_for_backward(x, gamma, output[1])


def _rms_norm_backward(ctx, dy, _drstd):
    x, gamma, rstd = ctx.saved_tensors
    dx, dgamma = _ops.npu_rms_norm_backward(dy.contiguous(), x, gamma, rstd)
    return dx, dgamma.to(gamma.dtype), None


torch.library.register_autograd("npu::npu_rms_norm", _rms_norm_backward, setup_context=_rms_norm_setup)


def _add_rms_norm_setup(ctx, inputs, output):
    _, _, gamma, _ = inputs
    ctx.save_for_backward(output[2], gamma, output[1])


def _add_rms_norm_backward(ctx, dy, _drstd, dx_sum):
    x_sum, gamma, rstd = ctx.saved_tensors
    dx, dgamma = _ops.npu_rms_norm_backward(dy.contiguous(), x_sum, gamma, rstd)
    if dx_sum is not None:
        dx = dx + dx_sum
    return dx, dx, dgamma.to(gamma.dtype), None


torch.library.register_autograd("npu::npu_add_rms_norm", _add_rms_norm_backward, setup_context=_add_rms_norm_setup)


def _swiglu_setup(ctx, inputs, output):
    x, dim = inputs
    ctx.save_for_backward(x)
    ctx.dim = dim


def _swiglu_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return _ops.npu_swiglu_backward(grad.contiguous(), x, ctx.dim), None


torch.library.register_autograd("npu::npu_swiglu", _swiglu_backward, setup_context=_swiglu_setup)


def _rotary_setup(ctx, inputs, output):
    x, r1, r2, mode, rotate = inputs
    ctx.save_for_backward(x, r1, r2)
    ctx.mode = mode
    ctx.explicit_rotate = rotate is not None


def _rotary_backward(ctx, grad):
    if ctx.explicit_rotate:  # torch_npu.npu_rotary_mul composes that case, so only a direct op call gets here
        raise NotImplementedError("torch.ops.npu.npu_rotary_mul: no backward with an explicit rotate matrix; "
                                  "call torch_npu.npu_rotary_mul, which composes it differentiably")
    x, r1, r2 = ctx.saved_tensors
    dx, dr1, dr2 = _ops.npu_rotary_mul_backward(grad.contiguous(), x, r1, r2, ctx.mode)
    return dx, dr1, dr2, None, None


torch.library.register_autograd("npu::npu_rotary_mul", _rotary_backward, setup_context=_rotary_setup)


# ---- the public names ---------------------------------------------------------------------

def npu_rms_norm(x, gamma, epsilon=1e-6):
    """RMSNorm over the last ``gamma.dim()`` dimensions: ``(y, rstd)``, rstd float32."""
    return _ops.npu_rms_norm(x, gamma, epsilon)


def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    """``x = x1 + x2`` then RMSNorm: ``(y, rstd, x)``."""
    return _ops.npu_add_rms_norm(x1, x2, gamma, epsilon)


def npu_swiglu(x, dim=-1):
    """``silu(a) * b`` for the two halves ``a, b`` of ``x`` along ``dim``."""
    return _ops.npu_swiglu(x, dim)


def npu_rotary_mul(x, r1, r2, rotary_mode="half", rotate=None):
    """Rotary embedding ``x * r1 + rotate(x) * r2`` (``rotary_mode`` "half" or "interleave"; with
    ``rotate`` given, ``rotate(x) = x @ rotate``, composed, so autograd differentiates it)."""
    if rotate is not None:
        return x * r1 + (x @ rotate) * r2
    return _ops.npu_rotary_mul(x, r1, r2, rotary_mode)


def npu_fused_add_matmul(x, w):
    """``x @ w + x``."""
    return _ops.npu_fused_add_matmul(x, w)
