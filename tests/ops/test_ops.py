"""Correctness of the npu op library against the cpu (issue 3, "Native op library").

Every case runs the same function on cpu tensors and on npu copies of them and
checks that
  * the results agree (torch.testing.assert_close, looser for float16/bfloat16),
  * every tensor result lives on the npu,
  * the op ran natively: the CPU fallback was not taken (its statistics stay at 0),
    so a kernel missing from the op library shows up here and not only as a slow run.
Inputs come in three layouts: contiguous, transposed and sliced with a step, built
on the npu with the same view op as on the cpu so that the npu kernels really see
non-contiguous memory.
"""
import pathlib
import re

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import torch_npu

Fallback = torch_npu.NPUFallbackMode
registry = torch_npu.ops.registry

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["contiguous", "transposed", "strided"]
# Both devices run ATen's CPU kernels, so results are usually bit-identical; the
# tolerances leave room for a different vectorisation of differently aligned memory.
TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
}


def tol(dtype):
    return TOL.get(dtype, {})


# ---- helpers -------------------------------------------------------------------------


def tensors_in(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from tensors_in(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_in(item)


def to_npu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.to("npu")
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_npu(o) for o in obj) if not hasattr(obj, "_fields") else tuple(map(to_npu, obj))
    return obj


def to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, (tuple, list)):
        return [to_cpu(o) for o in obj] if isinstance(obj, list) else tuple(to_cpu(o) for o in obj)
    return obj


def assert_on_npu(obj):
    found = list(tensors_in(obj))
    for t in found:
        assert t.device.type == "npu", f"a result is on {t.device}, expected the npu"
    return found


def assert_no_fallback():
    stats = Fallback.get_fallback_stats()
    assert stats.total == 0, "expected native npu kernels only, but the CPU fallback ran:\n" + stats.table()


def assert_same(got, expected, **kw):
    """``got`` (npu results) equals ``expected`` (cpu results); every tensor of got is on the npu."""
    assert_on_npu(got)
    kw.setdefault("equal_nan", True)
    assert_close(to_cpu(got), to_cpu(expected), **kw)


def check(fn, *cpu_args, npu_args=None, native=True, **kw):
    """Runs fn on the cpu args and on npu copies (or npu_args) and compares."""
    expected = fn(*cpu_args)
    if npu_args is None:
        npu_args = to_npu(cpu_args)
    Fallback.reset_fallback_stats()
    got = fn(*npu_args)
    torch.npu.synchronize()
    if native:
        assert_no_fallback()
    assert_same(got, expected, **kw)
    return got, expected


def sample(shape, dtype, kind="normal", seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        if kind == "nonzero":
            x = torch.randint(1, 9, shape, generator=g)
            return (x * (torch.randint(0, 2, shape, generator=g) * 2 - 1)).to(dtype)
        if kind in ("positive", "small"):
            return torch.randint(0, 4, shape, generator=g).to(dtype)
        return torch.randint(-20, 20, shape, generator=g).to(dtype)
    if kind == "positive":
        x = torch.rand(shape, generator=g) * 2 + 0.1
    elif kind == "unit":
        x = torch.rand(shape, generator=g) * 1.8 - 0.9
    else:
        x = torch.randn(shape, generator=g)
    return x.to(dtype)


def make(shape, dtype, layout="contiguous", kind="normal", seed=0):
    """(cpu, npu) versions of the same values, with the same layout and strides."""
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        base_shape = shape[:-2] + (shape[-1], shape[-2])
        view = lambda t: t.transpose(-1, -2)  # noqa: E731
    elif layout in ("strided", "transposed") and len(shape) >= 1:
        base_shape = shape[:-1] + (shape[-1] * 2,)
        view = lambda t: t[..., ::2]  # noqa: E731
    else:
        base_shape = shape
        view = lambda t: t  # noqa: E731
    base = sample(base_shape, dtype, kind, seed)
    cpu = view(base)
    npu = view(base.to("npu"))
    assert npu.shape == cpu.shape and npu.stride() == cpu.stride()
    if layout != "contiguous" and len(shape) >= 1 and cpu.numel() > 1:
        assert not npu.is_contiguous()
    return cpu, npu


# ---- elementwise unary -----------------------------------------------------------------

UNARY = {
    # name: (fn, input kind, works on integers)
    "exp": (torch.exp, "unit", False),
    "log": (torch.log, "positive", False),
    "sqrt": (torch.sqrt, "positive", False),
    "rsqrt": (torch.rsqrt, "positive", False),
    "tanh": (torch.tanh, "normal", False),
    "sigmoid": (torch.sigmoid, "normal", False),
    "relu": (torch.relu, "normal", True),
    "gelu": (F.gelu, "normal", False),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "normal", False),
    "silu": (F.silu, "normal", False),
    "neg": (torch.neg, "normal", True),
    "abs": (torch.abs, "normal", True),
    "clamp": (lambda x: torch.clamp(x, -0.5, 0.7), "normal", False),
    "clamp_int": (lambda x: torch.clamp(x, -5, 7), "normal", True),
    "clamp_min": (lambda x: x.clamp(min=0.1), "normal", False),
    "clamp_max": (lambda x: x.clamp(max=0.1), "normal", False),
    "sign": (torch.sign, "normal", True),
    "floor": (torch.floor, "normal", False),
    "round": (torch.round, "normal", False),
    "reciprocal": (torch.reciprocal, "positive", False),
    "sin": (torch.sin, "normal", False),
    "cos": (torch.cos, "normal", False),
    "erf": (torch.erf, "normal", False),
    "log1p": (torch.log1p, "positive", False),
    "expm1": (torch.expm1, "unit", False),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), "normal", False),
    "hardtanh": (F.hardtanh, "normal", False),
    "softplus": (F.softplus, "normal", False),
    "elu": (F.elu, "normal", False),
    "pow_scalar": (lambda x: x ** 2, "normal", True),
    "pow_frac": (lambda x: torch.pow(x, 1.5), "positive", False),
    "mul_scalar": (lambda x: x * 3, "normal", True),
    "rsub_scalar": (lambda x: 1 - x, "normal", True),
    "isnan": (torch.isnan, "normal", False),
    "logical_not": (torch.logical_not, "normal", True),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", [n for n in UNARY])
def test_unary_float(name, dtype, layout):
    fn, kind, _ = UNARY[name]
    x, xn = make((5, 7), dtype, layout, kind)
    out, _ = check(fn, x, npu_args=(xn,), **tol(dtype))
    assert out.dtype == fn(x).dtype


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("name", [n for n, (_, _, ints) in UNARY.items() if ints])
def test_unary_int64(name, layout):
    fn, kind, _ = UNARY[name]
    x, xn = make((5, 7), torch.int64, layout, kind)
    out, _ = check(fn, x, npu_args=(xn,))
    assert out.dtype == fn(x).dtype


def test_unary_on_empty_and_scalar_tensors():
    for shape in [(0,), (0, 3), ()]:
        x = torch.randn(shape)
        for fn in (torch.exp, torch.relu, torch.neg, lambda t: t + 1):
            check(fn, x)


# ---- elementwise binary: broadcasting and type promotion ---------------------------------

BINARY = {
    # name: (fn, kind of the second operand, works on integers)
    "add": (torch.add, "normal", True),
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=2), "normal", True),
    "sub": (torch.sub, "normal", True),
    "mul": (torch.mul, "normal", True),
    "div": (torch.div, "nonzero", True),
    "div_floor": (lambda a, b: torch.div(a, b, rounding_mode="floor"), "nonzero", True),
    "div_trunc": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), "nonzero", True),
    "remainder": (torch.remainder, "nonzero", True),
    "maximum": (torch.maximum, "normal", True),
    "minimum": (torch.minimum, "normal", True),
    "atan2": (torch.atan2, "normal", False),
    "eq": (torch.eq, "normal", True),
    "ne": (torch.ne, "normal", True),
    "lt": (torch.lt, "normal", True),
    "le": (torch.le, "normal", True),
    "gt": (torch.gt, "normal", True),
    "ge": (torch.ge, "normal", True),
    "logical_and": (torch.logical_and, "normal", True),
    "logical_or": (torch.logical_or, "normal", True),
    "logical_xor": (torch.logical_xor, "normal", True),
}
BROADCASTS = {
    "same": ((4, 5), (4, 5)),
    "row": ((4, 5), (5,)),
    "outer": ((3, 1, 5), (4, 1)),
    "zero_dim": ((4, 5), ()),
}


def _second_operand(shape, dtype, kind, seed=1):
    x = sample(shape, dtype, kind, seed)
    if dtype.is_floating_point and kind == "nonzero":
        x = x + torch.where(x >= 0, 0.5, -0.5).to(dtype)
    return x


@pytest.mark.parametrize("bcast", list(BROADCASTS))
@pytest.mark.parametrize("name,dtype", [(n, d) for n in BINARY for d in (torch.float32, torch.float16, torch.int64)
                                        if d.is_floating_point or BINARY[n][2]], ids=str)
def test_binary(name, dtype, bcast):
    fn, kind, ints = BINARY[name]
    sa, sb = BROADCASTS[bcast]
    a = sample(sa, dtype, "normal", 0)
    b = _second_operand(sb, dtype, kind)
    out, _ = check(fn, a, b, **tol(dtype))
    assert out.dtype == fn(a, b).dtype


@pytest.mark.parametrize("name", ["add", "mul", "div", "maximum", "lt", "logical_and"])
def test_binary_non_contiguous(name):
    fn, kind, _ = BINARY[name]
    a, an = make((6, 5), torch.float32, "transposed")
    b, bn = make((6, 5), torch.float32, "strided", "positive", seed=3)
    check(fn, a, b, npu_args=(an, bn))
    # mixed: non-contiguous against broadcast row
    check(fn, a, b[0], npu_args=(an, bn[0]))


PROMOTIONS = [
    ("f32+i64", lambda: (torch.randn(4, 3), torch.randint(-5, 5, (4, 3)))),
    ("f16+f32", lambda: (torch.randn(4, 3).half(), torch.randn(4, 3))),
    ("bf16+f16", lambda: (torch.randn(4, 3).bfloat16(), torch.randn(4, 3).half())),
    ("i32+i64", lambda: (torch.randint(-5, 5, (4, 3), dtype=torch.int32), torch.randint(-5, 5, (4, 3)))),
    ("u8+i8", lambda: (torch.randint(0, 9, (4, 3), dtype=torch.uint8), torch.randint(-5, 5, (4, 3), dtype=torch.int8))),
    ("bool+i64", lambda: (torch.rand(4, 3) > 0.5, torch.randint(-5, 5, (4, 3)))),
    ("i64+f32_0dim", lambda: (torch.randint(-5, 5, (4, 3)), torch.tensor(2.5))),
    ("f16+f32_0dim", lambda: (torch.randn(4, 3).half(), torch.tensor(2.5))),
]


@pytest.mark.parametrize("op", [torch.add, torch.mul, torch.sub, torch.div, torch.lt], ids=lambda f: f.__name__)
@pytest.mark.parametrize("case", [c for c, _ in PROMOTIONS])
def test_type_promotion(case, op):
    a, b = dict(PROMOTIONS)[case]()
    if op is torch.sub and (a.dtype == torch.bool or b.dtype == torch.bool):
        op = torch.logical_xor  # sub of bool is an error on every device
    lowest = TOL.get(min((a.dtype, b.dtype), key=lambda d: torch.finfo(d).bits if d.is_floating_point else 99))
    out, expected = check(op, a, b, **(lowest or {}))
    assert out.dtype == expected.dtype
    if op in (torch.add, torch.mul, torch.sub):
        assert out.dtype == torch.result_type(a, b)


@pytest.mark.parametrize("scalar", [2, 2.5, True, -3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32], ids=str)
def test_python_scalar_operands(dtype, scalar):
    a = sample((3, 4), dtype)
    fns = [lambda t: t + scalar, lambda t: scalar * t, lambda t: t > scalar, lambda t: torch.where(t > 0, t, scalar)]
    if scalar is not True:
        fns.append(lambda t: t - scalar)
    for fn in fns:
        out, expected = check(fn, a, **tol(dtype))
        assert out.dtype == expected.dtype


def test_cpu_zero_dim_tensor_with_npu_tensor():
    a = torch.randn(3, 4)
    s = torch.tensor(1.5)
    expected = a * s
    got = a.npu() * s  # a 0-dim cpu tensor is allowed next to npu tensors
    assert_same(got, expected)


def test_pow_tensor_exponent():
    base = sample((4, 5), torch.float32, "positive")
    exp = sample((4, 5), torch.float32, "unit", 2)
    check(torch.pow, base, exp)
    check(torch.pow, 2.0, exp, npu_args=(2.0, exp.npu()))
    check(torch.pow, torch.arange(1, 7).view(2, 3), torch.tensor([0, 1, 3]))


# ---- ternary ops ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_where(dtype):
    cond = torch.rand(4, 1, 5) > 0.5
    a = sample((3, 5), dtype, seed=1)
    b = sample((5,), dtype, seed=2)
    check(torch.where, cond, a, b)
    check(lambda c, x: torch.where(c, x, 0), cond, a)
    check(lambda c, x: torch.where(c, 1, x), cond, a)
    check(lambda x: torch.where(x > 0), a)  # the nonzero form: a tuple of index tensors
    a2, an = make((5, 6), dtype, "transposed", seed=4)
    check(lambda c, x: torch.where(c, x, -x), a2 > 0, a2, npu_args=(an > 0, an))


def test_where_type_promotion():
    cond = torch.rand(4, 5) > 0.5
    check(torch.where, cond, torch.randn(4, 5).half(), torch.randn(4, 5))
    check(torch.where, cond, torch.randint(0, 5, (4, 5)), torch.randn(5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_clamp_with_tensor_bounds(dtype):
    x = sample((4, 5), dtype)
    lo = sample((5,), dtype, seed=1) - 1
    hi = lo + 2
    check(lambda t, a, b: torch.clamp(t, a, b), x, lo, hi)
    check(lambda t, a: torch.clamp(t, min=a), x, lo)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_addcmul_addcdiv_lerp_functional(dtype):
    a, b, c = (sample(s, dtype, "positive", i) for i, s in enumerate([(4, 5), (4, 5), (5,)]))
    kw = tol(dtype)
    check(lambda x, y, z: torch.addcmul(x, y, z, value=0.5), a, b, c, **kw)
    check(lambda x, y, z: torch.addcdiv(x, y, z, value=-2), a, b, c, **kw)
    check(lambda x, y: torch.lerp(x, y, 0.3), a, b, **kw)
    check(lambda x, y, w: torch.lerp(x, y, w), a, b, c / 4, **kw)


# ---- reductions ---------------------------------------------------------------------------

REDUCTIONS = {
    # name: (fn(x, dim, keepdim), tuple dims allowed, integers allowed, input kind)
    "sum": (lambda x, d, k: x.sum() if d is None else x.sum(d, keepdim=k), True, True, "normal"),
    "mean": (lambda x, d, k: x.mean() if d is None else x.mean(d, keepdim=k), True, False, "normal"),
    "prod": (lambda x, d, k: x.prod() if d is None else x.prod(d, keepdim=k), False, True, "positive"),
    "max": (lambda x, d, k: x.max() if d is None else x.max(d, keepdim=k), False, True, "normal"),
    "min": (lambda x, d, k: x.min() if d is None else x.min(d, keepdim=k), False, True, "normal"),
    "amax": (lambda x, d, k: x.amax() if d is None else x.amax(d, keepdim=k), True, True, "normal"),
    "argmax": (lambda x, d, k: x.argmax() if d is None else x.argmax(d, keepdim=k), False, True, "normal"),
    "argmin": (lambda x, d, k: x.argmin() if d is None else x.argmin(d, keepdim=k), False, True, "normal"),
    "var": (lambda x, d, k: x.var() if d is None else x.var(d, keepdim=k), True, False, "normal"),
    "var_c0": (lambda x, d, k: x.var(correction=0) if d is None else x.var(d, keepdim=k, correction=0),
               True, False, "normal"),
    "std": (lambda x, d, k: x.std() if d is None else x.std(d, keepdim=k), True, False, "normal"),
    "norm": (lambda x, d, k: x.norm() if d is None else x.norm(dim=d, keepdim=k), True, False, "normal"),
    "norm_p1": (lambda x, d, k: x.norm(p=1) if d is None else x.norm(p=1, dim=d, keepdim=k), True, False, "normal"),
    "logsumexp": (lambda x, d, k: x.logsumexp((0, 1, 2)) if d is None else x.logsumexp(d, keepdim=k),
                  True, False, "normal"),
    "any": (lambda x, d, k: (x > 0.5).any() if d is None else (x > 0.5).any(d, keepdim=k), True, True, "normal"),
    "all": (lambda x, d, k: (x > -1.5).all() if d is None else (x > -1.5).all(d, keepdim=k), True, True, "normal"),
    "count_nonzero": (lambda x, d, k: torch.count_nonzero(x > 0) if d is None else
                      torch.count_nonzero(x > 0, dim=d), True, True, "normal"),
}
DIMS = {"all": (None, False), "d0": (0, False), "d-1_keep": (-1, True), "d1": (1, False), "d02": ((0, 2), False),
        "d02_keep": ((0, 2), True)}


REDUCTION_CASES = [
    (name, dtype, dims)
    for name, (_, multi, ints, _) in REDUCTIONS.items()
    for dtype in (torch.float32, torch.float16, torch.int64)
    for dims in DIMS
    if (dtype.is_floating_point or ints) and (multi or not isinstance(DIMS[dims][0], tuple))
]


@pytest.mark.parametrize("name,dtype,dims", REDUCTION_CASES, ids=str)
def test_reduction(name, dtype, dims):
    fn, multi, ints, kind = REDUCTIONS[name]
    dim, keepdim = DIMS[dims]
    x, xn = make((3, 4, 5), dtype, "contiguous", kind)
    if kind == "positive" and dtype.is_floating_point:  # keep products of 60 values in range
        x, xn = x * 0.5 + 0.6, xn * 0.5 + 0.6
    kw = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-5)
    out, expected = check(lambda t: fn(t, dim, keepdim), x, npu_args=(xn,), **kw)
    if isinstance(expected, tuple):
        assert len(out) == len(expected)


@pytest.mark.parametrize("layout", ["transposed", "strided"])
@pytest.mark.parametrize("name", ["sum", "mean", "max", "argmax", "var", "norm", "any"])
def test_reduction_non_contiguous(name, layout):
    fn, _, _, kind = REDUCTIONS[name]
    x, xn = make((4, 6, 5), torch.float32, layout, kind, seed=7)
    for dim, keep in [(None, False), (0, False), (-1, True), (1, False)]:
        check(lambda t: fn(t, dim, keep), x, npu_args=(xn,))


def test_reduction_with_dtype_argument_float32():
    x = torch.randint(0, 5, (4, 5))
    check(lambda t: t.sum(dtype=torch.float32), x)
    check(lambda t: t.sum(1, dtype=torch.float32), x)
    check(lambda t: t.float().mean(1, dtype=torch.float32), x)
    h = torch.randn(4, 5).half()
    check(lambda t: t.sum(dtype=torch.float32), h)
    check(lambda t: torch.cumsum(t, 0, dtype=torch.float32), h)


def test_var_mean_std_mean():
    x = torch.randn(4, 5, 6)
    out, _ = check(lambda t: torch.var_mean(t, dim=1), x)
    assert len(out) == 2
    check(lambda t: torch.std_mean(t, dim=(0, 2), keepdim=True), x)


# ---- linear algebra ------------------------------------------------------------------------

MATMUL_TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
              torch.float16: dict(rtol=3e-3, atol=3e-3)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_mm_bmm_addmm(dtype, layout):
    kw = MATMUL_TOL[dtype]
    a, an = make((6, 8), dtype, layout, seed=1)
    b, bn = make((8, 5), dtype, layout, seed=2)
    check(torch.mm, a, b, npu_args=(an, bn), **kw)
    c = sample((6, 5), dtype, seed=3)
    check(lambda x, y, z: torch.addmm(z, x, y), a, b, c, npu_args=(an, bn, c.npu()), **kw)
    check(lambda x, y, z: torch.addmm(z, x, y, beta=0.5, alpha=2), a, b, c[0], npu_args=(an, bn, c[0].npu()), **kw)
    p, pn = make((3, 6, 8), dtype, layout, seed=4)
    q, qn = make((3, 8, 5), dtype, layout, seed=5)
    check(torch.bmm, p, q, npu_args=(pn, qn), **kw)


MATMUL_SHAPES = {
    "1d@1d": ((7,), (7,)),
    "2d@1d": ((5, 7), (7,)),
    "1d@2d": ((7,), (7, 4)),
    "2d@2d": ((5, 7), (7, 4)),
    "3d@2d": ((3, 5, 7), (7, 4)),
    "2d@3d": ((5, 7), (3, 7, 4)),
    "3d@3d": ((3, 5, 7), (3, 7, 4)),
    "broadcast_4d": ((2, 1, 5, 7), (3, 7, 4)),
    "3d@1d": ((3, 5, 7), (7,)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shapes", list(MATMUL_SHAPES))
def test_matmul(shapes, dtype):
    sa, sb = MATMUL_SHAPES[shapes]
    a, b = sample(sa, dtype, seed=1), sample(sb, dtype, seed=2)
    out, expected = check(torch.matmul, a, b, **MATMUL_TOL[dtype])
    assert out.shape == expected.shape


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_linear_forward_backward(dtype, bias):
    x = sample((2, 3, 8), dtype, seed=1).requires_grad_()
    w = sample((5, 8), dtype, seed=2).requires_grad_()
    b = sample((5,), dtype, seed=3).requires_grad_() if bias else None
    xn, wn = x.detach().npu().requires_grad_(), w.detach().npu().requires_grad_()
    bn = b.detach().npu().requires_grad_() if bias else None
    kw = MATMUL_TOL[dtype]
    y = F.linear(x, w, b)
    Fallback.reset_fallback_stats()
    yn = F.linear(xn, wn, bn)
    assert_same(yn, y, **kw)
    g = sample(y.shape, dtype, seed=9)
    y.backward(g)
    yn.backward(g.npu())
    assert_no_fallback()
    assert_same(xn.grad, x.grad, **kw)
    assert_same(wn.grad, w.grad, **kw)
    if bias:
        assert_same(bn.grad, b.grad, **kw)


# ---- autograd helper: forward and gradients of every input --------------------------------


def check_grad(fn, *cpu_inputs, tol_kw=None, native=True, grad_seed=11):
    """fn(*inputs) on cpu and npu; compares outputs and the gradients of every float input."""
    tol_kw = tol_kw or dict(rtol=1e-4, atol=1e-5)
    cpu = [t.detach().clone().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
           for t in cpu_inputs]
    npu = [t.detach().to("npu").requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
           for t in cpu_inputs]
    out = fn(*cpu)
    Fallback.reset_fallback_stats()
    out_n = fn(*npu)
    assert_same(out_n, out, **tol_kw)
    outs = [t for t in tensors_in(out) if t.requires_grad]
    outs_n = [t for t in tensors_in(out_n) if t.requires_grad]
    grads = [sample(t.shape, t.dtype, seed=grad_seed + i) for i, t in enumerate(outs)]
    torch.autograd.backward(outs, grads)
    torch.autograd.backward(outs_n, [g.npu() for g in grads])
    torch.npu.synchronize()
    if native:
        assert_no_fallback()
    for i, (c, n) in enumerate(zip(cpu, npu)):
        if isinstance(c, torch.Tensor) and c.requires_grad:
            assert n.grad is not None, f"input {i} got no gradient on the npu"
            assert_same(n.grad, c.grad, **tol_kw)
    return out_n, out


# ---- convolution -----------------------------------------------------------------------------

CONV2D = {
    "basic": dict(),
    "stride_pad": dict(stride=2, padding=1),
    "dilation": dict(dilation=2, padding=2),
    "groups": dict(groups=2, padding=1),
    "pad_same": dict(padding="same"),
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cfg", list(CONV2D))
def test_conv2d_forward_backward(cfg, bias):
    kw = CONV2D[cfg]
    x = torch.randn(2, 4, 9, 8)
    w = torch.randn(6, 4 // kw.get("groups", 1), 3, 3)
    args = (x, w, torch.randn(6)) if bias else (x, w)
    check_grad(lambda *a: F.conv2d(*a, **kw), *args, tol_kw=dict(rtol=1e-4, atol=1e-4))


@pytest.mark.parametrize("cfg", [dict(), dict(stride=2, padding=1), dict(dilation=2), dict(groups=3, padding=2)],
                         ids=["basic", "stride_pad", "dilation", "groups"])
def test_conv1d_forward_backward(cfg):
    x = torch.randn(2, 6, 17)
    w = torch.randn(9, 6 // cfg.get("groups", 1), 3)
    check_grad(lambda *a: F.conv1d(*a, **cfg), x, w, torch.randn(9), tol_kw=dict(rtol=1e-4, atol=1e-4))


def test_conv2d_non_contiguous_input_and_channels_last():
    x, xn = make((2, 3, 8, 10), torch.float32, "transposed")
    w = torch.randn(4, 3, 3, 3)
    check(lambda t, k: F.conv2d(t, k, padding=1), x, w, npu_args=(xn, w.npu()), rtol=1e-4, atol=1e-4)
    xc = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    check(lambda t, k: F.conv2d(t, k), xc, w, rtol=1e-4, atol=1e-4)


def test_conv2d_bfloat16_forward():
    x = torch.randn(2, 3, 8, 8).bfloat16()
    w = torch.randn(4, 3, 3, 3).bfloat16()
    check(lambda t, k: F.conv2d(t, k, padding=1), x, w, rtol=3e-2, atol=3e-2)


def test_conv_transpose2d_forward_backward():
    x = torch.randn(2, 4, 5, 5)
    w = torch.randn(4, 3, 3, 3)
    check_grad(lambda a, b: F.conv_transpose2d(a, b, stride=2), x, w, tol_kw=dict(rtol=1e-4, atol=1e-4))


# ---- pooling ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                 dict(kernel_size=3, stride=2, ceil_mode=True), dict(kernel_size=2, dilation=2)],
                         ids=["k2", "k3s2p1", "ceil", "dilation"])
def test_max_pool2d(cfg):
    x = torch.randn(2, 3, 9, 10)
    check_grad(lambda t: F.max_pool2d(t, **cfg), x)
    out, _ = check(lambda t: F.max_pool2d(t, return_indices=True, **cfg), x)
    assert out[1].dtype == torch.int64


@pytest.mark.parametrize("cfg", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                 dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
                                 dict(kernel_size=3, ceil_mode=True)],
                         ids=["k2", "k3s2p1", "no_pad_count", "ceil"])
def test_avg_pool2d(cfg):
    check_grad(lambda t: F.avg_pool2d(t, **cfg), torch.randn(2, 3, 9, 10))


@pytest.mark.parametrize("size", [(1, 1), (3, 2), (9, 10), (4, 7)], ids=str)
def test_adaptive_avg_pool2d(size):
    check_grad(lambda t: F.adaptive_avg_pool2d(t, size), torch.randn(2, 3, 9, 10))


def test_pooling_half_and_non_contiguous():
    x, xn = make((2, 3, 8, 10), torch.float16, "transposed")
    kw = TOL[torch.float16]
    check(lambda t: F.max_pool2d(t, 2), x, npu_args=(xn,), **kw)
    check(lambda t: F.avg_pool2d(t, 2), x, npu_args=(xn,), **kw)
    check(lambda t: F.adaptive_avg_pool2d(t, 1), x, npu_args=(xn,), **kw)


# ---- softmax -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_forward_backward(fn, dim):
    check_grad(lambda t: fn(t, dim=dim), torch.randn(3, 4, 5) * 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_softmax_low_precision(dtype):
    x, xn = make((4, 9), dtype, "transposed")
    check(lambda t: F.softmax(t, -1), x, npu_args=(xn,), **tol(dtype))
    check(lambda t: F.log_softmax(t, 0), x, npu_args=(xn,), **tol(dtype))
    check(lambda t: F.softmax(t, -1, dtype=torch.float32), x, npu_args=(xn,))


# ---- normalisation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(8,), (4, 8)], ids=["last", "last_two"])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape, affine):
    x = torch.randn(3, 4, 8) * 2 + 1
    args = (x, torch.randn(shape), torch.randn(shape)) if affine else (x,)
    check_grad(lambda t, *wb: F.layer_norm(t, shape, *wb, eps=1e-5), *args, tol_kw=dict(rtol=1e-4, atol=1e-4))


def test_layer_norm_bfloat16():
    x = torch.randn(4, 16).bfloat16()
    check(lambda t: F.layer_norm(t, (16,)), x, **TOL[torch.bfloat16])


@pytest.mark.parametrize("dims", [1, 2])
def test_batch_norm_train_updates_running_stats(dims):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(5, momentum=0.3) if dims == 1 else torch.nn.BatchNorm2d(5, momentum=0.3)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-0.5, 0.5)
    bn_n = torch.nn.BatchNorm1d(5, momentum=0.3) if dims == 1 else torch.nn.BatchNorm2d(5, momentum=0.3)
    bn_n.load_state_dict(bn.state_dict())
    bn_n = bn_n.npu()
    shape = (8, 5) if dims == 1 else (4, 5, 3, 3)
    for step in range(3):
        x = torch.randn(shape) * (step + 1) + step
        xn = x.npu().requires_grad_()
        x.requires_grad_()
        Fallback.reset_fallback_stats()
        y, yn = bn(x), bn_n(xn)
        assert_same(yn, y, rtol=1e-4, atol=1e-5)
        g = torch.randn(shape)
        y.backward(g)
        yn.backward(g.npu())
        assert_no_fallback()
        assert_same(xn.grad, x.grad, rtol=1e-4, atol=1e-5)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert_same(getattr(bn_n, name), getattr(bn, name), rtol=1e-5, atol=1e-6)
    assert not torch.equal(bn_n.running_mean.cpu(), torch.zeros(5)), "running stats were not updated"
    assert_same(bn_n.weight.grad, bn.weight.grad, rtol=1e-4, atol=1e-5)
    assert_same(bn_n.bias.grad, bn.bias.grad, rtol=1e-4, atol=1e-5)
    # eval: the running statistics normalise, and stay as they are
    bn.eval()
    bn_n.eval()
    x = torch.randn(shape)
    before = bn_n.running_mean.cpu()
    Fallback.reset_fallback_stats()
    assert_same(bn_n(x.npu()), bn(x), rtol=1e-4, atol=1e-5)
    assert_no_fallback()
    assert torch.equal(bn_n.running_mean.cpu(), before)


def test_batch_norm_functional_eval_and_no_affine():
    x = torch.randn(4, 3, 5)
    mean, var = torch.randn(3), torch.rand(3) + 0.5
    check(lambda t, m, v: F.batch_norm(t, m, v, training=False), x, mean, var)
    rm, rv = torch.zeros(3), torch.ones(3)
    rmn, rvn = rm.npu(), rv.npu()
    check(lambda t, m, v: F.batch_norm(t, m, v, training=True, momentum=0.5), x, rm, rv, npu_args=(x.npu(), rmn, rvn))
    assert_same(rmn, rm)
    assert_same(rvn, rv)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm(groups):
    x = torch.randn(3, 4, 5, 6) * 2 + 1
    check_grad(lambda t, w, b: F.group_norm(t, groups, w, b), x, torch.randn(4), torch.randn(4),
               tol_kw=dict(rtol=1e-4, atol=1e-4))


# ---- embedding, dropout, losses ---------------------------------------------------------------------


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_forward_backward(padding_idx):
    weight = torch.randn(10, 4)
    ids = torch.tensor([[1, 2, 0, 2], [9, 1, 1, 0]])  # repeated ids accumulate gradients
    w = weight.clone().requires_grad_()
    wn = weight.npu().requires_grad_()
    out = F.embedding(ids, w, padding_idx=padding_idx)
    Fallback.reset_fallback_stats()
    out_n = F.embedding(ids.npu(), wn, padding_idx=padding_idx)
    assert_same(out_n, out)
    g = torch.randn(out.shape)
    out.backward(g)
    out_n.backward(g.npu())
    assert_no_fallback()
    assert_same(wn.grad, w.grad)
    if padding_idx is not None:
        assert torch.equal(wn.grad[padding_idx].cpu(), torch.zeros(4))


def test_embedding_module_and_int32_ids():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(7, 3)
    emb_n = torch.nn.Embedding(7, 3).npu()
    emb_n.load_state_dict(emb.state_dict())
    ids = torch.tensor([6, 0, 3], dtype=torch.int32)
    assert_same(emb_n(ids.npu()), emb(ids))


def test_dropout_p0_is_identity():
    x = torch.randn(50, 40)
    xn = x.npu()
    assert_same(F.dropout(xn, p=0.0, training=True), x)
    assert_same(F.dropout(xn, p=0.5, training=False), x)
    assert_same(torch.nn.Dropout(0.0).npu()(xn), x)


def test_dropout_half_scales_the_kept_values():
    torch.npu.manual_seed(0)
    x = torch.rand(200, 100) + 0.5  # no zeros of its own
    xn = x.npu().requires_grad_()
    Fallback.reset_fallback_stats()
    y = F.dropout(xn, p=0.5, training=True)
    assert y.device.type == "npu"
    kept = (y != 0).cpu()
    fraction = kept.float().mean().item()
    assert 0.45 < fraction < 0.55, fraction
    assert_close(y.cpu()[kept], x[kept] * 2)
    y.sum().backward()
    assert_no_fallback()
    assert xn.grad.device.type == "npu"
    assert_close(xn.grad.cpu(), kept.float() * 2)  # the gradient uses the same mask
    # a module: train drops, eval does not
    drop = torch.nn.Dropout(0.5)
    assert (drop(xn.detach()) == 0).any().item()
    drop.eval()
    assert_same(drop(xn.detach()), x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_and_cross_entropy(reduction):
    logits = torch.randn(6, 5)
    target = torch.tensor([0, 4, 2, 2, 1, 3])
    weight = torch.rand(5) + 0.5
    check_grad(lambda x: F.nll_loss(F.log_softmax(x, 1), target.to(x.device), reduction=reduction), logits)
    check_grad(lambda x: F.cross_entropy(x, target.to(x.device), weight=weight.to(x.device), reduction=reduction),
               logits)
    check_grad(lambda x: F.nll_loss(x, target.to(x.device), weight=weight.to(x.device), reduction=reduction), logits)
    check_grad(lambda x: F.cross_entropy(x, target.to(x.device), ignore_index=2, reduction=reduction), logits)
    check_grad(lambda x: F.cross_entropy(x, target.to(x.device), label_smoothing=0.1, reduction=reduction), logits)


def test_cross_entropy_spatial_and_probability_targets():
    logits = torch.randn(2, 4, 3, 5)
    target = torch.randint(0, 4, (2, 3, 5))
    check_grad(lambda x: F.cross_entropy(x, target.to(x.device)), logits)
    probs = torch.softmax(torch.randn(6, 5), 1)
    check_grad(lambda x: F.cross_entropy(x, probs.to(x.device)), torch.randn(6, 5))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction):
    check_grad(lambda a, b: F.mse_loss(a, b, reduction=reduction), torch.randn(4, 5), torch.randn(4, 5))
    check_grad(lambda a: F.mse_loss(a, torch.zeros_like(a), reduction=reduction), torch.randn(4, 5))


# ---- shape ops: cat, stack --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_stack(dtype, dim):
    a, an = make((3, 4), dtype, "contiguous", seed=1)
    b, bn = make((3, 4), dtype, "transposed", seed=2)
    c, cn = make((3, 4), dtype, "strided", seed=3)
    check(lambda *t: torch.cat(t, dim), a, b, c, npu_args=(an, bn, cn))
    check(lambda *t: torch.stack(t, dim), a, b, c, npu_args=(an, bn, cn))


def test_cat_edge_cases():
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    check(lambda x, y: torch.cat([x, y]), a, b)
    check(lambda x, y: torch.cat([x, y, x[:0]]), a, b)  # an empty piece
    check(lambda x, y: torch.cat([x, y.half()]), a, b)  # promotes to float32
    check(lambda x: torch.cat([x]), a)
    o = torch.empty(0, device="npu")
    got = torch.cat([a.npu(), b.npu()], out=o)
    assert got is o
    assert_same(o, torch.cat([a, b]))


# ---- indexing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_advanced_indexing(dtype):
    x, xn = make((5, 6, 4), dtype, "contiguous")
    idx = torch.tensor([4, 0, 2, 2])
    check(lambda t, i: t[i], x, idx, npu_args=(xn, idx.npu()))
    check(lambda t, i: t[:, i], x, idx, npu_args=(xn, idx.npu()))
    check(lambda t, i: t[i, 1:3, i % 4], x, idx, npu_args=(xn, idx.npu()))
    check(lambda t, i: t[i[:2, None], i[None, :]], x, idx, npu_args=(xn, idx.npu()))
    check(lambda t: t[t > 0], x, npu_args=(xn,))
    check(lambda t: t[(t > 0).all(-1).all(-1)], x, npu_args=(xn,))  # a mask over the first dim
    check(lambda t: t[torch.tensor([True, False, True, False, True], device=t.device)], x, npu_args=(xn,))
    # non-contiguous source
    y, yn = make((5, 6), dtype, "transposed", seed=2)
    check(lambda t, i: t[i], y, idx, npu_args=(yn, idx.npu()))
    check(lambda t: t[t > 0], y, npu_args=(yn,))


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    base = torch.randn(5, 4)
    idx = torch.tensor([0, 3, 3]) if accumulate else torch.tensor([0, 3, 1])
    vals = torch.randn(3, 4)
    x, xn = base.clone(), base.npu()
    Fallback.reset_fallback_stats()
    x.index_put_((idx,), vals, accumulate=accumulate)
    r = xn.index_put_((idx.npu(),), vals.npu(), accumulate=accumulate)
    assert r is xn
    assert_no_fallback()
    assert_same(xn, x)
    # the Python spellings
    x[idx[:1], 2] = 7.0
    xn[idx[:1].npu(), 2] = 7.0
    x[x > 1] = 0.0
    xn[xn > 1] = 0.0
    x[:, torch.tensor([1, 2])] = torch.ones(5, 2)
    xn[:, torch.tensor([1, 2], device="npu")] = torch.ones(5, 2, device="npu")
    assert_same(xn, x)
    check(lambda t, i, v: t.index_put((i,), v, accumulate=accumulate), base, idx, vals)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_index_select_gather_scatter(dtype):
    x, xn = make((4, 6), dtype, "transposed")
    idx = torch.tensor([5, 0, 2])
    check(lambda t, i: torch.index_select(t, 1, i), x, idx, npu_args=(xn, idx.npu()))
    check(lambda t, i: torch.index_select(t, 0, i[1:]), x, idx, npu_args=(xn, idx.npu()))
    g = torch.tensor([[0, 5, 5], [1, 1, 0], [2, 3, 4], [5, 4, 3]])
    check(lambda t, i: torch.gather(t, 1, i), x, g, npu_args=(xn, g.npu()))
    src = sample((4, 3), dtype, seed=5)
    dst = sample((4, 6), dtype, seed=6)
    s = torch.tensor([[0, 1, 2], [3, 4, 5], [5, 0, 1], [2, 2, 2]])
    check(lambda d, i, v: d.scatter(1, i, v), dst, s, src)
    check(lambda d, i: d.scatter(1, i, 3), dst, s)
    check(lambda d, i, v: d.scatter_add(1, i, v), dst, s, src)  # repeated indices add up
    check(lambda d, i, v: torch.scatter_reduce(d, 1, i, v, "sum"), dst, s, src)
    check(lambda d, i, v: torch.scatter_reduce(d, 1, i, v, "amax"), dst, s, src)
    # in place
    d, dn = dst.clone(), dst.npu()
    d.scatter_add_(1, s, src)
    dn.scatter_add_(1, s.npu(), src.npu())
    assert_same(dn, d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_masked_fill(dtype):
    x, xn = make((4, 5), dtype, "transposed")
    mask = torch.rand(4, 5) > 0.5
    row_mask = torch.rand(5) > 0.5
    value = True if dtype == torch.bool else 3
    check(lambda t, m: t.masked_fill(m, value), x, mask, npu_args=(xn, mask.npu()))
    check(lambda t, m: t.masked_fill(m, value), x, row_mask, npu_args=(xn, row_mask.npu()))  # broadcast
    check(lambda t, m: t.masked_fill(m, torch.tensor(value, device=t.device)), x, mask, npu_args=(xn, mask.npu()))
    y, yn = x.clone(), xn.clone()
    y.masked_fill_(mask, value)
    yn.masked_fill_(mask.npu(), value)
    assert_same(yn, y)


# ---- creation on the npu ----------------------------------------------------------------------------


CREATION = {
    "arange": lambda d: torch.arange(10, device=d),
    "arange_start_step": lambda d: torch.arange(2, 20, 3, device=d),
    "arange_float": lambda d: torch.arange(0.0, 1.0, 0.125, device=d),
    "arange_dtype": lambda d: torch.arange(5, dtype=torch.float16, device=d),
    "linspace": lambda d: torch.linspace(-1, 1, 9, device=d),
    "linspace_one": lambda d: torch.linspace(3, 3, 1, device=d),
    "zeros": lambda d: torch.zeros(3, 4, device=d),
    "zeros_int": lambda d: torch.zeros(3, dtype=torch.int64, device=d),
    "ones": lambda d: torch.ones(2, 3, dtype=torch.bfloat16, device=d),
    "full": lambda d: torch.full((2, 3), 2.5, device=d),
    "full_int": lambda d: torch.full((4,), 7, device=d),
    "full_bool": lambda d: torch.full((4,), True, device=d),
    "eye": lambda d: torch.eye(4, device=d),
    "eye_rect": lambda d: torch.eye(3, 5, dtype=torch.int64, device=d),
    "zeros_like": lambda d: torch.zeros_like(torch.empty(2, 3, device=d)),
    "ones_like": lambda d: torch.ones_like(torch.empty(2, 3, dtype=torch.int32, device=d)),
    "full_like": lambda d: torch.full_like(torch.empty(2, 3, device=d), -1.5),
    "tensor": lambda d: torch.tensor([[1.5, 2.0], [3.0, 4.0]], device=d),
    "empty_then_fill": lambda d: torch.empty(3, device=d).fill_(4.0),
    "tril_indices": lambda d: torch.tril_indices(4, 4, device=d),
}


@pytest.mark.parametrize("name", list(CREATION))
def test_creation_on_device(name):
    fn = CREATION[name]
    expected = fn("cpu")
    Fallback.reset_fallback_stats()
    got = fn("npu")
    assert_no_fallback()
    assert got.device == torch.device("npu", 0)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert_same(got, expected)


def test_creation_on_second_device():
    if torch.npu.device_count() < 2:
        pytest.skip("needs two npu devices")
    for fn in (CREATION["arange"], CREATION["eye"], CREATION["linspace"], CREATION["full"]):
        got = fn("npu:1")
        assert got.device == torch.device("npu", 1)
        assert_same(got, fn("cpu"))


# ---- random sampling on the npu (shapes and ranges; seeds are tested in test_random.py) ------------------


def test_random_shapes_and_ranges():
    torch.npu.manual_seed(1234)
    Fallback.reset_fallback_stats()
    r = torch.rand(200, 50, device="npu")
    assert r.device.type == "npu" and r.shape == (200, 50) and r.dtype == torch.float32
    rc = r.cpu()
    assert rc.min() >= 0 and rc.max() < 1 and 0.45 < rc.mean() < 0.55
    n = torch.randn(200, 50, device="npu", dtype=torch.bfloat16).cpu().float()
    assert abs(n.mean()) < 0.05 and 0.9 < n.std() < 1.1
    i = torch.randint(3, 9, (1000,), device="npu")
    assert i.dtype == torch.int64 and i.device.type == "npu"
    ic = i.cpu()
    assert ic.min() == 3 and ic.max() == 8
    i32 = torch.randint(0, 2, (7, 3), device="npu", dtype=torch.int32)
    assert i32.dtype == torch.int32 and i32.shape == (7, 3)
    x = torch.empty(10000, device="npu").normal_(5.0, 2.0).cpu()
    assert 4.9 < x.mean() < 5.1 and 1.9 < x.std() < 2.1
    u = torch.empty(10000, device="npu").uniform_(-3, -1).cpu()
    assert u.min() >= -3 and u.max() < -1 and -2.05 < u.mean() < -1.95
    h = torch.empty(100, dtype=torch.float16, device="npu").uniform_().cpu()
    assert h.min() >= 0 and h.max() <= 1
    p = torch.randperm(20, device="npu")
    assert sorted(p.cpu().tolist()) == list(range(20))
    b = torch.bernoulli(torch.full((5000,), 0.25, device="npu")).cpu()
    assert 0.2 < b.mean() < 0.3
    m = torch.multinomial(torch.tensor([0.0, 1.0, 3.0], device="npu"), 400, replacement=True).cpu()
    assert m.min() >= 1 and 0.65 < (m == 2).float().mean() < 0.85
    assert_no_fallback()
    # random in-place on a non-contiguous view only touches the view
    base = torch.zeros(6, 8, device="npu")
    base[:, ::2].uniform_(1, 2)
    bc = base.cpu()
    assert (bc[:, 1::2] == 0).all() and (bc[:, ::2] >= 1).all()


# ---- sort, topk, cumsum, nonzero, unique ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_sort_topk(dtype):
    x, xn = make((6, 9), dtype, "transposed")
    # ties make index order ambiguous unless stable; distinct values for float
    for fn in (lambda t: torch.sort(t, dim=-1), lambda t: torch.sort(t, dim=0, descending=True),
               lambda t: torch.sort(t, stable=True), lambda t: torch.topk(t, 3),
               lambda t: torch.topk(t, 2, dim=0, largest=False), lambda t: torch.argsort(t, dim=1, stable=True),
               lambda t: torch.kthvalue(t, 2, dim=1), lambda t: torch.msort(t)):
        out, expected = check(fn, x, npu_args=(xn,))
        if isinstance(expected, tuple):
            assert all(t.device.type == "npu" for t in out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_cumsum(dtype):
    x, xn = make((5, 6), dtype, "strided")
    kw = dict(rtol=3e-2, atol=3e-2) if dtype == torch.bfloat16 else {}
    check(lambda t: torch.cumsum(t, 0), x, npu_args=(xn,), **kw)
    check(lambda t: torch.cumsum(t, -1), x, npu_args=(xn,), **kw)
    check(lambda t: torch.cumsum(t, 1, dtype=torch.float32), x, npu_args=(xn,), **kw)
    if dtype.is_floating_point:
        check(lambda t: torch.cumprod(t, 1), x * 0.5 + 1, npu_args=(xn * 0.5 + 1,), **kw)


def test_nonzero_and_unique():
    x = torch.tensor([[0, 3, 0, 1], [2, 0, 0, 3], [1, 1, 0, 0]])
    check(torch.nonzero, x)
    check(lambda t: torch.nonzero(t, as_tuple=True), x)
    check(torch.nonzero, torch.zeros(3, 4))  # empty result
    check(lambda t: t.T.nonzero(), x)
    check(torch.unique, x)
    out, _ = check(lambda t: torch.unique(t, return_inverse=True, return_counts=True), x)
    assert len(out) == 3
    check(lambda t: torch.unique(t, dim=0), torch.tensor([[1, 2], [0, 1], [1, 2]]))
    check(lambda t: torch.unique(t, sorted=True), torch.tensor([2.5, -1.0, 2.5, 0.0]))
    check(lambda t: torch.unique_consecutive(t, return_counts=True), torch.tensor([1, 1, 2, 2, 2, 1]))
    check(lambda t: torch.bincount(t), torch.tensor([0, 3, 3, 1]))


# ---- optimizer ops -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_addcmul_addcdiv_lerp_in_place(dtype):
    kw = tol(dtype)
    a, an = make((5, 6), dtype, "transposed", "positive", 1)
    b, bn = make((5, 6), dtype, "strided", "positive", 2)
    c, cn = make((6,), dtype, "contiguous", "positive", 3)
    Fallback.reset_fallback_stats()
    for op in (lambda x, y, z: x.addcmul_(y, z, value=0.1), lambda x, y, z: x.addcdiv_(y, z, value=-0.5),
               lambda x, y, z: x.lerp_(y, 0.25), lambda x, y, z: x.lerp_(y, z / 8)):
        op(a, b, c)
        rn = op(an, bn, cn)
        assert rn is an
        assert_same(an, a, **kw)
    assert_no_fallback()


def _lists(dtype, n=3, seed=0):
    cpu = [sample((i + 2, 3), dtype, "positive", seed + i) for i in range(n)]
    return cpu, [t.npu() for t in cpu]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_foreach_ops(dtype):
    kw = tol(dtype)
    xs, xn = _lists(dtype, seed=0)
    ys, yn = _lists(dtype, seed=10)
    zs, zn = _lists(dtype, seed=20)
    Fallback.reset_fallback_stats()
    steps = [
        lambda x, y, z: torch._foreach_add_(x, y),
        lambda x, y, z: torch._foreach_add_(x, y, alpha=-0.5),
        lambda x, y, z: torch._foreach_add_(x, 1.5),
        lambda x, y, z: torch._foreach_mul_(x, 0.9),
        lambda x, y, z: torch._foreach_mul_(x, y),
        lambda x, y, z: torch._foreach_addcmul_(x, y, z, value=0.01),
        lambda x, y, z: torch._foreach_addcdiv_(x, y, z, value=0.1),
        lambda x, y, z: torch._foreach_lerp_(x, y, 0.3),
        lambda x, y, z: torch._foreach_lerp_(x, y, z),
    ]
    for step in steps:
        step(xs, ys, zs)
        step(xn, yn, zn)
        for a, an in zip(xs, xn):
            assert_same(an, a, **kw)
    # out-of-place variants return lists on the npu
    out = torch._foreach_sqrt(xn)
    assert_same(out, torch._foreach_sqrt(xs), **kw)
    norms = torch._foreach_norm(xn)
    assert_same(norms, torch._foreach_norm(xs), **kw)
    assert_no_fallback()


# ---- views, out=, tuples ---------------------------------------------------------------------------------


def test_in_place_ops_on_views_write_through():
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    bn = base.npu()
    Fallback.reset_fallback_stats()
    for op in (lambda b: b[:, 1::2].add_(100), lambda b: b[1].mul_(-1), lambda b: b.t()[2:4].exp_(),
               lambda b: b.view(2, 12)[1].clamp_(max=5), lambda b: b[::2, ::3].zero_(),
               lambda b: b.diagonal().fill_(7), lambda b: b[:, 0].copy_(torch.arange(4.0, device=b.device)),
               lambda b: b.unsqueeze(0)[0, 3].sigmoid_(), lambda b: b[2:, 1:].masked_fill_(b[2:, 1:] > 3, -2)):
        op(base)
        op(bn)
        assert_same(bn, base)
    assert_no_fallback()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_out_variants(dtype):
    a = sample((3, 4), dtype, seed=1)
    b = sample((3, 4), dtype, seed=2)
    an, bn = a.npu(), b.npu()
    Fallback.reset_fallback_stats()
    o = torch.empty(3, 4, dtype=dtype, device="npu")
    r = torch.add(an, bn, out=o)
    assert r is o
    assert_same(o, a + b)
    o0 = torch.empty(0, dtype=dtype, device="npu")
    r = torch.mul(an, bn, out=o0)
    assert r is o0 and o0.shape == (3, 4)
    assert_same(o0, a * b)
    ob = torch.empty(0, dtype=torch.bool, device="npu")
    torch.lt(an, bn, out=ob)
    assert_same(ob, a < b)
    os = torch.empty(0, dtype=dtype, device="npu")
    torch.sum(an, 1, out=os)
    assert_same(os, a.sum(1))
    if dtype.is_floating_point:
        om = torch.empty(0, dtype=dtype, device="npu")
        torch.mm(an, bn.t(), out=om)
        assert om.shape == (3, 3)
        assert_same(om, a @ b.t(), rtol=1e-4, atol=1e-4)
    values, indices = torch.empty(0, dtype=dtype, device="npu"), torch.empty(0, dtype=torch.int64, device="npu")
    r = torch.max(an, 1, out=(values, indices))
    assert r[0] is values and r[1] is indices
    assert_same((values, indices), tuple(a.max(1)))
    # an out= tensor that is a view of a bigger one writes into it
    big = torch.zeros(3, 8, dtype=dtype, device="npu")
    torch.add(an, bn, out=big[:, ::2])
    expected = torch.zeros(3, 8, dtype=dtype)
    expected[:, ::2] = a + b
    assert_same(big, expected)
    assert_no_fallback()


def test_tuple_results_are_all_on_npu():
    x = torch.randn(4, 6)
    xn = x.npu()
    for fn in (lambda t: t.max(1), lambda t: t.min(0), lambda t: torch.sort(t), lambda t: torch.topk(t, 2),
               lambda t: torch.aminmax(t), lambda t: torch.var_mean(t, 1), lambda t: t.median(1),
               lambda t: torch.mode(t.round(), 1), lambda t: torch.cummax(t, 1), lambda t: torch.split(t, 2),
               lambda t: torch.chunk(t, 3, 1), lambda t: torch.unbind(t), lambda t: torch.std_mean(t),
               lambda t: F.max_pool1d(t[None], 2, return_indices=True)):
        got = fn(xn)
        assert len(assert_on_npu(got)) >= 2
        assert_same(got, fn(x))


def test_results_follow_the_input_device():
    if torch.npu.device_count() < 2:
        pytest.skip("needs two npu devices")
    x = torch.randn(4, 5)
    xn = x.to("npu:1")
    assert torch.npu.current_device() == 0
    for fn in (torch.exp, lambda t: t + 1, lambda t: t.sum(0), lambda t: t @ t.T, lambda t: torch.sort(t)[1],
               lambda t: F.softmax(t, 1), lambda t: t[t > 0], lambda t: torch.cat([t, t])):
        for r in tensors_in(fn(xn)):
            assert r.device == torch.device("npu", 1)


# ---- the registry of native kernels ---------------------------------------------------------------------


def test_number_of_native_kernels():
    n = registry.num_registered
    by_backend = registry.summary()
    print(f"\n[torch_npu] aten op overloads with native npu kernels: {n} "
          f"(registry summary: {by_backend})")
    assert n >= 1000
    assert n >= by_backend["npu"] > 0


@pytest.mark.parametrize("name", ["add", "mul", "exp", "mm", "sum", "_softmax", "native_layer_norm",
                                  "convolution_overrideable", "cat", "index_select", "addmm", "bmm",
                                  "native_batch_norm", "embedding_dense_backward", "_foreach_add_", "lerp_",
                                  "addcdiv_", "gather", "scatter_add", "topk", "sort", "nonzero", "cumsum"])
def test_registry_native_ops(name):
    info = registry.get(name)
    assert info is not None, name
    assert info.backend == "npu", info
    assert info.priority > 0
    assert "npu" in registry.backends_for_op(name)
    assert registry.contains(name)


@pytest.mark.parametrize("name", ["linear", "matmul", "softmax", "cross_entropy_loss", "dropout", "log_softmax",
                                  "layer_norm", "batch_norm", "group_norm"])
def test_registry_composite_ops(name):
    info = registry.get(name)
    assert info is not None, name
    assert info.backend == "composite", info
    assert not registry.contains(name)


def test_native_op_library_names_all_matched():
    """Every name of the op library resolved to an operator with a CPU kernel."""
    unmatched = torch_npu._C._unmatched_library_names()
    assert unmatched is not None
    # the names PyTorch decomposes (CompositeImplicitAutograd) are allowed not to match
    for name in unmatched:
        info = registry.get(name)
        assert info is None or info.backend != "cpu", f"op library name {name!r} falls back to the cpu: {info}"



def test_every_vector_math_function_is_settled_at_import():
    """ATen sends contiguous float and double unary ops to MKL's vector math, one call
    per thread; MKL picks a function's kernel at its first call, and concurrent first
    calls can give one thread a low-accuracy kernel (pytorch/pytorch#188792). import
    torch_npu calls every such function once, on one thread, first: the list must
    cover every function this torch routes there (its ATen/cpu/vml.h)."""
    if not torch.backends.mkl.is_available():
        pytest.skip("this torch is built without MKL: no vector math library to settle")
    header = pathlib.Path(torch.__file__).parent / "include" / "ATen" / "cpu" / "vml.h"
    if not header.exists():
        pytest.skip(f"{header} is not installed: the list cannot be checked against it")
    routed = set(re.findall(r"^IMPLEMENT_VML_MKL\((\w+),", header.read_text(), re.MULTILINE))
    settled = {name.removeprefix("aten::") for name in torch_npu._C._vector_math_settled()}
    assert routed, f"no IMPLEMENT_VML_MKL line found in {header}"
    assert routed <= settled, f"not settled at import: {sorted(routed - settled)}"
    assert "logit" in settled  # its kernel calls MKL's vsLn/vdLn itself, outside vml.h

# ---- npu and cpu tensors do not mix (as cuda and cpu tensors do not) ---------------------------------------

MIXED_DEVICE_OPS = {
    "add": lambda n, c: n + c,
    "add_cpu_first": lambda n, c: c + n,
    "mm": lambda n, c: n.view(2, 3) @ c.view(3, 2),
    "cat": lambda n, c: torch.cat([n, c]),
    "where": lambda n, c: torch.where(n > 0, n, c),
    "in_place_on_npu": lambda n, c: n.add_(c),
}


@pytest.mark.parametrize("name", list(MIXED_DEVICE_OPS))
def test_npu_op_with_a_cpu_tensor_raises(name):
    n = torch.ones(6, device="npu")
    c = torch.ones(6)
    with pytest.raises(RuntimeError, match="same device"):
        MIXED_DEVICE_OPS[name](n, c)
        torch.npu.synchronize()


def test_npu_op_with_a_zero_dim_cpu_tensor_is_allowed():
    n = torch.ones(6, device="npu")
    assert_same(n + torch.tensor(2.0), torch.full((6,), 3.0))
    assert_same(torch.where(n > 0, n, torch.tensor(0.0)), torch.ones(6))


def test_in_place_op_on_a_cpu_tensor_with_an_npu_argument_is_not_lost():
    c = torch.ones(3)
    n = torch.full((3,), 2.0, device="npu")
    try:
        c.add_(n)
        torch.npu.synchronize()
    except RuntimeError as error:  # raising (as cuda does) is fine too
        assert "device" in str(error)
        return
    assert torch.equal(c, torch.full((3,), 3.0)), f"cpu tensor not updated: {c}"


# ---- found by the OpInfo sweep (tests/ops/test_opinfo.py) ----------------------------------------------


def test_views_made_by_native_kernels_are_regular_autograd_views():
    x = torch.arange(6.0, device="npu", requires_grad=True)
    windows = x.unfold(0, 2, 1)
    assert not windows.is_inference() and windows._base is x
    windows.sum().backward()
    assert_close(x.grad.cpu(), torch.tensor([1.0, 2.0, 2.0, 2.0, 2.0, 1.0]))


def test_conjugate_and_negative_bits_survive_the_npu():
    c = torch.tensor([1 + 2j, -3 - 1j], dtype=torch.complex64)
    assert_close(c.npu().conj().cpu(), c.conj())
    assert_close(torch._neg_view(torch.ones(3).npu()).cpu(), -torch.ones(3))
    x = torch.arange(5.0)
    assert_close(torch.fft.ifft(x.npu()).cpu(), torch.fft.ifft(x))
    assert_close(torch.view_as_real(c.npu()).cpu(), torch.view_as_real(c))
    assert_close(torch.view_as_complex(torch.view_as_real(c).npu()).cpu(), c)


def test_batch_norm_through_the_fallback_updates_running_stats():
    x = torch.randn(3, 5, dtype=torch.float64)
    cpu_mean, cpu_var = torch.zeros(5, dtype=torch.float64), torch.ones(5, dtype=torch.float64)
    npu_mean, npu_var = cpu_mean.npu(), cpu_var.npu()
    F.batch_norm(x, cpu_mean, cpu_var, training=True)
    F.batch_norm(x.npu(), npu_mean, npu_var, training=True)
    assert torch_npu.NPUFallbackMode.get_fallback_stats().total >= 1
    assert_close(npu_mean.cpu(), cpu_mean)
    assert_close(npu_var.cpu(), cpu_var)


def test_in_place_op_that_resizes_self():
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    expected = torch.zeros(1).addbmm_(a, b)
    actual = torch.zeros(1, device="npu").addbmm_(a.npu(), b.npu())
    assert actual.shape == expected.shape == (3, 5)
    assert_close(actual.cpu(), expected)


def test_resize_to_the_same_shape_keeps_a_non_contiguous_tensor():
    x = torch.arange(6.0).reshape(2, 3).t()
    assert_close(x.npu().resize_(3, 2).cpu(), x.clone().resize_(3, 2))
