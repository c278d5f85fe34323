"""Small models on the npu against the cpu: gradients and short training runs (issue 3).

Each model is built on the cpu under a fixed seed, deep-copied and moved to the
npu, so both start from the same parameters; inputs are made on the cpu and
copied. The npu must reproduce the cpu's outputs, every parameter's gradient,
and the losses of a few optimizer steps (SGD with momentum, Adam, AdamW; on the
npu torch.optim takes its foreach path, on the cpu its for-loop path).
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

import torch_npu

Fallback = torch_npu.NPUFallbackMode

GRAD_TOL = dict(rtol=1e-4, atol=1e-5)
LOSS_TOL = dict(rtol=1e-4, atol=1e-6)


# ---- the models -------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.LayerNorm(32),
                                 nn.Linear(32, 5))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(16 * 3 * 3, 5)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=40, d_model=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.block = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.0,
                                                batch_first=True)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens, mask=None):
        return self.head(self.block(self.embed(tokens), src_mask=mask))


def make_case(kind, seed=0, batch=6):
    """(model on cpu, inputs on cpu, targets on cpu, loss fn)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 100)
    if kind == "mlp":
        model = MLP()
        x = torch.randn(batch, 12, generator=g)
        y = torch.randint(0, 5, (batch,), generator=g)
        return model, (x,), y, F.cross_entropy
    if kind == "cnn":
        model = CNN()
        x = torch.randn(batch, 3, 12, 12, generator=g)
        y = torch.randint(0, 5, (batch,), generator=g)
        return model, (x,), y, F.cross_entropy
    if kind == "transformer":
        model = TinyTransformer()
        tokens = torch.randint(0, 40, (batch // 2, 7), generator=g)
        targets = torch.randint(0, 40, (batch // 2, 7), generator=g)
        return model, (tokens,), targets, lambda logits, t: F.cross_entropy(logits.flatten(0, 1), t.flatten())
    raise ValueError(kind)


MODELS = ["mlp", "cnn", "transformer"]


def npu_copy(model):
    return copy.deepcopy(model).to("npu")


def assert_same(got, expected, **kw):
    assert got.device.type == "npu", f"expected an npu tensor, got one on {got.device}"
    assert_close(got.cpu(), expected, **kw)


# ---- gradients ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", MODELS)
def test_gradients_match_cpu(kind):
    model, inputs, target, loss_fn = make_case(kind)
    model_n = npu_copy(model)
    for p in model_n.parameters():
        assert p.device.type == "npu"

    out = model(*inputs)
    loss = loss_fn(out, target)
    loss.backward()

    Fallback.reset_fallback_stats()
    out_n = model_n(*(t.npu() for t in inputs))
    assert_same(out_n.detach(), out.detach(), **GRAD_TOL)
    loss_n = loss_fn(out_n, target.npu())
    loss_n.backward()
    torch.npu.synchronize()
    stats = Fallback.get_fallback_stats()
    assert stats.total == 0, "training ran ops on the cpu fallback:\n" + stats.table()

    assert_same(loss_n.detach(), loss.detach(), **GRAD_TOL)
    named_n = dict(model_n.named_parameters())
    checked = 0
    for name, p in model.named_parameters():
        pn = named_n[name]
        assert p.grad is not None, name
        assert pn.grad is not None, f"{name} got no gradient on the npu"
        assert pn.grad.device.type == "npu", name
        assert_close(pn.grad.cpu(), p.grad, **GRAD_TOL, msg=lambda m: f"grad of {name}: {m}")
        checked += 1
    assert checked == len(list(model.parameters())) > 3
    for name, buf in model.named_buffers():  # BatchNorm running statistics
        assert_close(dict(model_n.named_buffers())[name].cpu(), buf, **GRAD_TOL)


def test_transformer_with_causal_mask_and_input_gradients():
    model, (tokens,), _, _ = make_case("transformer")
    model_n = npu_copy(model)
    mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
    emb = model.embed(tokens).detach().requires_grad_()
    emb_n = emb.detach().npu().requires_grad_()
    out = model.head(model.block(emb, src_mask=mask, is_causal=True))
    out_n = model_n.head(model_n.block(emb_n, src_mask=mask.npu(), is_causal=True))
    assert_same(out_n, out, **GRAD_TOL)
    g = torch.randn(out.shape)
    out.backward(g)
    out_n.backward(g.npu())
    assert_same(emb_n.grad, emb.grad, **GRAD_TOL)
    for (name, p), pn in zip(model.block.named_parameters(), model_n.block.parameters()):
        assert_close(pn.grad.cpu(), p.grad, **GRAD_TOL, msg=lambda m: f"grad of {name}: {m}")


def test_transformer_inference_eval_no_grad():
    """eval() + no_grad() may take nn.TransformerEncoderLayer's fused fast path."""
    model, (tokens,), _, _ = make_case("transformer")
    model.eval()
    model_n = npu_copy(model)
    with torch.no_grad():
        expected = model(tokens)
        got = model_n(tokens.npu())
    assert_same(got, expected, rtol=1e-4, atol=1e-4)


def test_cnn_eval_mode_uses_running_stats():
    model, (x,), _, _ = make_case("cnn")
    model(x)  # one training-mode pass updates the running statistics
    model.eval()
    model_n = npu_copy(model)
    with torch.no_grad():
        assert_same(model_n(x.npu()), model(x), **GRAD_TOL)


# ---- training loops ---------------------------------------------------------------------------

OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "sgd_nesterov_wd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True,
                                                      weight_decay=1e-3),
    "adam": lambda params: torch.optim.Adam(params, lr=3e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.05),
}


def train(model, inputs, target, loss_fn, make_opt, steps):
    opt = make_opt(model.parameters())
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, opt


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("kind", MODELS)
def test_training_reaches_the_same_losses(kind, opt_name):
    steps = 6
    model, inputs, target, loss_fn = make_case(kind, seed=1)
    model_n = npu_copy(model)
    losses, _ = train(model, inputs, target, loss_fn, OPTIMIZERS[opt_name], steps)
    Fallback.reset_fallback_stats()
    losses_n, opt_n = train(model_n, tuple(t.npu() for t in inputs), target.npu(), loss_fn,
                            OPTIMIZERS[opt_name], steps)
    torch.npu.synchronize()
    stats = Fallback.get_fallback_stats()
    assert stats.total == 0, "the training loop ran ops on the cpu fallback:\n" + stats.table()
    assert all(l.device.type == "npu" for l in losses_n)
    lc = torch.stack(losses)
    ln = torch.stack([l.cpu() for l in losses_n])
    print(f"\n{kind}/{opt_name} losses cpu={lc.tolist()} npu={ln.tolist()}")
    assert_close(ln, lc, **LOSS_TOL)
    assert lc[-1] < lc[0], "the loop should learn something (else the comparison proves little)"
    # the parameters and the optimizer state end up the same (and on the npu)
    for (name, p), pn in zip(model.named_parameters(), model_n.parameters()):
        assert pn.device.type == "npu"
        expected, got = p.detach(), pn.detach().cpu()
        if name.endswith("in_proj_bias") and opt_name.startswith("adam"):
            # The key bias cannot change attention (softmax is shift invariant): its gradient is
            # rounding noise, which Adam normalises into full-size steps of random sign.
            d = expected.numel() // 3
            expected, got = torch.cat([expected[:d], expected[2 * d:]]), torch.cat([got[:d], got[2 * d:]])
        assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=lambda m: f"parameter {name} after training: {m}")
    for state in opt_n.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                assert value.device.type == "npu"


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam", "adamw"])
def test_optimizers_take_the_foreach_path_on_npu(opt_name):
    """torch.optim defaults to its multi-tensor (_foreach_*) implementation for npu parameters."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [torch.zeros(3, device="npu", requires_grad=True)]
    fused, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    assert foreach and not fused
    # and the foreach path matches the single-tensor path on the npu
    model, inputs, target, loss_fn = make_case("mlp", seed=2)
    a, b = npu_copy(model), npu_copy(model)
    inputs_n, target_n = tuple(t.npu() for t in inputs), target.npu()
    make = {
        "sgd_momentum": lambda p, foreach: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=foreach),
        "adam": lambda p, foreach: torch.optim.Adam(p, lr=3e-3, foreach=foreach),
        "adamw": lambda p, foreach: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.05, foreach=foreach),
    }[opt_name]
    Fallback.reset_fallback_stats()
    la, _ = train(a, inputs_n, target_n, loss_fn, lambda p: make(p, True), 4)
    lb, _ = train(b, inputs_n, target_n, loss_fn, lambda p: make(p, False), 4)
    assert Fallback.get_fallback_stats().total == 0
    assert_close(torch.stack(la).cpu(), torch.stack(lb).cpu(), **LOSS_TOL)


def test_training_with_dropout_is_reproducible_under_a_seed():
    """Dropout on the npu draws from the npu generator: same seed, same losses."""
    def run():
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 5)).to("npu")
        g = torch.Generator().manual_seed(4)
        x, y = torch.randn(8, 12, generator=g).npu(), torch.randint(0, 5, (8,), generator=g).npu()
        torch.npu.manual_seed(5)
        losses, _ = train(model, (x,), y, F.cross_entropy, OPTIMIZERS["adam"], 4)
        return torch.stack(losses).cpu()

    first, second = run(), run()
    assert torch.equal(first, second)
