"""Mixed precision on the npu: torch.autocast("npu") casts like CUDA's autocast
(PyTorch's own autocast test lists, each op checked against the same op on
arguments cast by hand), GradScaler skips steps with inf/NaN gradients, and a
float16 / bfloat16 training loop reaches the float32 loop's loss."""
import collections.abc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing._internal.autocast_test_lists import AutocastTestLists

import torch_npu  # noqa: F401

# The cases are collected from the lists built on the cpu; the npu's arguments are
# built per module (npu_lists) and freed with it, so later tests find the device empty.
CPU_LISTS = AutocastTestLists(torch.device("cpu"))
# cuDNN's ops do not exist on an npu; the list's einsum entry is malformed (PyTorch's
# CUDA test skips it too): einsum is checked below with arguments that fit.
SKIPPED = {"cudnn_convolution", "cudnn_convolution_transpose", "einsum"}


def cast(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, collections.abc.Iterable) and not isinstance(value, str):
        return type(value)(cast(v, dtype) for v in value)
    return value


def cases(*names):
    for name in names:
        for index, entry in enumerate(getattr(CPU_LISTS, name)):
            if entry[0] in SKIPPED:
                continue
            yield pytest.param(name, index, id=f"{name}-{entry[0]}-{index}")


@pytest.fixture(scope="module")
def npu_lists():
    lists = AutocastTestLists(torch.device("npu"))
    yield lists
    del lists


MODULES = {"nn_fp16": torch._C._nn, "nn_fp32": torch._C._nn, "linalg_fp16": torch._C._linalg}
EXPECTED = {"torch_fp16": torch.float16, "nn_fp16": torch.float16, "linalg_fp16": torch.float16,
            "methods_fp16": torch.float16, "torch_fp32": torch.float32, "nn_fp32": torch.float32,
            "methods_fp32": torch.float32, "torch_need_autocast_promote": torch.float32}


@pytest.mark.parametrize("list_name,index", list(cases(*EXPECTED)))
def test_autocast_casts_like_cuda(npu_lists, list_name, index):
    entry = getattr(npu_lists, list_name)[index]
    op, args = entry[0], entry[1]
    kwargs = entry[2] if len(entry) > 2 and isinstance(entry[2], dict) else {}
    run_as = EXPECTED[list_name]
    module = None if list_name.startswith("methods") else MODULES.get(list_name, torch)
    call = (lambda *a, **k: getattr(a[0], op)(*a[1:], **k)) if module is None else getattr(module, op)
    with torch.autocast("npu", dtype=torch.float16):
        out = call(*args, **kwargs)
    expected = call(*cast(args, run_as), **kwargs)
    first = out[0] if isinstance(out, tuple) else out
    ref = expected[0] if isinstance(expected, tuple) else expected
    assert first.device.type == "npu"
    assert first.dtype == ref.dtype == run_as, f"autocast('npu') ran {op} in {first.dtype}, CUDA's runs it in {run_as}"
    torch.testing.assert_close(first, ref, equal_nan=True)


@pytest.mark.parametrize("list_name,index", list(cases("torch_expect_builtin_promote")))
def test_ops_outside_the_lists_pass_through(npu_lists, list_name, index):
    op, args, out_type = getattr(npu_lists, list_name)[index]
    with torch.autocast("npu", dtype=torch.float16):
        out = getattr(torch, op)(*args)
    expected = getattr(torch, op)(*args)
    if isinstance(out, torch.Tensor):
        assert out.dtype == out_type
    torch.testing.assert_close(out, expected)


def test_binary_cross_entropy_is_refused_as_on_cuda():
    x, y = torch.rand(8, 8, device="npu"), torch.rand(8, 8, device="npu")
    with torch.autocast("npu"), pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
        F.binary_cross_entropy(x, y)


def test_bfloat16_autocast_and_the_amp_aliases():
    assert torch.npu.is_bf16_supported()
    assert torch.get_autocast_dtype("npu") == torch.float16
    w, x = torch.randn(8, 8, device="npu"), torch.randn(4, 8, device="npu")
    with torch.npu.amp.autocast(dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("npu")
        out = x @ w
        assert out.dtype == torch.bfloat16 and torch.softmax(out, -1).dtype == torch.float32
    torch.testing.assert_close(out, (x.bfloat16() @ w.bfloat16()))
    with torch.autocast("npu"):
        product = torch.einsum("ij,jk->ik", x, w)
    assert product.dtype == torch.float16
    torch.testing.assert_close(product, torch.einsum("ij,jk->ik", x.half(), w.half()))
    with torch.npu.amp.autocast(enabled=False):
        assert (x @ w).dtype == torch.float32

    class Scaled(torch.autograd.Function):
        @staticmethod
        @torch.npu.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, a):
            ctx.dtype = a.dtype
            return a * 2

        @staticmethod
        @torch.npu.amp.custom_bwd
        def backward(ctx, grad):
            return grad * 2

    half = torch.ones(3, device="npu", dtype=torch.float16, requires_grad=True)
    with torch.autocast("npu"):
        out = Scaled.apply(half)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert half.grad.dtype == torch.float16 and torch.equal(half.grad.float().cpu(), torch.full((3,), 2.0))


def test_autocast_backward_runs_in_the_forward_dtypes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).npu()
    x = torch.randn(8, 16, device="npu")
    with torch.autocast("npu", dtype=torch.float16):
        out = model(x)
        loss = F.cross_entropy(out, torch.arange(8, device="npu") % 4)
    assert out.dtype == torch.float16 and loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())   # master weights stay float32


def train(dtype, steps=60, inject_inf_at=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1)).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.npu.amp.GradScaler(init_scale=2.0 ** 12, enabled=dtype == torch.float16)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    y = (x @ torch.randn(8, 1, generator=g)).tanh()
    x, y = x.npu(), y.npu()
    losses, scales = [], []
    for step in range(steps):
        with torch.autocast("npu", dtype=dtype or torch.float16, enabled=dtype is not None):
            loss = F.mse_loss(model(x).float(), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        if step == inject_inf_at:
            model[0].weight.grad[0, 0] = float("inf")
        before = [p.detach().clone() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        if step == inject_inf_at:   # the step was skipped: parameters unchanged
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        losses.append(loss.item())
        scales.append(scaler.get_scale() if scaler.is_enabled() else 1.0)
    return losses, scales


def test_float16_training_with_the_scaler_reaches_the_float32_loss():
    fp32, _ = train(None)
    fp16, scales = train(torch.float16, inject_inf_at=5)
    bf16, _ = train(torch.bfloat16)
    assert fp32[-1] < 0.3 * fp32[0]
    assert abs(fp16[-1] - fp32[-1]) < 0.05 * fp32[0] and abs(bf16[-1] - fp32[-1]) < 0.05 * fp32[0]
    assert scales[5] == scales[4] * 0.5          # the injected inf lowered the scale


def test_scaler_state_dict_and_unscale_for_clipping():
    model = nn.Linear(4, 4).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("npu", init_scale=1024.0)
    with torch.autocast("npu"):
        loss = model(torch.randn(2, 4, device="npu")).float().sum()
    scaler.scale(loss).backward()
    scaled = model.weight.grad.clone()
    scaler.unscale_(opt)
    torch.testing.assert_close(model.weight.grad, scaled / 1024.0)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    state = scaler.state_dict()
    assert state["scale"] == 1024.0
    restored = torch.npu.amp.GradScaler()
    restored.load_state_dict(state)
    assert restored.get_scale() == 1024.0
