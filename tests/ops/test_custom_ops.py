"""User operators: torch_npu.ops.registry.register and @register_npu_op.

Ops are process-wide, so each test registers names of its own.
"""
import textwrap

import pytest
import torch

import torch_npu
from torch_npu import register_npu_op

registry = torch_npu.ops.registry


class MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w.T, x.T @ grad


@pytest.fixture
def error_mode():
    torch_npu.set_fallback_mode("error")
    yield
    torch_npu.set_fallback_mode("auto")


def test_register_a_lambda_of_an_autograd_function():
    registry.register(name="my_custom_op", impl=lambda x, w: MatMul.apply(x, w), priority=200, device="npu")
    info = registry.get("my_custom_op")
    assert info.backend == "npu" and info.priority == 200 and info.name == "npu::my_custom_op"
    assert registry.contains("my_custom_op") and registry.contains("torch.ops.npu.my_custom_op")
    assert registry.backends_for_op("npu::my_custom_op") == ["npu"]
    assert "npu::my_custom_op" in [op.name for op in registry.list_ops("npu")]
    assert registry.summary()["npu"] >= 1
    torch.manual_seed(0)
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 2, requires_grad=True)
    xn, wn = (t.detach().npu().requires_grad_() for t in (x, w))
    out = torch.ops.npu.my_custom_op(xn, wn)
    (out.square().sum()).backward()
    (x @ w).square().sum().backward()
    torch.testing.assert_close(out.detach().cpu(), (x @ w).detach())
    torch.testing.assert_close(xn.grad.cpu(), x.grad)
    torch.testing.assert_close(wn.grad.cpu(), w.grad)


def test_decorator_with_dtypes_and_annotations():
    @register_npu_op(name="fused_add_matmul", device="npu", priority=150, dtype=["float16", "float32"])
    def fused_add_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w + x

    assert callable(fused_add_matmul)
    assert registry.get("fused_add_matmul").priority == 150
    x = torch.randn(3, 3, requires_grad=True)
    xn = x.detach().npu().requires_grad_()
    fused_add_matmul(xn, xn).sum().backward()
    (x @ x + x).sum().backward()  # differentiable torch ops: autograd flows through
    torch.testing.assert_close(xn.grad.cpu(), x.grad)
    out = fused_add_matmul(xn.detach().half(), xn.detach().half())
    assert out.dtype == torch.float16 and out.device.type == "npu"


def test_highest_priority_accepting_implementation_runs():
    registry.register(name="pick_one", impl=lambda x: x + 1, priority=100)
    registry.register(name="pick_one", impl=lambda x: x + 2, priority=300, dtype=["float16"])
    registry.register(name="pick_one", impl=lambda x: x + 3, priority=200, dtype="float32")
    assert torch.ops.npu.pick_one(torch.zeros(1, device="npu")).item() == 3.0          # 300 refuses float32
    assert torch.ops.npu.pick_one(torch.zeros(1, device="npu").half()).item() == 2.0   # 300 takes float16
    assert torch.ops.npu.pick_one(torch.zeros(1, device="npu").bfloat16()).item() == 1.0
    # integer inputs pass every dtype set, so the highest priority takes them
    assert torch.ops.npu.pick_one(torch.zeros(1, dtype=torch.int64, device="npu")).item() == 2
    assert registry.get("pick_one").priority == 300


def test_cpu_implementation_is_the_counted_fallback(error_mode):
    registry.register(name="half_only", impl=lambda x: x * 2, priority=100, dtype=["float16"])
    x = torch.ones(4, device="npu")
    with pytest.raises(NotImplementedError, match=r"npu::half_only.*npu \(dtype float32\).*npu \(priority 100, "
                                                  r"float16\)"):
        torch.ops.npu.half_only(x)
    registry.register(name="half_only", impl=lambda x: x * 3, device="cpu", priority=10)
    assert registry.backends_for_op("half_only") == ["npu", "cpu"]
    with pytest.raises(NotImplementedError, match="fallback mode is 'error'"):
        torch.ops.npu.half_only(x)
    torch_npu.set_fallback_mode("auto")
    torch_npu.NPUFallbackMode.reset_fallback_stats()
    out = torch.ops.npu.half_only(x)
    assert out.device.type == "npu" and out.cpu().tolist() == [3.0] * 4
    stats = torch_npu.NPUFallbackMode.get_fallback_stats()
    assert stats["npu::half_only"].count == 1 and stats["npu::half_only"].bytes_copied == 32
    assert torch.ops.npu.half_only(torch.ones(2)).tolist() == [3.0, 3.0]  # cpu inputs: the cpu implementation


def test_explicit_backward_is_used():
    def backward(grad, x):
        return grad * 10  # deliberately not the derivative of x * 2

    registry.register(name="with_backward", impl=lambda x: x * 2, backward=backward)
    x = torch.ones(3, device="npu", requires_grad=True)
    torch.ops.npu.with_backward(x).sum().backward()
    assert x.grad.cpu().tolist() == [10.0] * 3


def test_schema_argument_and_defaults():
    registry.register(name="scaled", impl=lambda x, alpha=2.0: x * alpha, schema="(Tensor x, float alpha=2.0) -> Tensor")
    x = torch.ones(2, device="npu")
    assert torch.ops.npu.scaled(x).cpu().tolist() == [2.0, 2.0]
    assert torch.ops.npu.scaled(x, 0.5).cpu().tolist() == [0.5, 0.5]


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(name="dup_op", impl=lambda x: x, priority=5), ValueError, "already registered"),
    (dict(name="bad_device", impl=lambda x: x, device="gpu"), ValueError, "device must be one of"),
    (dict(name="bad_dtype", impl=lambda x: x, dtype=["float17"]), ValueError, "'float17' is not a dtype"),
    (dict(name="not_callable", impl=42), TypeError, "impl must be callable"),
    (dict(name="add", impl=lambda x: x), ValueError, "clashes with the aten operator aten::add"),
    (dict(name="bad name", impl=lambda x: x), ValueError, "not a valid operator name"),
])
def test_clear_registration_errors(kwargs, error, match):
    if kwargs["name"] == "dup_op":
        registry.register(name="dup_op", impl=lambda x: x, priority=5)
    with pytest.raises(error, match=match):
        registry.register(**kwargs)


def test_jit_trace_script_and_dynamo_see_the_op():
    registry.register(name="traced_op", impl=lambda x, w: x @ w + 1)
    x, w = torch.randn(2, 3).npu(), torch.randn(3, 2).npu()
    traced = torch.jit.trace(lambda a, b: torch.ops.npu.traced_op(a, b), (x, w))
    assert "npu::traced_op" in str(traced.graph)

    @torch.jit.script
    def scripted(a, b):
        return torch.ops.npu.traced_op(a, b)

    torch.testing.assert_close(scripted(x, w).cpu(), (x.cpu() @ w.cpu()) + 1)
    explained = torch._dynamo.explain(lambda a, b: torch.ops.npu.traced_op(a, b) * 2)(x, w)
    assert explained.graph_break_count == 0


def test_saved_script_loads_in_a_new_process(tmp_path, run_python):
    module = tmp_path / "my_ops.py"
    module.write_text(textwrap.dedent("""
        import torch, torch_npu
        torch_npu.ops.registry.register(name="saved_op", impl=lambda x: x * 3 + 1)

        class M(torch.nn.Module):
            def forward(self, x):
                return torch.ops.npu.saved_op(x)
    """))
    saved = tmp_path / "model.pt"
    run_python(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import torch, my_ops
        torch.jit.script(my_ops.M()).save({str(saved)!r})
    """))
    proc = run_python(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import torch, torch_npu, my_ops
        m = torch.jit.load({str(saved)!r})
        print(m(torch.ones(2, device="npu")).cpu().tolist())
    """))
    assert proc.stdout.strip().splitlines()[-1] == "[4.0, 4.0]"


def test_schema_defaults_reach_the_impl_and_backward():
    # The dispatcher drops trailing arguments equal to their default; the op fills them back in.
    registry.register(name="default_filled", impl=lambda x, alpha: x * alpha,
                      schema="(Tensor x, float alpha=3.0) -> Tensor")
    assert torch.ops.npu.default_filled(torch.ones(2, device="npu")).cpu().tolist() == [3.0, 3.0]

    def backward(grad, x, alpha, *, scale=1.0):
        return grad * alpha, None

    registry.register(name="kw_backward", impl=lambda x, alpha, *, scale=2.0: x * alpha * scale,
                      schema="(Tensor x, float alpha=1.5, *, float scale=2.0) -> Tensor", backward=backward)
    x = torch.ones(2, device="npu", requires_grad=True)
    out = torch.ops.npu.kw_backward(x, scale=4.0)
    assert out.detach().cpu().tolist() == [6.0, 6.0]
    out.sum().backward()
    assert x.grad.cpu().tolist() == [1.5, 1.5]


def test_unannotated_defaults_take_their_type():
    registry.register(name="eps_default", impl=lambda x, eps=1e-6, times=2: x * times + eps)
    assert "float eps=" in str(torch.ops.npu.eps_default.default._schema) and "int times=2" in str(
        torch.ops.npu.eps_default.default._schema)
    assert torch.ops.npu.eps_default(torch.zeros(1, device="npu")).item() == pytest.approx(1e-6)
    assert torch.ops.npu.eps_default(torch.ones(1, device="npu"), 0.0, 3).item() == 3.0


def test_explicit_backward_sees_inplace_changes():
    registry.register(name="saved_inputs", impl=lambda x: x * 2, backward=lambda g, x: g * x)
    x = torch.ones(2, device="npu", requires_grad=True)
    y = x.clone()
    out = torch.ops.npu.saved_inputs(y)
    y.add_(1)  # modifies a saved input: autograd must refuse, not compute with the new values
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_custom_op_fallbacks_take_the_aten_path_policies_observers_and_statistics():
    from torch_npu import NPUFallbackMode
    from torch_npu import fallback as fallback_module

    registry.register(name="half_or_cpu", impl=lambda x: x * 2, priority=100, dtype=["float16"])
    registry.register(name="half_or_cpu", impl=lambda x: x * 3, device="cpu", priority=10)
    x = torch.ones(4, device="npu", requires_grad=True)
    seen = []
    fallback_module._observers.append(lambda op, reason: seen.append((op, reason)))
    try:
        # policy "npu": never fall back, although a cpu implementation exists
        NPUFallbackMode.set_op_fallback("npu::half_or_cpu", "npu")
        with pytest.raises(NotImplementedError, match=r"npu::half_or_cpu.*policy for 'npu::half_or_cpu' is 'npu'"):
            torch.ops.npu.half_or_cpu(x)
        assert seen == []
        # default: float32 falls back for its dtype; gradients flow through the copies
        NPUFallbackMode.set_op_fallback("npu::half_or_cpu", "default")
        out = torch.ops.npu.half_or_cpu(x)
        out.sum().backward()
        assert out.device.type == "npu" and out.tolist() == [3.0] * 4 and x.grad.tolist() == [3.0] * 4
        # policy "cpu": the cpu implementation even where an npu one accepts the dtype
        NPUFallbackMode.set_op_fallback("npu::half_or_cpu", "cpu")
        assert torch.ops.npu.half_or_cpu(torch.ones(2, device="npu").half()).tolist() == [3.0, 3.0]
        NPUFallbackMode.set_op_fallback("npu::half_or_cpu", "default")
        assert torch.ops.npu.half_or_cpu(torch.ones(2, device="npu").half()).tolist() == [2.0, 2.0]
    finally:
        fallback_module._observers.pop()
    assert seen == [("npu::half_or_cpu", "dtype"), ("npu::half_or_cpu", "policy")]
    stats = NPUFallbackMode.get_fallback_stats()["npu::half_or_cpu"]
    assert stats.count == 2 and stats.bytes_copied == 16 + 16 + 4 + 4


def test_custom_op_fallback_warns_once_in_warn_mode():
    registry.register(name="warned_op", impl=lambda x: x + 1, device="cpu")
    torch_npu.set_fallback_mode("warn")
    with pytest.warns(UserWarning, match="npu::warned_op"):
        torch.ops.npu.warned_op(torch.ones(2, device="npu"))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.ops.npu.warned_op(torch.ones(2, device="npu")).tolist() == [2.0, 2.0]


def test_custom_op_fallback_with_shared_inputs_keeps_autograd_and_compiles():
    registry.register(name="cpu_only_mul", impl=lambda x, y: x * y, device="cpu")
    base = torch.arange(8., device="npu", requires_grad=True)
    out = torch.ops.npu.cpu_only_mul(base[:4], base[4:])   # two views of one storage
    assert out.requires_grad
    (out.sum() + torch.ops.npu.cpu_only_mul(base, base).sum()).backward()
    expected = torch.cat([torch.arange(4., 8.), torch.arange(4.)]) + 2 * torch.arange(8.)
    assert torch.equal(base.grad.cpu(), expected)
    torch_npu.NPUFallbackMode.reset_fallback_stats()
    compiled = torch.compile(lambda a: torch.ops.npu.cpu_only_mul(a, a) + 1, backend="aot_eager", fullgraph=True)
    x = torch.arange(3., device="npu")
    assert compiled(x).cpu().tolist() == [1.0, 2.0, 5.0]
    # Tracing on fake tensors is no fallback: nothing counted (the compiled graph holds the
    # copies and the cpu implementation's ops; eager calls are counted).
    assert "npu::cpu_only_mul" not in torch_npu.NPUFallbackMode.get_fallback_stats()
    torch.ops.npu.cpu_only_mul(x, x)
    assert torch_npu.NPUFallbackMode.get_fallback_stats()["npu::cpu_only_mul"].count == 1


CONCURRENT_FALLBACKS = r"""
import threading, time, torch, torch_npu
def slow(x):
    time.sleep(0.01)          # Python work that needs the GIL
    return x + 1
torch_npu.ops.registry.register(name="slow_cpu_op", impl=slow, device="cpu")
results = []
def worker():
    for _ in range(20):
        results.append(torch.ops.npu.slow_cpu_op(torch.ones(4, device="npu")).sum().item())
threads = [threading.Thread(target=worker) for _ in range(3)]
for t in threads: t.start()
for t in threads: t.join()
print(len(results), set(results))
"""


def test_custom_op_fallbacks_on_several_threads_never_deadlock(run_python):
    assert run_python(CONCURRENT_FALLBACKS, timeout=60).stdout.strip().endswith("60 {8.0}")
