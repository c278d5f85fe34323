"""Graph modes on the npu: torch.compile (inductor, backend="npu", the eager fallback),
torch.jit and torch.export, each checked against eager npu (and the cpu)."""
import copy
import os
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_npu
from helpers import REPO_ROOT

ROOT = REPO_ROOT
sys.path.insert(0, os.path.join(ROOT, "examples"))
import zoo  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_graphs():
    """Compiled graphs keep their models' npu tensors alive: the later tests
    (memory statistics) must find the device as it was."""
    yield
    import gc
    torch._dynamo.reset()
    gc.collect()
    torch.npu.synchronize()
    torch.npu.empty_cache()


def close(a, b, tol=2e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def fwd_bwd(model, *inputs):
    out = model(*inputs)
    out.float().square().mean().backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    return out.detach(), grads


def check_compiled_matches_eager(model, *inputs, tol=2e-5, **compile_kwargs):
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, **compile_kwargs)
    out, grads = fwd_bwd(compiled, *inputs)
    ref, ref_grads = fwd_bwd(eager, *inputs)
    assert out.device.type == "npu"
    close(out, ref, tol)
    assert len(grads) == len(ref_grads) > 0
    for g, r in zip(grads, ref_grads):
        close(g, r, tol)
    return compiled


def test_mlp_forward_backward_matches_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).npu()
    check_compiled_matches_eager(model, torch.randn(8, 16, device="npu"))


def test_cnn_forward_backward_matches_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10)).npu()
    check_compiled_matches_eager(model, torch.randn(4, 3, 12, 12, device="npu"), tol=1e-4)


def test_transformer_block_forward_backward_matches_eager_and_cpu():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    x = torch.randn(2, 8, 32)
    compiled = check_compiled_matches_eager(copy.deepcopy(layer).npu(), x.npu(), tol=1e-4)
    close(compiled(x.npu()).detach().cpu(), layer(x).detach(), 1e-4)


def test_resnet_inference_matches_eager():
    # Inductor lays convolutions out channels-last and asserts the strides PyTorch's
    # metadata promises for the npu's convolution: the kernel must keep that promise.
    model, make_batch, _ = zoo.build("resnet", device="npu", batch=2)
    model.eval()
    x = make_batch(0)[0]
    with torch.no_grad():
        close(torch.compile(model)(x), model(x), 1e-4)
    from torch._subclasses.fake_tensor import FakeTensorMode
    w = torch.randn(4, 3, 3, 3, device="npu")
    nhwc = torch.randn(2, 3, 8, 8, device="npu").to(memory_format=torch.channels_last)
    with FakeTensorMode() as fake:
        promised = F.conv2d(fake.from_tensor(nhwc), fake.from_tensor(w)).stride()
    assert F.conv2d(nhwc, w).stride() == promised


@pytest.fixture(scope="module")
def gpt():
    model, make_batch, loss_fn = zoo.build("gpt", device="npu", batch=4)
    return model, make_batch(0)[0]


def test_gpt_decoder_with_the_npu_backend_uses_fused_ops_and_matches_eager(gpt):
    from torch_npu._compile.backend import NpuBackend
    model, tokens = gpt
    backend = NpuBackend()
    check_compiled_matches_eager(copy.deepcopy(model), tokens, tol=1e-4, backend=backend)
    # Two RMSNorms per block plus the last (the residual ones as add+RMSNorm), a SwiGLU per block,
    # rotary on q and k per block (the model calls SDPA itself: no attention to fuse).
    assert backend.fused == {"rms_norm": 5, "swiglu": 2, "rotary": 4, "attention": 0}


def rotate_half_by_slices(x):   # transformers' spelling
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class WrittenOutAttention(nn.Module):
    """Rotary and attention as eager code writes them: a causal mask from a buffer, and an additive bias."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.register_buffer("tril", torch.tril(torch.ones(16, 16)))

    def forward(self, x, cos, sin, bias):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).transpose(1, 3).unbind(2)
        q = q * cos + zoo.rotate_half(q) * sin
        k = (k * cos) + (rotate_half_by_slices(k) * sin)
        causal = (q @ k.transpose(-2, -1) * (1.0 / 8 ** 0.5)).masked_fill(self.tril[:t, :t] == 0, float("-inf"))
        biased = torch.matmul(q, k.transpose(2, 3)) / 8 ** 0.5 + bias
        return F.softmax(causal, dim=-1) @ v + torch.softmax(biased, -1) @ v


def test_the_npu_backend_fuses_written_out_rotary_and_attention():
    from torch_npu._compile.backend import NpuBackend
    torch.manual_seed(0)
    model = WrittenOutAttention().npu()
    inputs = (torch.randn(2, 16, 32, device="npu"), torch.randn(16, 8, device="npu"), torch.randn(16, 8, device="npu"),
              torch.randn(16, 16, device="npu"))
    backend = NpuBackend()
    check_compiled_matches_eager(model, *inputs, tol=1e-4, backend=backend)
    assert backend.fused == {"rms_norm": 0, "swiglu": 0, "rotary": 2, "attention": 2}


class LookAlikes(nn.Module):
    """Compositions that resemble rotary and attention but mean something else: left alone."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(8, 8))          # learned: the flash kernel has no gradient for it

    def forward(self, q, k, v, cos, sin, mask):
        a, b = q.chunk(2, dim=-1)
        not_rotary = q * cos + torch.cat((a, -b), dim=-1) * sin              # the signs swapped
        scores = q @ k.transpose(-2, -1) * 0.25
        finite_fill = torch.softmax(scores.masked_fill(mask, -1e4), dim=-1) @ v
        other_dtype = torch.softmax(scores, dim=-1, dtype=torch.float64).float() @ v
        learned = torch.softmax(scores + self.bias, dim=-1) @ v
        flat = q.flatten(0, 1)                                               # 3-D attention
        three_d = torch.softmax(flat @ flat.transpose(-2, -1), dim=-1) @ flat
        return not_rotary + finite_fill + other_dtype + learned + three_d.view_as(q)


def test_the_npu_backend_leaves_look_alikes_alone():
    from torch_npu._compile.backend import NpuBackend
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 8, device="npu") for _ in range(3))
    inputs = (q, k, v, torch.randn(8, 8, device="npu"), torch.randn(8, 8, device="npu"),
              torch.ones(8, 8, dtype=torch.bool, device="npu").triu(1))
    backend = NpuBackend()
    check_compiled_matches_eager(LookAlikes().npu(), *inputs, tol=1e-4, backend=backend)
    assert backend.fused == {"rms_norm": 0, "swiglu": 0, "rotary": 0, "attention": 0}


def test_the_npu_backend_by_name_takes_inductors_options():
    def f(x, w):
        gate, value = (x @ w).chunk(2, dim=-1)
        return F.silu(gate) * value

    x, w = torch.randn(4, 8, device="npu"), torch.randn(8, 16, device="npu")
    for kwargs in ({}, {"mode": "max-autotune-no-cudagraphs"}, {"options": {"max_autotune": False}}):
        torch._dynamo.reset()
        close(torch.compile(f, backend="npu", **kwargs)(x, w), f(x, w))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="no-such-mode"):       # the mode reaches inductor
        torch.compile(f, backend="npu", mode="no-such-mode")(x, w)
    torch._dynamo.reset()


def generated_kernels(fn, *inputs):
    """fn's results and the C++ sources inductor generates for them."""
    import re
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    out, codes = run_and_get_code(torch.compile(fn), *inputs)
    sources = [k.strip() for code in codes for k in re.findall(r"cpp_pybinding\(\[.*?\], r'''(.*?)'''\)", code, re.S)]
    return out, sorted(sources)


def test_npu_graphs_get_the_kernels_cpu_graphs_get():
    # Where inductor asks "is this the cpu?" meaning "the C++ backend?", the npu answers
    # as the cpu: cat without masked loads, no pad-as-cat, two-pass variance, division kept,
    # logical argmax indices, the cpu's realization heuristics.
    def f(x, w):
        h = torch.cat((F.silu(x[:, :8]) * x[:, 8:], -x), dim=-1)
        v, m = torch.var_mean(x.t(), dim=0)
        return F.pad(h, (0, 3)).sum(-1) / 7.0, x.t().argmax(), v + m, (x @ w).softmax(-1)

    x, w = torch.randn(6, 16), torch.randn(16, 16)
    cpu_out, cpu_kernels = generated_kernels(f, x, w)
    npu_out, npu_kernels = generated_kernels(f, x.npu(), w.npu())
    assert npu_kernels == cpu_kernels and len(cpu_kernels) > 0
    for a, b in zip(npu_out, cpu_out):
        close(a.cpu(), b)


def test_argmax_of_a_transposed_tensor_counts_logical_positions():
    def f(x):
        return x.t().argmax(), x.permute(1, 0).argmin()

    x = torch.randn(37, 53)
    out = torch.compile(f)(x.npu())
    assert [o.item() for o in out] == [o.item() for o in f(x)]


def test_gpt_decoder_with_inductor_matches_eager(gpt):
    model, tokens = gpt
    check_compiled_matches_eager(copy.deepcopy(model), tokens, tol=1e-4)


def test_compiled_training_converges_like_eager():
    def train(compile_it):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).npu()
        step_model = torch.compile(model) if compile_it else model
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(64, 8, generator=g).npu()
        y = (x.cpu() @ torch.randn(8, 1, generator=g)).npu()
        losses = []
        for _ in range(30):
            loss = F.mse_loss(step_model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return torch.stack(losses).cpu()

    compiled, eager = train(True), train(False)
    assert compiled[-1] < 0.2 * compiled[0]
    close(compiled, eager, 1e-4)


def test_dynamic_shapes_and_max_autotune_mode():
    def f(x, w):
        return torch.softmax(x @ w, dim=-1) * 2 + x.sum(-1, keepdim=True)

    w = torch.randn(16, 16, device="npu")
    dynamic = torch.compile(f, dynamic=True)
    for rows in (3, 5, 9):
        x = torch.randn(rows, 16, device="npu")
        close(dynamic(x, w), f(x, w), 1e-5)
    tuned = torch.compile(f, mode="max-autotune-no-cudagraphs")
    x = torch.randn(4, 16, device="npu")
    close(tuned(x, w), f(x, w), 1e-5)


def test_graph_breaks_keep_the_work_on_the_npu():
    def f(x):
        y = torch.sin(x) * 2
        if y.sum() > 0:            # data-dependent branch: a graph break
            y = y + 1
        print("", end="")          # a graph break
        return torch.cos(y)

    torch_npu.NPUFallbackMode.reset_fallback_stats()
    x = torch.randn(32, device="npu")
    out = torch.compile(f)(x)
    assert out.device.type == "npu"
    close(out, f(x))
    assert torch_npu.NPUFallbackMode.get_fallback_stats().total == 0


def test_eager_fallback_when_compilation_fails():
    def broken_backend(gm, example_inputs):
        raise NotImplementedError("this backend cannot compile aten.sin")

    def f(x):
        return torch.sin(x) + 1

    x = torch.randn(8, device="npu")
    with pytest.raises(Exception, match="cannot compile aten.sin") as error:
        torch_npu.compile(f, backend=broken_backend)(x)
    assert 'torch_npu.compile(model, fallback="eager")' in str(error.value)   # the error says how to fall back
    torch._dynamo.reset()
    with torch._dynamo.config.patch(suppress_errors=True):
        close(torch.compile(f, backend=broken_backend)(x), f(x))
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch_npu.compile(f, backend=broken_backend, fallback="eager")(x)
    close(out, f(x))
    assert any("runs eagerly on the npu" in str(w.message) and "cannot compile aten.sin" in str(w.message)
               for w in caught)
    with pytest.raises(ValueError, match="fallback must be"):
        torch_npu.compile(f, fallback="cpu")


STREAM_ORDER_SCRIPT = """
import torch, torch_npu
def f(x):
    return torch.sin(x) * 2 + x.mean()  # generated C++ kernels only
x = torch.randn(256, 256, device="npu")
compiled = torch.compile(f)
compiled(x)
if DISABLE_WAIT:   # the kernels run at once, not in stream order
    torch_npu._C._run_in_stream_order = lambda device, name, kernel, *args: kernel(*args)
wrong = 0
for i in range(6):
    torch.npu._sleep(20)               # the stream is busy for 20 ms ...
    a = x * (i + 1)                    # ... so this eager kernel is still queued when the compiled ones start
    wrong += not torch.allclose(compiled(a).cpu(), f(a.cpu()), rtol=1e-4, atol=1e-4)
print("wrong", wrong)
"""


@pytest.mark.child_process
@pytest.mark.parametrize("disable_wait", [False, pytest.param(True, marks=pytest.mark.skipif(
    os.environ.get("NPU_EMU_PROTECT") == "1", reason="calling the kernels outside stream order touches closed "
                                                     "device memory in the protected mode: the process faults"))])
def test_generated_kernels_run_in_stream_order(run_python, disable_wait):
    proc = run_python(f"DISABLE_WAIT = {disable_wait}\n" + STREAM_ORDER_SCRIPT,
                      env={"NPU_EMU_ALWAYS_ENQUEUE": "1"})
    wrong = int(proc.stdout.split("wrong")[-1])
    if disable_wait:   # the test can fail: without the wait the kernels race the queue
        assert wrong > 0
    else:
        assert wrong == 0


# ---- torch.jit and torch.export ----

class WithNpuOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.gamma = nn.Parameter(torch.ones(8))

    def forward(self, x):
        y, _ = torch.ops.npu.npu_rms_norm(self.linear(x), self.gamma, 1e-6)
        return F.gelu(y)


@pytest.mark.child_process
def test_jit_trace_script_save_load_freeze_in_a_fresh_process(tmp_path, run_python):
    torch.manual_seed(0)
    model = WithNpuOp().npu().eval()
    x = torch.randn(4, 8, device="npu")
    expected = model(x)
    traced = torch.jit.trace(model, x)
    scripted = torch.jit.script(model)
    for m in (traced, scripted):
        close(m(x), expected)
    traced.save(str(tmp_path / "traced.pt"))
    scripted.save(str(tmp_path / "scripted.pt"))
    torch.save(x.cpu(), tmp_path / "x.pt")
    torch.save(expected.cpu(), tmp_path / "expected.pt")
    proc = run_python(f"""
        import torch, torch_npu
        d = {str(tmp_path)!r}
        x, expected = torch.load(d + "/x.pt"), torch.load(d + "/expected.pt")
        for name in ("traced", "scripted"):
            m = torch.jit.load(d + "/" + name + ".pt")                      # saved from npu: loads on npu
            assert next(m.parameters()).device.type == "npu"
            torch.testing.assert_close(m(x.npu()).cpu(), expected, rtol=2e-5, atol=2e-5)
            m = torch.jit.load(d + "/" + name + ".pt", map_location="npu")
            torch.testing.assert_close(m(x.npu()).cpu(), expected, rtol=2e-5, atol=2e-5)
            frozen = torch.jit.freeze(m.eval())   # (frozen constants live as long as the process: here)
            torch.testing.assert_close(frozen(x.npu()).cpu(), expected, rtol=2e-5, atol=2e-5)
            m = torch.jit.load(d + "/" + name + ".pt", map_location="cpu")  # npu:: ops serve cpu too
            torch.testing.assert_close(m(x), expected, rtol=2e-5, atol=2e-5)
        print("JIT OK")
    """)
    assert "JIT OK" in proc.stdout


def test_export_runs_on_the_npu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).npu()
    x = torch.randn(4, 8, device="npu")
    program = torch.export.export(model, (x,))
    out = program.module()(x)
    assert out.device.type == "npu"
    close(out, model(x))
    assert any(n.target is torch.ops.aten.linear.default for n in program.graph.nodes)


def test_compile_error_hint_is_for_npu_graphs_only():
    from torch_npu._compile.backend import FALLBACK_HINT

    def broken_backend(gm, example_inputs):
        raise NotImplementedError("this backend compiles nothing")

    def error_of(f, x):
        torch._dynamo.reset()
        with pytest.raises(Exception, match="compiles nothing") as error:
            torch.compile(f, backend=broken_backend)(x)
        torch._dynamo.reset()
        return str(error.value)

    assert FALLBACK_HINT not in error_of(lambda x: torch.sin(x) + 1, torch.randn(4))              # a cpu graph
    assert FALLBACK_HINT in error_of(lambda x: torch.sin(x) + 1, torch.randn(4, device="npu"))    # npu inputs
    assert FALLBACK_HINT in error_of(lambda x: (torch.ones(4, device="npu") + 1).cpu() + x,       # npu inside
                                     torch.randn(4))


def test_inductors_cache_keys_carry_the_npu_codegens_version():
    """Code cached by another version of torch_npu's code generation (another uuid)
    is never loaded for the npu: the version enters inductor's cache keys."""
    import hashlib
    import pathlib

    from torch._inductor.codegen import common
    from torch_npu._compile import _codegen

    torch.compile(lambda a: a + 1)(torch.ones(2, device="npu"))
    registered = common.custom_backend_passes.get("npu")
    from torch_npu._compile import _host_codegen
    sources = [pathlib.Path(_codegen.__file__), pathlib.Path(_host_codegen.__file__)]   # what decides the code
    assert list(_codegen.SOURCES) == sources
    expected = hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()
    assert registered is not None and registered.uuid() == expected
    assert common.get_scheduling_for_device("npu") is _codegen.Scheduling
