"""The fused C++ ops against their unfused compositions: forward and backward,
float32, float16 and bfloat16, npu and cpu tensors."""
import pytest
import torch
import torch.nn.functional as F

import torch_npu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def rms_norm_ref(x, gamma, eps=1e-6):
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(x.float().pow(2).mean(dims, keepdim=True) + eps)
    return (x.float() * rstd * gamma.float()).to(x.dtype), rstd.detach()  # rstd is not differentiable


def rotate_ref(x, mode):
    if mode == "half":
        x1, x2 = x.chunk(2, -1)
        return torch.cat((-x2, x1), -1)
    return torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)


def compare(fused, reference, inputs, dtype, device):
    """Runs both on copies of `inputs`; compares results and input gradients."""
    # The reference computes in float32 on the values rounded to `dtype`, as the fused kernels do.
    ref_in = [t.detach().to(dtype).float().requires_grad_() for t in inputs]
    fused_in = [t.detach().to(device, dtype).requires_grad_() for t in inputs]
    expected = reference(*ref_in)
    actual = fused(*fused_in)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    for e, a in zip(expected, actual):
        assert a.device.type == device
        torch.testing.assert_close(a.float().cpu(), e.float().detach(), **tol(dtype))
    sum(e.float().square().sum() for e in expected if e.requires_grad).backward()
    sum(a.float().square().sum() for a in actual if a.requires_grad).backward()
    for r, f in zip(ref_in, fused_in):
        torch.testing.assert_close(f.grad.float().cpu(), r.grad, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", ["npu", "cpu"])
def test_rms_norm(dtype, device):
    torch.manual_seed(0)
    x, gamma = torch.randn(3, 5, 16), torch.randn(16)
    compare(lambda a, g: torch_npu.npu_rms_norm(a, g), rms_norm_ref, [x, gamma], dtype, device)


def test_rms_norm_of_empty_rows_is_nan_like_the_composition():
    x, gamma = torch.randn(3, 0), torch.randn(0)
    expected_y, expected_rstd = rms_norm_ref(x, gamma)
    for device in ("npu", "cpu"):
        y, rstd = torch_npu.npu_rms_norm(x.to(device), gamma.to(device))
        assert y.shape == (3, 0) and rstd.shape == (3, 1)
        torch.testing.assert_close(rstd.cpu(), expected_rstd, equal_nan=True)
        y, rstd, x_sum = torch_npu.npu_add_rms_norm(x.to(device), x.to(device), gamma.to(device), 1e-6)
        assert rstd.isnan().all() and x_sum.shape == (3, 0)


def test_rms_norm_over_two_dims_and_rstd_shape():
    x, gamma = torch.randn(2, 3, 4, 8).npu(), torch.randn(4, 8).npu()
    y, rstd = torch_npu.npu_rms_norm(x, gamma, 1e-5)
    assert rstd.shape == (2, 3, 1, 1) and rstd.dtype == torch.float32
    expected, expected_rstd = rms_norm_ref(x.cpu(), gamma.cpu(), 1e-5)
    torch.testing.assert_close(y.cpu(), expected)
    torch.testing.assert_close(rstd.cpu(), expected_rstd)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm(dtype):
    torch.manual_seed(0)
    x1, x2, gamma = torch.randn(4, 32), torch.randn(4, 32), torch.randn(32)

    def reference(a, b, g):
        y, rstd = rms_norm_ref(a + b, g)
        return y, rstd, a + b

    compare(lambda a, b, g: torch_npu.npu_add_rms_norm(a, b, g), reference, [x1, x2, gamma], dtype, "npu")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 1])
def test_swiglu(dtype, dim):
    torch.manual_seed(0)
    x = torch.randn(3, 8, 6)

    def reference(a):
        first, second = a.chunk(2, dim)
        return F.silu(first) * second

    compare(lambda a: torch_npu.npu_swiglu(a, dim), reference, [x], dtype, "npu")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_with_broadcast_tables(dtype, mode):
    torch.manual_seed(0)
    x, r1, r2 = torch.randn(2, 5, 3, 8), torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    compare(lambda a, c, s: torch_npu.npu_rotary_mul(a, c, s, mode),
            lambda a, c, s: a * c + rotate_ref(a, mode) * s, [x, r1, r2], dtype, "npu")


def test_fused_add_matmul():
    torch.manual_seed(0)
    x, w = torch.randn(3, 4, 8), torch.randn(8, 8)
    compare(torch_npu.npu_fused_add_matmul, lambda a, b: a @ b + a, [x, w], torch.float32, "npu")


def test_fused_ops_are_torch_ops_and_check_inputs():
    assert torch_npu.npu_rms_norm is not None and hasattr(torch.ops.npu, "npu_swiglu")
    x = torch.randn(4, 8).npu()
    with pytest.raises(RuntimeError, match="npu::npu_rms_norm: gamma's shape"):
        torch_npu.npu_rms_norm(x, torch.ones(4).npu())
    with pytest.raises(RuntimeError, match="npu_rms_norm: self must be float32, float16 or bfloat16"):
        torch_npu.npu_rms_norm(x.double(), torch.ones(8, dtype=torch.float64).npu())
    with pytest.raises(RuntimeError, match="npu_swiglu: dimension -1 of size 7 must be even"):
        torch_npu.npu_swiglu(torch.randn(2, 7).npu())
    with pytest.raises(ValueError, match="rotary_mode must be 'half' or 'interleave'"):
        torch_npu.npu_rotary_mul(x, x, x, "full")
    with pytest.raises(RuntimeError, match="same device"):
        torch_npu.npu_rms_norm(x, torch.ones(8))


def test_fused_ops_pass_opcheck():
    x = torch.randn(3, 8).npu()
    for op, args in ((torch.ops.npu.npu_rms_norm.default, (x, torch.randn(8).npu(), 1e-6)),
                     (torch.ops.npu.npu_swiglu.default, (x, -1)),
                     (torch.ops.npu.npu_rotary_mul.default, (x, torch.randn(8).npu(), torch.randn(8).npu(), "half")),
                     (torch.ops.npu.npu_add_rms_norm.default, (x, x.clone(), torch.randn(8).npu(), 1e-6))):
        result = torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                             "test_autograd_registration"))
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_non_contiguous_inputs_and_fake_strides():
    q = torch.randn(2, 8, 4, 16).npu().transpose(1, 2)  # as HF models pass q.transpose(1, 2)
    y = torch_npu.npu_rotary_mul(q, torch.randn(16).npu(), torch.randn(16).npu())
    assert y.is_contiguous()
    for op, args in ((torch.ops.npu.npu_rotary_mul.default, (q, torch.randn(16).npu(), torch.randn(16).npu(), "half")),
                     (torch.ops.npu.npu_rms_norm.default, (q, torch.randn(16).npu(), 1e-6)),
                     (torch.ops.npu.npu_swiglu.default, (q, -1))):
        result = torch.library.opcheck(op, args, test_utils=("test_faketensor",))
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_rotary_with_explicit_rotate_matrix_is_differentiable():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, requires_grad=True)
    r1, r2, rotate = torch.randn(8), torch.randn(8), torch.randn(8, 8)
    xn = x.detach().npu().requires_grad_()
    out = torch_npu.npu_rotary_mul(xn, r1.npu(), r2.npu(), rotate=rotate.npu())
    expected = x * r1 + (x @ rotate) * r2
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), expected.detach())
    torch.testing.assert_close(xn.grad.cpu(), x.grad)


def test_swiglu_extreme_inputs():
    x = torch.tensor([[-200.0, -90.0, 0.0, 90.0, 1.0, 2.0, 3.0, 4.0]])
    torch.testing.assert_close(torch_npu.npu_swiglu(x.npu()).cpu(), F.silu(x[:, :4]) * x[:, 4:])
