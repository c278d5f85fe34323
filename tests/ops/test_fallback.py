"""The CPU fallback you control: modes, per-op policies, environment, statistics,
logging, correctness of fallen-back ops, and the op registry (issue 3).

Two kinds of op reach the fallback:
  * an op without an npu kernel (here aten::nextafter: PyTorch has a CPU kernel, the
    op library has none; the registry is asked first so the test notices if that changes);
  * an op with an npu kernel called with a dtype outside the kernel's support set
    (float64: the npu has no float64 kernels).
Environment variables are read once at import: those tests run a fresh interpreter.
"""
import json
import logging
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import torch_npu
from torch_npu import NPUFallbackMode, NPUOpsFallback
from torch_npu.ops import registry

from conftest import requires_two_devices
from helpers import last_line

NO_KERNEL_OP = "nextafter"  # aten op with a CPU kernel and no npu kernel
F64 = torch.float64


def stats():
    return NPUFallbackMode.get_fallback_stats()


def count(op_base, s=None):
    """Fallbacks of every overload of ``op_base`` ("aten::exp" counts aten::exp, aten::exp.out, ...)."""
    s = s or stats()
    return sum(v.count for k, v in s.ops.items() if k == op_base or k.startswith(op_base + "."))


def no_kernel(x, y):
    return torch.nextafter(x, y)


def assert_npu_close(got, expected, **kw):
    for t in ([got] if isinstance(got, torch.Tensor) else got):
        assert t.device.type == "npu", f"result on {t.device}"
    if isinstance(got, torch.Tensor):
        assert_close(got.cpu(), expected, **kw)
    else:
        assert_close(tuple(t.cpu() for t in got), tuple(expected), **kw)


def test_the_no_kernel_op_has_no_npu_kernel():
    info = registry.get(NO_KERNEL_OP)
    assert info.backend == "cpu" and "npu" not in info.backends, info


# ---- auto ----------------------------------------------------------------------------------------


def test_auto_no_kernel_op_falls_back_silently():
    assert torch_npu.get_fallback_mode() == "auto"
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        got = no_kernel(x.npu(), y.npu())
    assert_npu_close(got, torch.nextafter(x, y))
    assert count("aten::nextafter") == 1
    assert stats().total == 1


def test_auto_float64_falls_back_silently():
    x = torch.randn(6, 3, dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = x.npu().exp()
    assert got.dtype == F64
    assert_npu_close(got, x.exp())
    s = stats()
    assert list(s.ops) == ["aten::exp"] and s["aten::exp"].count == 1
    # float32 on the same op stays native
    x.float().npu().exp()
    assert stats().total == 1


def test_auto_float64_fallback_keeps_autograd_working():
    x = torch.randn(4, 5, dtype=F64, requires_grad=True)
    xn = x.detach().npu().requires_grad_()
    (x.exp() * x.sin()).sum().backward()
    (xn.exp() * xn.sin()).sum().backward()
    assert xn.grad.device.type == "npu" and xn.grad.dtype == F64
    assert_close(xn.grad.cpu(), x.grad)
    assert count("aten::exp") >= 1 and count("aten::sin") >= 1


def test_auto_float64_convolution_falls_back():
    x = torch.randn(2, 3, 6, 6, dtype=F64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=F64, requires_grad=True)
    xn, wn = (t.detach().npu().requires_grad_() for t in (x, w))
    y, yn = F.conv2d(x, w, padding=1), F.conv2d(xn, wn, padding=1)
    assert_npu_close(yn, y)
    assert stats()["aten::convolution_overrideable"].count == 1
    g = torch.randn(y.shape, dtype=F64)
    y.backward(g)
    yn.backward(g.npu())
    assert_npu_close(xn.grad, x.grad)
    assert_npu_close(wn.grad, w.grad)
    assert stats()["aten::convolution_backward_overrideable"].count == 1


# ---- warn ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["set_fallback_mode", "NPUFallbackMode.set", "constant"])
def test_warn_mode_warns_once_per_op(how):
    {"set_fallback_mode": lambda: torch_npu.set_fallback_mode("warn"),
     "NPUFallbackMode.set": lambda: NPUFallbackMode.set("warn"),
     "constant": lambda: NPUFallbackMode.set(NPUFallbackMode.WARN)}[how]()
    assert torch_npu.get_fallback_mode() == "warn" == NPUFallbackMode.get()
    x = torch.randn(8).npu()
    with pytest.warns(UserWarning, match=r"Operator 'aten::nextafter.*' is not supported on npu") as record:
        got = no_kernel(x, x)
    assert len([w for w in record if "not supported on npu" in str(w.message)]) == 1
    assert_npu_close(got, torch.nextafter(x.cpu(), x.cpu()))
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        no_kernel(x, x)
    assert not [w for w in again if "npu" in str(w.message)], "warned a second time for the same op"
    # another op warns on its own, once; a dtype fallback says so
    x64 = x.double()
    with pytest.warns(UserWarning, match=r"'aten::exp' is not supported on npu for these dtypes"):
        x64.exp()
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        x64.exp()
        x64.exp_()  # the in-place variant is a different op: it may warn, but only once
        x64.exp_()
    assert len([w for w in again if "aten::exp'" in str(w.message)]) == 0
    assert len([w for w in again if "aten::exp_'" in str(w.message)]) <= 1
    assert count("aten::nextafter") == 2 and count("aten::exp") == 2  # warn still falls back and counts


# ---- error ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["set_fallback_mode", "NPUFallbackMode.set", "NPUOpsFallback.set"])
def test_error_mode_raises_for_float64(how):
    {"set_fallback_mode": lambda: torch_npu.set_fallback_mode("error"),
     "NPUFallbackMode.set": lambda: NPUFallbackMode.set(NPUFallbackMode.ERROR),
     "NPUOpsFallback.set": lambda: NPUOpsFallback.set("error")}[how]()
    assert torch_npu.get_fallback_mode() == "error"
    x = torch.randn(5, dtype=F64).npu()
    with pytest.raises(RuntimeError) as info:
        x.exp()
    message = str(info.value)
    for part in ("Operator 'aten::exp' is not yet supported on npu", "(dtype Double)", "Tensor[Double, npu:0, [5]]",
                 "set_fallback_mode", "NPU_FALLBACK_MODE", "set_op_fallback"):
        assert part in message, f"{part!r} missing from: {message}"
    assert stats().total == 0
    # native ops keep working in error mode
    y = torch.randn(5).npu()
    assert_npu_close(y.exp() + 1, y.cpu().exp() + 1)


def test_error_mode_raises_for_op_without_kernel_and_leaves_inputs_alone():
    torch_npu.set_fallback_mode("error")
    x = torch.randn(4, 3).npu()
    with pytest.raises(RuntimeError, match=r"Operator 'aten::nextafter.*' is not yet supported on npu "
                                           r"\(dtype Float\).*no npu kernel is registered") as info:
        no_kernel(x, x)
    assert "set_fallback_mode" in str(info.value)
    # in-place float64 op: refused before anything ran
    a = torch.ones(3, dtype=F64).npu()
    with pytest.raises(RuntimeError, match="Operator 'aten::add_.Tensor' is not yet supported"):
        a.add_(a)
    assert torch.equal(a.cpu(), torch.ones(3, dtype=F64))
    # a tensor-list argument is described too
    with pytest.raises(RuntimeError, match=r"Operator 'aten::cat'.*\[2 tensors, first Tensor\[Double"):
        torch.cat([a, a])
    assert stats().total == 0
    torch_npu.set_fallback_mode("auto")
    assert_npu_close(no_kernel(x, x), torch.nextafter(x.cpu(), x.cpu()))


def test_invalid_mode_raises_value_error():
    torch_npu.set_fallback_mode("warn")
    for bad in ("bogus", "", "cpu"):
        with pytest.raises(ValueError, match="not a fallback mode"):
            torch_npu.set_fallback_mode(bad)
        with pytest.raises(ValueError):
            NPUFallbackMode.set(bad)
    assert torch_npu.get_fallback_mode() == "warn"  # unchanged
    with pytest.raises(ValueError, match="policy"):
        NPUFallbackMode.set_op_fallback("exp", "gpu")


@pytest.mark.child_process
def test_env_fallback_mode_error(run_python):
    proc = run_python("""
        import json, torch, torch_npu
        out = {"mode": torch_npu.get_fallback_mode()}
        x = torch.ones(3, dtype=torch.float64, device="npu")
        try:
            x.exp()
            out["raised"] = None
        except RuntimeError as error:
            out["raised"] = str(error)
        out["native_ok"] = torch.ones(3, device="npu").exp().sum().item()
        print(json.dumps(out))
    """, env={"NPU_FALLBACK_MODE": "error"})
    out = json.loads(last_line(proc))
    assert out["mode"] == "error"
    assert out["raised"] and "Operator 'aten::exp' is not yet supported on npu" in out["raised"]
    assert "Double" in out["raised"]
    assert abs(out["native_ok"] - 3 * 2.718281828) < 1e-4


@pytest.mark.child_process
def test_env_fallback_mode_warn(run_python):
    proc = run_python("""
        import torch_npu
        print(torch_npu.get_fallback_mode())
    """, env={"NPU_FALLBACK_MODE": " warn "})
    assert last_line(proc) == "warn"


@pytest.mark.child_process
def test_env_defaults(run_python):
    """Without the variables: auto mode, no policies, no retry on kernel errors."""
    proc = run_python("""
        import json, torch_npu
        print(json.dumps([torch_npu.get_fallback_mode(), torch_npu.NPUFallbackMode.op_fallbacks(),
                          torch_npu._C._retry_on_kernel_error()]))
    """, env={"NPU_FALLBACK_MODE": None, "NPU_FALLBACK_OPS": None, "NPU_FALLBACK_ON_ERROR": None})
    assert json.loads(last_line(proc)) == ["auto", {}, False]


@pytest.mark.child_process
@pytest.mark.parametrize("statement", ["import torch_npu", "import torch"])
def test_env_bogus_fallback_mode_fails_import(run_python, statement):
    proc = run_python(statement, env={"NPU_FALLBACK_MODE": "bogus"}, check=False)
    assert proc.returncode != 0, "import succeeded with NPU_FALLBACK_MODE=bogus"
    assert "NPU_FALLBACK_MODE='bogus' is not a fallback mode" in proc.stderr, proc.stderr
    assert "auto, warn or error" in proc.stderr


# ---- per-op policies ------------------------------------------------------------------------------


def test_policy_cpu_forces_the_fallback():
    NPUFallbackMode.set_op_fallback("torch.exp", "cpu")
    assert NPUFallbackMode.get_op_fallback("exp") == "cpu"
    assert NPUFallbackMode.op_fallbacks() == {"aten::exp": "cpu"}
    info = registry.get("exp")
    assert info.backend == "cpu" and info.priority == 0 and "npu" in info.backends
    x = torch.randn(4, 5)
    xn = x.npu()
    assert_npu_close(xn.exp(), x.exp())
    assert stats()["aten::exp"].count == 1
    # the policy covers the in-place and out= variants
    o = torch.empty(0, device="npu")
    torch.exp(xn, out=o)
    assert_npu_close(o, x.exp())
    y = xn.clone()
    y.exp_()
    assert_npu_close(y, x.exp())
    assert count("aten::exp") == 2 and count("aten::exp_") == 1
    assert registry.get("exp_").backend == "cpu"
    # other ops are untouched
    xn.sin()
    assert count("aten::sin") == 0
    # a forced op runs on the cpu even in error mode (the policy is an explicit permission)
    torch_npu.set_fallback_mode("error")
    assert_npu_close(xn.exp(), x.exp())
    torch_npu.set_fallback_mode("auto")
    # "default" restores the native kernel
    NPUFallbackMode.set_op_fallback("exp", "default")
    assert NPUFallbackMode.get_op_fallback("exp") == "default"
    assert NPUFallbackMode.op_fallbacks() == {}
    assert registry.get("exp").backend == "npu"
    NPUFallbackMode.reset_fallback_stats()
    assert_npu_close(xn.exp(), x.exp())
    assert stats().total == 0


@pytest.mark.parametrize("spelling", ["exp", "aten::exp", "torch.exp", "Tensor.exp", "torch.ops.aten.exp",
                                      "aten::exp.out"])
def test_policy_names_are_equivalent(spelling):
    NPUFallbackMode.set_op_fallback(spelling, "cpu")
    assert NPUFallbackMode.op_fallbacks() == {"aten::exp": "cpu"}
    for other in ("exp", "aten::exp", "torch.exp"):
        assert NPUFallbackMode.get_op_fallback(other) == "cpu"
    torch.ones(3, device="npu").exp()
    assert stats()["aten::exp"].count == 1
    NPUFallbackMode.set_op_fallback("torch.exp" if spelling != "torch.exp" else "exp", "default")
    assert NPUFallbackMode.op_fallbacks() == {}


def test_policy_npu_forbids_the_fallback():
    x = torch.randn(3, 4).npu()
    NPUFallbackMode.set_op_fallback(NO_KERNEL_OP, "npu")
    assert torch_npu.get_fallback_mode() == "auto"
    with pytest.raises(RuntimeError, match=r"is not yet supported on npu.*'npu' \(fallback forbidden\)"):
        no_kernel(x, x)
    # a dtype fallback is forbidden the same way
    NPUFallbackMode.set_op_fallback("torch.exp", "npu")
    with pytest.raises(RuntimeError, match=r"Operator 'aten::exp' is not yet supported on npu \(dtype Double\)"):
        x.double().exp()
    assert_npu_close(x.exp(), x.cpu().exp())  # the native kernel is still allowed
    assert count("aten::exp") == 0 and count("aten::nextafter") == 0
    NPUFallbackMode.set_op_fallback(NO_KERNEL_OP, "default")
    NPUFallbackMode.set_op_fallback("exp", "default")
    assert_npu_close(no_kernel(x, x), torch.nextafter(x.cpu(), x.cpu()))
    assert_npu_close(x.double().exp(), x.cpu().double().exp())


def test_clear_op_fallbacks():
    NPUFallbackMode.set_op_fallback("exp", "cpu")
    NPUFallbackMode.set_op_fallback("sin", "npu")
    assert NPUFallbackMode.op_fallbacks() == {"aten::exp": "cpu", "aten::sin": "npu"}
    NPUFallbackMode.clear_op_fallbacks()
    assert NPUFallbackMode.op_fallbacks() == {}
    assert registry.get("exp").backend == "npu"


@pytest.mark.child_process
def test_env_fallback_ops(run_python):
    proc = run_python("""
        import json, torch, torch_npu
        x = torch.randn(10, device="npu")
        e = x.exp()
        m = torch.isin(x, x[:3])
        torch.npu.synchronize()
        s = torch_npu.NPUFallbackMode.get_fallback_stats()
        print(json.dumps({"policies": torch_npu.NPUFallbackMode.op_fallbacks(),
                          "ops": {k: v.count for k, v in s.ops.items()},
                          "exp_ok": bool(torch.allclose(e.cpu(), x.cpu().exp())),
                          "isin_ok": int(m.sum().item()), "isin_device": str(m.device),
                          "exp_backend": torch_npu.ops.registry.get("exp").backend}))
    """, env={"NPU_FALLBACK_OPS": "exp, torch.isin"})
    out = json.loads(last_line(proc))
    assert out["policies"] == {"aten::exp": "cpu", "aten::isin": "cpu"}
    assert out["ops"].get("aten::exp") == 1
    assert sum(v for k, v in out["ops"].items() if k.startswith("aten::isin")) == 1, out["ops"]
    assert out["exp_ok"] and out["isin_ok"] >= 3 and out["isin_device"] == "npu:0"
    assert out["exp_backend"] == "cpu"


@pytest.mark.child_process
def test_env_fallback_on_error_retries_on_cpu(run_python):
    """An op whose npu kernel raises but whose cpu kernel succeeds: median of a tensor that
    takes 60% of a 64 MiB npu. ATen's median clones its input; on the npu the clone does not
    fit (out of memory), on the cpu it does. With NPU_FALLBACK_ON_ERROR=1 the op is retried
    on the cpu and counted in kernel_error_retries; without, the OOM error propagates.
    An error the cpu kernel raises too (a shape mismatch) propagates unchanged."""
    proc = run_python("""
        import json, torch, torch_npu
        S = torch_npu.NPUFallbackMode
        out = {"retry_flag": torch_npu._C._retry_on_kernel_error()}
        x = torch.randn(10 * 1024 * 1024, generator=torch.Generator().manual_seed(0))
        xn = x.npu()
        m = torch.median(xn)
        out["device"] = str(m.device)
        out["value_ok"] = m.item() == torch.median(x).item()
        st = S.get_fallback_stats()["aten::median"]
        out["count"], out["retries"] = st.count, st.kernel_error_retries
        S.reset_fallback_stats()
        try:
            torch.ones(2, 3, device="npu") @ torch.ones(2, 3, device="npu")
            out["mm"] = None
        except RuntimeError as error:
            out["mm"] = str(error)
        out["mm_counted"] = S.get_fallback_stats().total
        S.set_retry_on_kernel_error(False)
        try:
            torch.median(xn)
            out["without_retry"] = None
        except RuntimeError as error:
            out["without_retry"] = type(error).__name__ + ": " + str(error)[:200]
        print(json.dumps(out))
    """, env={"NPU_FALLBACK_ON_ERROR": "1", "NPU_EMU_MEMORY": "64MiB"})
    out = json.loads(last_line(proc))
    assert out["retry_flag"] is True
    assert out["device"] == "npu:0" and out["value_ok"]
    assert out["count"] == 1 and out["retries"] == 1
    assert out["mm"] and "cannot be multiplied" in out["mm"]
    assert out["mm_counted"] == 0
    assert out["without_retry"] and "OutOfMemoryError" in out["without_retry"]


# ---- statistics -------------------------------------------------------------------------------------


def test_stats_total_top_ops_time_bytes_and_reset():
    x = torch.randn(1000, dtype=F64).npu()
    y = torch.randn(10).npu()
    for _ in range(3):
        x.exp()
    for _ in range(2):
        no_kernel(y, y)
    torch.sort(x)
    s = stats()
    assert s.total == 6
    assert s.top_ops(2) == [("aten::exp", 3), ("aten::nextafter.out", 2)]
    assert s.top_ops(10) == [("aten::exp", 3), ("aten::nextafter.out", 2), ("aten::sort", 1)]
    assert s.top_ops(1) == [("aten::exp", 3)]
    e = s["aten::exp"]
    assert e.count == 3 and e.kernel_error_retries == 0
    assert e.seconds > 0 and s.total_seconds >= e.seconds
    assert e.bytes_to_cpu == 3 * 8000 and e.bytes_to_npu == 3 * 8000
    assert e.bytes_copied == 6 * 8000
    srt = s["aten::sort"]
    assert srt.bytes_to_cpu == 8000 and srt.bytes_to_npu == 8000 + 8000  # values (f64) + indices (i64)
    assert "aten::exp" in s and "aten::add.Tensor" not in s
    assert "aten::exp" in s.table() and "total" in s.table()
    assert "aten::exp" in repr(s)
    NPUFallbackMode.reset_fallback_stats()
    s = stats()
    assert s.total == 0 and s.ops == {} and s.top_ops() == []


def test_stats_is_a_snapshot():
    x = torch.randn(4, dtype=F64).npu()
    x.exp()
    before = stats()
    x.exp()
    assert before.total == 1 and stats().total == 2


# ---- logging ------------------------------------------------------------------------------------------


def test_debug_log_lines(caplog):
    x = torch.randn(4).npu()
    with caplog.at_level(logging.DEBUG, logger="torch_npu"):
        no_kernel(x, x)
        x.double().exp()
        NPUFallbackMode.set_op_fallback("sin", "cpu")
        x.sin()
    messages = [r.getMessage() for r in caplog.records if r.name == "torch_npu"]
    assert "npu_nextafter not registered, fallback to CPU" in messages, messages
    assert "npu_exp does not support these dtypes, fallback to CPU" in messages, messages
    assert any(m.startswith("npu_sin") and "fallback to CPU" in m for m in messages), messages
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "torch_npu")


def test_no_log_lines_above_debug(caplog):
    x = torch.randn(4).npu()
    with caplog.at_level(logging.INFO, logger="torch_npu"):
        no_kernel(x, x)
    assert not [r for r in caplog.records if r.name == "torch_npu"]


# ---- the public classes -------------------------------------------------------------------------------


def test_public_classes():
    import torch_npu.fallback as fb

    assert torch_npu.NPUOpsFallback is NPUOpsFallback is fb.NPUOpsFallback
    assert issubclass(NPUFallbackMode, NPUOpsFallback)
    assert torch_npu.FallbackStats is fb.FallbackStats
    NPUOpsFallback.set("warn")
    assert NPUFallbackMode.get() == "warn" == torch_npu.get_fallback_mode()
    NPUOpsFallback.set_op_fallback("exp", "cpu")
    assert NPUFallbackMode.get_op_fallback("exp") == "cpu"
    assert (NPUOpsFallback.AUTO, NPUOpsFallback.WARN, NPUOpsFallback.ERROR) == ("auto", "warn", "error")


# ---- correctness of fallen-back ops ------------------------------------------------------------------


def test_fallback_in_place_op_updates_the_npu_tensor():
    x, y = torch.randn(6, 4, dtype=F64), torch.randn(6, 4, dtype=F64)
    xn, yn = x.npu(), y.npu()
    ptr = xn.data_ptr()
    r = xn.add_(yn, alpha=2)
    assert r is xn and xn.data_ptr() == ptr and xn.device.type == "npu"
    assert_npu_close(xn, x + 2 * y)
    assert count("aten::add_") == 1
    # on a non-contiguous view: the base sees the update
    base = torch.zeros(6, 8, dtype=F64)
    bn = base.npu()
    bn[::2, 1::3].add_(yn[:3, :3])
    bn.t()[1].mul_(-1.5)
    base[::2, 1::3].add_(y[:3, :3])
    base.t()[1].mul_(-1.5)
    assert_npu_close(bn, base)
    # a no-kernel op in place (heaviside_ has no npu kernel)
    assert registry.get("heaviside_").backend == "cpu"
    z = torch.randn(5)
    zn = z.npu()
    r = zn.heaviside_(torch.tensor([0.5]).npu())
    assert r is zn
    assert_npu_close(zn, z.heaviside(torch.tensor([0.5])))
    assert count("aten::heaviside") + count("aten::heaviside_") == 1  # (via heaviside.out)


def test_fallback_out_variants():
    x, y = torch.randn(3, 4, dtype=F64), torch.randn(3, 4, dtype=F64)
    xn, yn = x.npu(), y.npu()
    o = torch.empty(3, 4, dtype=F64, device="npu")
    assert torch.add(xn, yn, out=o) is o
    assert_npu_close(o, x + y)
    o0 = torch.empty(0, dtype=F64, device="npu")
    assert torch.mul(xn, yn, out=o0) is o0
    assert o0.shape == (3, 4)
    assert_npu_close(o0, x * y)
    # a no-kernel op with out=, resized from 0
    f = torch.empty(0, device="npu")
    torch.nextafter(xn.float(), yn.float(), out=f)
    assert f.shape == (3, 4)
    assert_npu_close(f, torch.nextafter(x.float(), y.float()))
    # an out= that is a view of a bigger tensor
    big = torch.zeros(3, 8, dtype=F64, device="npu")
    torch.add(xn, yn, out=big[:, ::2])
    expected = torch.zeros(3, 8, dtype=F64)
    expected[:, ::2] = x + y
    assert_npu_close(big, expected)
    # tuple out=
    v, i = torch.empty(0, dtype=F64, device="npu"), torch.empty(0, dtype=torch.int64, device="npu")
    r = torch.max(xn, 1, out=(v, i))
    assert r[0] is v and r[1] is i
    assert_npu_close((v, i), tuple(x.max(1)))
    assert count("aten::add.out") == 2 and count("aten::mul.out") == 1 and count("aten::max.dim_max") == 1


def test_fallback_ops_returning_tuples():
    x = torch.randn(5, 6, dtype=F64)
    xn = x.npu()
    for fn in (lambda t: torch.sort(t, 1), lambda t: t.max(0), lambda t: torch.topk(t, 2),
               lambda t: torch.aminmax(t), lambda t: torch.var_mean(t, 1), lambda t: torch.frexp(t.float())):
        got = fn(xn)
        assert isinstance(got, tuple) and len(got) == 2
        assert_npu_close(got, fn(x))
    assert stats().total >= 6


def test_fallback_tensor_list_inputs_and_outputs():
    xs = [torch.randn(2, 3, dtype=F64) for _ in range(3)]
    xn = [t.npu() for t in xs]
    assert_npu_close(torch.cat(xn), torch.cat(xs))
    assert_npu_close(torch.cat(xn, 1), torch.cat(xs, 1))
    assert_npu_close(torch.stack(xn), torch.stack(xs))
    assert stats()["aten::cat"].count >= 3
    # a list result
    got = torch._foreach_add(xn, xn)
    assert isinstance(got, (list, tuple)) and len(got) == 3
    assert_npu_close(got, torch._foreach_add(xs, xs))
    # a list written in place
    torch._foreach_mul_(xn, 3.0)
    torch._foreach_mul_(xs, 3.0)
    assert_npu_close(xn, xs)
    assert count("aten::_foreach_add") == 1 and count("aten::_foreach_mul_") == 1


def test_fallback_on_non_contiguous_inputs():
    base = torch.randn(6, 8)
    bn = base.npu()
    x, xn = base.t()[::2], bn.t()[::2]
    assert not xn.is_contiguous()
    assert_npu_close(torch.nextafter(xn, xn * 2), torch.nextafter(x, x * 2))
    assert_npu_close(xn.double().exp(), x.double().exp())
    assert count("aten::nextafter") == 1


def test_fallback_view_op_raises_a_clear_error():
    # Every aten view op has an npu kernel; a 'cpu' policy is the way to send one to the fallback.
    x = torch.arange(6.0, device="npu")
    NPUFallbackMode.set_op_fallback("unfold", "cpu")
    with pytest.raises(RuntimeError, match="'aten::unfold' is a view op: it cannot run through the CPU fallback"):
        x.unfold(0, 2, 1)
    NPUFallbackMode.set_op_fallback("unfold", "default")
    assert x.unfold(0, 2, 1).shape == (5, 2)


def test_fallback_with_a_cpu_scalar_tensor():
    x = torch.randn(4, dtype=F64)
    assert_npu_close(x.npu() * torch.tensor(2.0, dtype=F64), x * 2)
    assert_npu_close(torch.nextafter(x.float().npu(), torch.tensor(1.0)), torch.nextafter(x.float(), torch.tensor(1.0)))


@requires_two_devices
def test_fallback_results_stay_on_the_input_device():
    assert torch.npu.current_device() == 0
    x = torch.randn(4, 3, dtype=F64)
    xn = x.to("npu:1")
    for fn in (torch.exp, lambda t: torch.sort(t), lambda t: torch.cat([t, t]),
               lambda t: torch.nextafter(t.float(), t.float())):
        got = fn(xn)
        for t in ([got] if isinstance(got, torch.Tensor) else got):
            assert t.device == torch.device("npu", 1)
    o = torch.empty(0, dtype=F64, device="npu:1")
    torch.exp(xn, out=o)
    assert o.device == torch.device("npu", 1)
    assert_close(o.cpu(), x.exp())


# ---- the registry ---------------------------------------------------------------------------------------


def test_registry_spellings_agree():
    infos = [registry.get(n) for n in ("add", "aten::add", "torch.add", "Tensor.add", "torch.ops.aten.add",
                                       "aten::add.Tensor", "torch.ops.aten.add.Tensor")]
    assert all(i is not None for i in infos)
    assert len({(i.name, i.backend, i.priority) for i in infos}) == 1, infos
    assert infos[0].name == "aten::add.Tensor" and infos[0].backend == "npu"
    assert registry.contains("add") and registry.contains("torch.add") and registry.contains("aten::add.out")
    assert registry.get("aten::add.Scalar") is not None


def test_registry_unknown_names():
    assert registry.get("definitely_not_an_op") is None
    assert not registry.contains("definitely_not_an_op")
    assert registry.backends_for_op("definitely_not_an_op") == []
    assert registry.get("aten::add.no_such_overload") is None


def test_registry_backends_and_priorities():
    backends = registry.backends_for_op("exp")
    assert "npu" in backends and "cpu" in backends
    npu, comp, cpu = registry.get("exp"), registry.get("linear"), registry.get(NO_KERNEL_OP)
    assert (npu.backend, comp.backend, cpu.backend) == ("npu", "composite", "cpu")
    assert npu.priority > comp.priority > cpu.priority
    assert not registry.contains(NO_KERNEL_OP) and not registry.contains("linear")


def test_registry_list_ops_and_summary():
    npu_ops = registry.list_ops("npu")
    assert len(npu_ops) > 500
    assert all(op.backend == "npu" and op.name.startswith(("aten::", "npu::")) for op in npu_ops)
    names = {op.name for op in npu_ops}
    assert {"aten::add.Tensor", "aten::mm", "aten::exp", "aten::cat"} <= names
    cpu_ops = registry.list_ops("cpu")
    assert "aten::nextafter" in {op.name for op in cpu_ops}
    assert all(op.backend == "cpu" for op in cpu_ops)
    everything = registry.list_ops()
    summary = registry.summary()
    assert sum(summary.values()) == len(everything)
    assert summary["npu"] == len(npu_ops) and summary["cpu"] == len(cpu_ops)
    assert summary["composite"] == len(registry.list_ops("composite")) > 0
    with pytest.raises(ValueError):
        registry.list_ops("gpu")
    # a policy moves an op between the lists
    NPUFallbackMode.set_op_fallback("exp", "cpu")
    assert "aten::exp" in {op.name for op in registry.list_ops("cpu")}
    assert registry.summary()["npu"] < summary["npu"]


# ---- dtype= arguments and random sampling respect the dtype sets ----


@pytest.mark.parametrize("case", ["sum_dtype", "mean_dtype", "cumsum_dtype", "arange_dtype", "linspace_dtype"])
def test_float64_requested_by_dtype_argument_falls_back(case):
    x = torch.randn(4, 5).npu()
    fn = {"sum_dtype": lambda: x.sum(dtype=F64),
          "mean_dtype": lambda: x.mean(dtype=F64),
          "cumsum_dtype": lambda: torch.cumsum(x, 0, dtype=F64),
          "arange_dtype": lambda: torch.arange(5, dtype=F64, device="npu"),
          "linspace_dtype": lambda: torch.linspace(0, 1, 5, dtype=F64, device="npu")}[case]
    torch_npu.set_fallback_mode("error")
    with pytest.raises(RuntimeError, match="is not yet supported on npu"):
        fn()
    torch_npu.set_fallback_mode("auto")
    result = fn()
    assert result.dtype == F64 and result.device.type == "npu"
    assert stats().total >= 1


@pytest.mark.parametrize("case", ["randn", "normal_", "uniform_", "rand"])
def test_float64_random_sampling_is_a_fallback(case):
    fn = {"randn": lambda: torch.randn(5, dtype=F64, device="npu"),
          "normal_": lambda: torch.empty(5, dtype=F64, device="npu").normal_(),
          "uniform_": lambda: torch.empty(5, dtype=F64, device="npu").uniform_(),
          "rand": lambda: torch.rand(5, dtype=F64, device="npu")}[case]
    torch_npu.set_fallback_mode("error")
    with pytest.raises(RuntimeError, match="is not yet supported on npu"):
        fn()
        torch.npu.synchronize()
