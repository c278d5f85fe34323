"""The unboxed asynchronous paths of hot ops without a structured kernel (issue 45).

native_layer_norm, its backward and index_select allocate their results in npu
memory at the call, from metadata alone, and run the cpu kernel's compute step
at once on an idle stream or queued behind the stream's work. Element-wise calls
whose inputs the cpu converts (mixed dtypes, integer division) run their meta
step at the call on meta tensors, and the cpu's meta step with its conversions
in stream order. Each must give the cpu's values, dtypes, shapes and strides and
raise its errors; read its inputs in stream order; keep autograd and graph
capture working.
"""
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import torch_npu  # noqa: F401

from conftest import NUM_DEVICES

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def tol(dtype):
    return dict(rtol=1e-2, atol=1e-2) if dtype in (torch.float16, torch.bfloat16) else {}


def assert_like_cpu(got, expected, **kw):
    """Same device kind, dtype, shape, strides and values as the cpu's result."""
    if expected is None:
        assert got is None
        return
    assert got.device.type == "npu"
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.stride() == expected.stride()
    assert_close(got.cpu(), expected, **kw)


def npu(t):
    return None if t is None else t.npu()


# ---- native_layer_norm ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_layer_norm_matches_cpu(dtype, affine):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, generator=g).to(dtype)
    w = torch.randn(8, generator=g).to(dtype) if affine in ("both", "weight") else None
    b = torch.randn(8, generator=g).to(dtype) if affine in ("both", "bias") else None
    expected = torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.npu(), [8], npu(w), npu(b), 1e-5)
    for r, e in zip(got, expected):
        assert_like_cpu(r, e, **tol(dtype))


@pytest.mark.parametrize("shape,normalized", [((4, 6), [6]), ((2, 3, 4), [3, 4]), ((0, 5), [5]), ((7,), [7]),
                                              ((2, 0), [0])])
def test_layer_norm_shapes_and_empty(shape, normalized):
    x = torch.randn(shape)
    w = torch.randn(normalized)
    expected = torch.ops.aten.native_layer_norm(x, normalized, w, None, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.npu(), normalized, w.npu(), None, 1e-5)
    for r, e in zip(got, expected):
        assert_like_cpu(r, e, equal_nan=True)


def test_layer_norm_non_contiguous_input():
    x = torch.randn(6, 10)[:, ::2]                       # strided: the kernel's contiguous copy
    xt = torch.randn(5, 4).t()                           # transposed
    for inp in (x, xt):
        n = inp.shape[-1]
        w, b = torch.randn(n), torch.randn(n)
        expected = torch.ops.aten.native_layer_norm(inp, [n], w, b, 1e-5)
        got = torch.ops.aten.native_layer_norm(inp.npu() if inp.is_contiguous() else npu_view(inp), [n], w.npu(),
                                               b.npu(), 1e-5)
        for r, e in zip(got, expected):
            assert_like_cpu(r, e)


def npu_view(t):
    """The same non-contiguous view of an npu copy of t's base."""
    base = t._base if t._base is not None else t
    return base.npu().as_strided(t.shape, t.stride(), t.storage_offset())


def test_layer_norm_errors_like_cpu():
    x = torch.randn(2, 4)
    for args in (([3], torch.randn(3), None), ([4], torch.randn(5), None), ([4], None, torch.randn(2))):
        with pytest.raises(RuntimeError) as cpu_error:
            torch.ops.aten.native_layer_norm(x, args[0], args[1], args[2], 1e-5)
        with pytest.raises(RuntimeError) as npu_error:
            torch.ops.aten.native_layer_norm(x.npu(), args[0], npu(args[1]), npu(args[2]), 1e-5)
        assert str(cpu_error.value).splitlines()[0] in str(npu_error.value)


def test_layer_norm_mixed_dtypes_take_the_generic_kernel():
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    w, b = torch.randn(8), torch.randn(8)
    expected = torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.npu(), [8], w.npu(), b.npu(), 1e-5)
    for r, e in zip(got, expected):
        assert_like_cpu(r, e, **tol(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_layer_norm_gradients_match_cpu(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 16, generator=g).to(dtype)
    w = torch.randn(16, generator=g).to(dtype)
    b = torch.randn(16, generator=g).to(dtype)
    upstream = torch.randn(4, 3, 16, generator=g).to(dtype)
    grads = []
    for dev in ("cpu", "npu"):
        leaves = [t.to(dev).detach().requires_grad_() for t in (x, w, b)]
        F.layer_norm(leaves[0], (16,), leaves[1], leaves[2]).backward(upstream.to(dev))
        grads.append([t.grad for t in leaves])
    for got, expected in zip(grads[1], grads[0]):
        assert_like_cpu(got, expected, **tol(dtype))


def test_layer_norm_backward_output_masks():
    x, w, b = torch.randn(5, 6), torch.randn(6), torch.randn(6)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [6], w, b, 1e-5)
    dy = torch.randn(5, 6)
    for mask in ([True, True, True], [True, False, False], [False, True, False], [False, False, True]):
        for weight, bias in ((w, b), (w, None), (None, None)):
            if (mask[1] and weight is None) or (mask[2] and bias is None):
                continue
            expected = torch.ops.aten.native_layer_norm_backward(dy, x, [6], mean, rstd, weight, bias, mask)
            got = torch.ops.aten.native_layer_norm_backward(dy.npu(), x.npu(), [6], mean.npu(), rstd.npu(),
                                                            npu(weight), npu(bias), mask)
            for r, e in zip(got, expected):
                assert_like_cpu(r, e)


def test_layer_norm_backward_without_rows_gives_zeros():
    x, w, b = torch.randn(0, 6), torch.randn(6), torch.randn(6)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [6], w, b, 1e-5)
    args = (torch.randn(0, 6), x, [6], mean, rstd, w, b, [True, True, True])
    expected = torch.ops.aten.native_layer_norm_backward(*args)
    got = torch.ops.aten.native_layer_norm_backward(*[a.npu() if isinstance(a, torch.Tensor) else a for a in args])
    for r, e in zip(got, expected):
        assert_like_cpu(r, e)


# ---- index_select -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                                   torch.uint8, torch.bool])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_index_select_matches_cpu(dtype, index_dtype):
    x = (torch.randn(5, 4, 3) * 10).to(dtype)
    for dim in (0, 1, -1):
        index = torch.tensor([2, 0, 2, 1], dtype=index_dtype) % x.shape[dim]
        assert_like_cpu(torch.index_select(x.npu(), dim, index.npu()), torch.index_select(x, dim, index))


def test_index_select_non_contiguous_scalar_and_empty():
    x = torch.randn(6, 8)
    cases = [
        (x.t(), 0, torch.tensor([1, 3])),                      # transposed self
        (x, 1, torch.tensor([5, 1, 7, 0])[::2]),               # strided index
        (torch.tensor(3.5), 0, torch.tensor([0])),             # 0-dim self
        (torch.tensor(3.5), 0, torch.tensor(0)),               # 0-dim self and index
        (x, 0, torch.tensor(4)),                               # 0-dim index
        (x, 0, torch.tensor([], dtype=torch.int64)),           # empty index
        (torch.randn(0, 3), 1, torch.tensor([2, 2])),          # empty self
    ]
    for self_, dim, index in cases:
        self_npu = npu_view(self_) if not self_.is_contiguous() else self_.npu()
        index_npu = npu_view(index) if not index.is_contiguous() else index.npu()
        assert_like_cpu(torch.index_select(self_npu, dim, index_npu), torch.index_select(self_, dim, index))


def test_index_select_errors_like_cpu():
    x = torch.randn(4, 3)
    # What metadata shows raises at the call, as on the cpu.
    for dim, index in [(2, torch.tensor([0])), (0, torch.tensor([[0]])), (0, torch.tensor([0.0])),
                       (0, torch.tensor([0, 1], dtype=torch.int16))]:
        with pytest.raises((IndexError, RuntimeError)) as cpu_error:
            torch.index_select(x, dim, index)
        with pytest.raises(cpu_error.type) as npu_error:
            torch.index_select(x.npu(), dim, index.npu())
        assert str(cpu_error.value).splitlines()[0] in str(npu_error.value)
    # An index value out of range: the kernel's error, at the call on an idle stream,
    # else (every kernel queued) at the next synchronisation, as a device reports it.
    for index in (torch.tensor([0, 4]), torch.tensor([-5])):
        with pytest.raises(IndexError) as cpu_error:
            torch.index_select(x, 0, index)
        with pytest.raises((IndexError, RuntimeError)) as npu_error:
            torch.index_select(x.npu(), 0, index.npu())
            torch.npu.synchronize()
        assert str(cpu_error.value).splitlines()[0] in str(npu_error.value)


def test_index_select_index_on_another_device_is_refused():
    x = torch.randn(4, 3).npu()
    with pytest.raises(RuntimeError, match="same device"):
        torch.index_select(x, 0, torch.tensor([0, 1]))            # a cpu index (not 0-dim)
    if NUM_DEVICES >= 2:
        with pytest.raises(RuntimeError, match="same device"):
            torch.index_select(x, 0, torch.tensor([0, 1], device="npu:1"))
    # A 0-dim cpu index is accepted, as for other npu ops.
    assert_like_cpu(torch.index_select(x, 0, torch.tensor(2)), torch.index_select(x.cpu(), 0, torch.tensor(2)))


def test_index_select_on_a_second_device():
    if NUM_DEVICES < 2:
        pytest.skip("needs two npus")
    x = torch.randn(5, 3)
    index = torch.tensor([4, 0])
    got = torch.index_select(x.to("npu:1"), 0, index.to("npu:1"))
    assert got.device == torch.device("npu:1")
    assert_close(got.cpu(), torch.index_select(x, 0, index))


def test_embedding_gradients_match_cpu():
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(10, 4, generator=g)
    ids = torch.tensor([[1, 3, 3], [9, 0, 1]])
    grads = []
    for dev in ("cpu", "npu"):
        w = weight.to(dev).detach().requires_grad_()
        F.embedding(ids.to(dev), w).pow(2).sum().backward()
        sel = torch.index_select(w, 0, ids.to(dev).flatten())
        (sel * 3).sum().backward()
        grads.append(w.grad)
    assert_like_cpu(grads[1], grads[0])


# ---- stream order, capture ----------------------------------------------------------------------


STREAM_ORDER = """
    import torch, torch_npu
    from torch.testing import assert_close
    x = torch.zeros(64, 32, device="npu")
    w = torch.zeros(32, device="npu")
    idx = torch.zeros(16, dtype=torch.int64, device="npu")
    torch.npu._sleep(30)
    x.copy_(torch.arange(64 * 32.0).reshape(64, 32))      # queued behind the sleep
    w.fill_(2.0)
    idx.fill_(5)
    y, mean, rstd = torch.ops.aten.native_layer_norm(x, [32], w, None, 1e-5)
    sel = torch.index_select(x, 0, idx)                    # reads x and idx after the writes
    xs = x[:, ::2]                                         # a strided input: copied in stream order
    ys = torch.ops.aten.native_layer_norm(xs, [16], None, None, 1e-5)[0]
    ref = torch.arange(64 * 32.0).reshape(64, 32)
    exp = torch.ops.aten.native_layer_norm(ref, [32], torch.full((32,), 2.0), None, 1e-5)
    assert_close(y.cpu(), exp[0]); assert_close(mean.cpu(), exp[1]); assert_close(rstd.cpu(), exp[2])
    assert_close(sel.cpu(), ref[[5] * 16])
    assert_close(ys.cpu(), torch.ops.aten.native_layer_norm(ref[:, ::2], [16], None, None, 1e-5)[0])
    # Backward queued behind a write of its upstream gradient.
    dy = torch.zeros(64, 32, device="npu")
    torch.npu._sleep(30)
    dy.fill_(1.5)
    grads = torch.ops.aten.native_layer_norm_backward(dy, x, [32], mean, rstd, w, None, [True, True, False])
    exp_grads = torch.ops.aten.native_layer_norm_backward(torch.full((64, 32), 1.5), ref, [32], exp[1], exp[2],
                                                          torch.full((32,), 2.0), None, [True, True, False])
    assert_close(grads[0].cpu(), exp_grads[0]); assert_close(grads[1].cpu(), exp_grads[1])
    assert grads[2] is None
    # The result written by a later queued kernel reads the path's output in order.
    z = torch.index_select(x, 1, torch.tensor([0, 31], device="npu")) + 1
    assert_close(z.cpu(), ref[:, [0, 31]] + 1)
    print("ok")
"""


@pytest.mark.parametrize("env", [{}, {"NPU_EMU_ALWAYS_ENQUEUE": "1"}])
def test_paths_read_inputs_in_stream_order(run_python, env):
    assert run_python(STREAM_ORDER, env=env).stdout.strip().endswith("ok")


def test_out_of_range_index_queued_raises_at_synchronize(run_python):
    # Queued behind other work, the index check runs in stream order: its error is
    # the stream's, raised at the next synchronisation and naming the op's kernel.
    run_python("""
        import torch, torch_npu
        x = torch.randn(4, 3, device="npu")
        idx = torch.tensor([7], device="npu")
        torch.npu._sleep(20)
        torch.index_select(x, 0, idx)
        try:
            torch.npu.synchronize()
        except Exception as e:
            assert "index out of range" in str(e) and "index_select" in str(e), str(e)
        else:
            raise AssertionError("no error")
    """, env={"NPU_EMU_ALWAYS_ENQUEUE": "1"})


def test_graph_capture_replays_the_ops():
    x = torch.randn(8, 16).npu()
    w = torch.randn(16).npu()
    idx = torch.tensor([3, 1, 7], device="npu")
    # Warm up off the capture, as CUDA graphs ask.
    F.layer_norm(x, (16,), w)
    graph = torch.npu.NPUGraph()
    with torch.no_grad(), torch.npu.graph(graph):
        y = F.layer_norm(x, (16,), w)
        sel = torch.index_select(x, 0, idx)
    new = torch.randn(8, 16)
    x.copy_(new)
    idx.copy_(torch.tensor([0, 0, 5]))
    graph.replay()
    torch.npu.synchronize()
    assert_close(y.cpu(), F.layer_norm(new, (16,), w.cpu()))
    assert_close(sel.cpu(), new[[0, 0, 5]])


# ---- element-wise calls that convert their inputs ---------------------------------------------


def _mixed_operands():
    g = torch.Generator().manual_seed(3)
    return dict(
        h=torch.randn(5, 4, generator=g).half(), f=torch.randn(5, 4, generator=g),
        i=torch.randint(-9, 9, (5, 4), generator=g), j=torch.randint(1, 5, (5, 4), generator=g),
        i32=torch.randint(-9, 9, (5, 4), generator=g, dtype=torch.int32),
        m=torch.rand(5, 4, generator=g) > 0.5, col=torch.randn(5, 1, generator=g).double())


MIXED = {
    "half_times_float": lambda o: o["h"] * o["f"],
    "int_true_divide": lambda o: o["i"] / o["j"],
    "int_floor_divide": lambda o: torch.div(o["i"], o["j"], rounding_mode="floor"),
    "int_trunc_divide": lambda o: torch.div(o["i"], o["j"], rounding_mode="trunc"),
    "int_add": lambda o: o["i"] + o["j"],
    "int32_plus_int64": lambda o: o["i32"] + o["i"],
    "bool_mask_times_float": lambda o: o["m"] * o["f"],
    "int_times_python_float": lambda o: o["i"] * 2.5,
    "int_compare": lambda o: o["i"] < o["j"],
    "half_compare_float": lambda o: o["h"] == o["f"],
    "transposed_mix": lambda o: o["h"].t() + o["f"].t(),
    "broadcast_double": lambda o: o["f"] - o["col"],
    "int_sum": lambda o: o["i"].sum(),
    "bool_sum": lambda o: o["m"].sum(),
    "int_maximum": lambda o: torch.maximum(o["i"], o["j"]),
    "int_pow": lambda o: o["i"].pow(2),
    "int_neg": lambda o: -o["i"],
    "float_add_half_in_place": lambda o: o["f"].add_(o["h"]),
    "int_mul_in_place": lambda o: o["i"].mul_(o["j"]),
    "float_mul_bool_in_place": lambda o: o["f"].mul_(o["m"]),
}


@pytest.mark.parametrize("case", sorted(MIXED))
def test_converting_calls_match_cpu(case):
    ops = _mixed_operands()
    expected = MIXED[case]({k: v.clone() for k, v in ops.items()})
    got = MIXED[case]({k: v.npu() for k, v in ops.items()})
    assert_like_cpu(got, expected)


def test_converting_calls_raise_cpu_errors_at_the_call():
    ops = _mixed_operands()
    for f in (lambda o: o["i"].add_(o["f"]), lambda o: o["i"] + o["f"][:3], lambda o: o["m"].mul_(o["h"])):
        with pytest.raises(RuntimeError) as cpu_error:
            f({k: v.clone() for k, v in ops.items()})
        with pytest.raises(RuntimeError) as npu_error:
            f({k: v.npu() for k, v in ops.items()})
        assert str(cpu_error.value).splitlines()[0] in str(npu_error.value)


def test_converting_in_place_over_own_memory_computes_like_cpu():
    x = torch.arange(20).reshape(5, 4)
    xn = x.npu()
    x.add_(x[:, 0].clone().unsqueeze(1).double().long())
    xn.add_(xn[:, 0].clone().unsqueeze(1))
    assert_like_cpu(xn, x)


CONVERTING_STREAM_ORDER = """
    import torch, torch_npu
    from torch.testing import assert_close
    h = torch.zeros(256, device="npu", dtype=torch.float16)
    i = torch.zeros(256, device="npu", dtype=torch.int64)
    m = torch.zeros(256, device="npu", dtype=torch.bool)
    f = torch.ones(256, device="npu")
    torch.npu._sleep(30)
    h.fill_(3)                                   # queued behind the sleep
    i.fill_(7)
    m.fill_(True)
    results = {"half_times_float": h * f, "int_div": i / torch.full((256,), 2, device="npu"),
               "mask": m * f, "int_plus_float_scalar": i + 0.5}
    g = torch.ones(256, device="npu")
    g.mul_(h)                                    # in place, converting self's operand
    results["in_place"] = g
    expected = {"half_times_float": 3.0, "int_div": 3.5, "mask": 1.0, "int_plus_float_scalar": 7.5,
                "in_place": 3.0}
    for name, r in results.items():
        assert r.dtype == torch.float32, (name, r.dtype)
        assert (r.cpu() == expected[name]).all(), (name, r.cpu()[:4])
    print("ok")
"""


@pytest.mark.parametrize("env", [{}, {"NPU_EMU_ALWAYS_ENQUEUE": "1"}])
def test_converting_calls_read_inputs_in_stream_order(run_python, env):
    assert run_python(CONVERTING_STREAM_ORDER, env=env).stdout.strip().endswith("ok")


def test_converting_calls_in_graph_capture():
    h = torch.randn(6).half().npu()
    f = torch.randn(6).npu()
    i = torch.arange(6).npu()
    _ = h * f
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        y = h * f
        z = i / 2
    new_h, new_i = torch.randn(6).half(), torch.arange(6, 12)
    h.copy_(new_h)
    i.copy_(new_i)
    graph.replay()
    torch.npu.synchronize()
    assert_close(y.cpu(), new_h * f.cpu())
    assert_close(z.cpu(), new_i / 2)
