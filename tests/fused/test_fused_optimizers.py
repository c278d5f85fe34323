"""torch_npu.optim's NpuFused* optimizers: PyTorch's results, the Ascend signatures."""
import pytest
import torch

import torch_npu

CASES = {
    "NpuFusedAdam": (lambda p: torch_npu.optim.NpuFusedAdam(p, lr=0.05, weight_decay=0.1),
                     lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.1)),
    "NpuFusedAdamW": (lambda p: torch_npu.optim.NpuFusedAdamW(p, lr=0.05),
                      lambda p: torch.optim.AdamW(p, lr=0.05)),
    "NpuFusedSGD": (lambda p: torch_npu.optim.NpuFusedSGD(p, lr=0.1, momentum=0.9, nesterov=True),
                    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)),
    "NpuFusedRMSprop": (lambda p: torch_npu.optim.NpuFusedRMSprop(p, lr=0.01, momentum=0.5),
                        lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5)),
    "NpuFusedAdadelta": (lambda p: torch_npu.optim.NpuFusedAdadelta(p, lr=0.5),
                         lambda p: torch.optim.Adadelta(p, lr=0.5)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_optimizers_match_pytorchs_on_the_cpu(name):
    make_npu, make_cpu = CASES[name]
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    npu_model = torch.nn.Linear(8, 4).npu()
    npu_model.load_state_dict(model.state_dict())
    cpu_opt, npu_opt = make_cpu(model.parameters()), make_npu(npu_model.parameters())
    for _ in range(3):
        x = torch.randn(5, 8)
        for m, opt, data in ((model, cpu_opt, x), (npu_model, npu_opt, x.npu())):
            opt.zero_grad()
            m(data).square().mean().backward()
            opt.step()
    for p, q in zip(npu_model.parameters(), model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def test_sgd_needs_a_learning_rate():
    with pytest.raises(TypeError, match="lr is required"):
        torch_npu.optim.NpuFusedSGD([torch.nn.Parameter(torch.ones(2, device="npu"))])


# ---- the Ascend adapter's own optimisers: against their update rules written per parameter ----

def lamb_reference(params, state, lr, betas, eps, wd, adam, global_norm):
    b1, b2 = betas
    grads = [p.grad for p in params]
    if global_norm:
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
        if norm > 1:
            grads = [g / norm for g in grads]
    for p, g in zip(params, grads):
        m, v = state.setdefault(p, (torch.zeros_like(p), torch.zeros_like(p)))
        m.mul_(b1).add_((1 - b1) * g)
        v.mul_(b2).add_((1 - b2) * g * g)
        step = m / (v.sqrt() + eps) + wd * p
        ratio = 1.0
        if not adam:
            w_norm, s_norm = min(p.norm().item(), 10.0), step.norm().item()
            ratio = 1.0 if w_norm == 0 or s_norm == 0 else w_norm / s_norm
        p.sub_(lr * ratio * step)


def adamp_reference(params, state, lr, betas, eps, wd, delta, wd_ratio):
    import math
    b1, b2 = betas
    for p in params:
        g = p.grad
        m, v, t = state.get(p, (torch.zeros_like(p), torch.zeros_like(p), 0))
        t += 1
        state[p] = (m, v, t)
        m.mul_(b1).add_((1 - b1) * g)
        v.mul_(b2).add_((1 - b2) * g * g)
        perturb = m / (v.sqrt() / math.sqrt(1 - b2 ** t) + eps)
        ratio = 1.0
        if p.dim() > 1:
            for rows in (p.size(0), 1):
                pv, gv = p.reshape(rows, -1), g.reshape(rows, -1)
                cos = (pv * gv).sum(1).abs() / (gv.norm(dim=1) + eps) / (pv.norm(dim=1) + eps)
                if cos.max().item() < delta / math.sqrt(pv.size(1)):
                    p_n = (pv / (pv.norm(dim=1, keepdim=True) + eps))
                    pert = perturb.reshape(rows, -1)
                    perturb = (pert - p_n * (p_n * pert).sum(1, keepdim=True)).reshape(p.shape)
                    ratio = wd_ratio
                    break
        if wd > 0:
            p.mul_(1 - lr * wd * ratio)
        p.sub_(lr / (1 - b1 ** t) * perturb)


def bert_adam_reference(params, state, lr, warmup, t_total, b1, b2, e, wd, max_norm):
    grads = [p.grad for p in params]
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
    coef = max_norm / (norm + 1e-6)
    if max_norm > 0 and coef < 1:
        grads = [g * coef for g in grads]
    t = state.get("t", 0)
    x = t / t_total
    scheduled = lr * (x / warmup if x < warmup else max((x - 1.0) / (warmup - 1.0), 0.0))
    for p, g in zip(params, grads):
        m, v = state.setdefault(p, (torch.zeros_like(p), torch.zeros_like(p)))
        m.mul_(b1).add_((1 - b1) * g)
        v.mul_(b2).add_((1 - b2) * g * g)
        p.sub_(scheduled * (m / (v.sqrt() + e) + wd * p))
    state["t"] = t + 1


def rmsprop_tf_reference(params, state, lr, alpha, eps, wd, momentum, centered, decoupled, lr_in_momentum):
    """timm's RMSpropTF, one parameter at a time."""
    for p in params:
        g = p.grad
        sq, gavg, buf = state.setdefault(p, (torch.ones_like(p), torch.zeros_like(p), torch.zeros_like(p)))
        if wd:
            if decoupled:
                p.mul_(1 - lr * wd)
            else:
                g = g + wd * p
        sq.add_((g * g - sq) * (1 - alpha))
        if centered:
            gavg.add_((g - gavg) * (1 - alpha))
            avg = (sq - gavg * gavg + eps).sqrt()
        else:
            avg = (sq + eps).sqrt()
        if momentum > 0:
            buf.mul_(momentum)
            if lr_in_momentum:
                buf.add_(lr * g / avg)
                p.sub_(buf)
            else:
                buf.add_(g / avg)
                p.sub_(lr * buf)
        else:
            p.sub_(lr * g / avg)


ASCEND_ONLY = {
    "lamb": (lambda p: torch_npu.optim.NpuFusedLamb(p, lr=0.01, weight_decay=0.01),
             lambda p, s: lamb_reference(p, s, 0.01, (0.9, 0.999), 1e-6, 0.01, False, False)),
    "lamb_global_norm": (lambda p: torch_npu.optim.NpuFusedLamb(p, lr=0.01, use_global_grad_norm=True),
                         lambda p, s: lamb_reference(p, s, 0.01, (0.9, 0.999), 1e-6, 0, False, True)),
    "lamb_adam": (lambda p: torch_npu.optim.NpuFusedLamb(p, lr=0.01, adam=True),
                  lambda p, s: lamb_reference(p, s, 0.01, (0.9, 0.999), 1e-6, 0, True, False)),
    "adamp": (lambda p: torch_npu.optim.NpuFusedAdamP(p, lr=0.01, weight_decay=0.1),
              lambda p, s: adamp_reference(p, s, 0.01, (0.9, 0.999), 1e-8, 0.1, 0.1, 0.1)),
    "bert_adam": (lambda p: torch_npu.optim.NpuFusedBertAdam(p, lr=0.01, warmup=0.2, t_total=10),
                  lambda p, s: bert_adam_reference(p, s, 0.01, 0.2, 10, 0.9, 0.999, 1e-6, 0.01, 1.0)),
    "rmsprop_tf": (lambda p: torch_npu.optim.NpuFusedRMSpropTF(p, lr=0.01, weight_decay=0.01),
                   lambda p, s: rmsprop_tf_reference(p, s, 0.01, 0.9, 1e-10, 0.01, 0, False, False, True)),
    "rmsprop_tf_momentum_centered": (
        lambda p: torch_npu.optim.NpuFusedRMSpropTF(p, lr=0.01, momentum=0.9, centered=True, weight_decay=0.01,
                                                    decoupled_decay=True),
        lambda p, s: rmsprop_tf_reference(p, s, 0.01, 0.9, 1e-10, 0.01, 0.9, True, True, True)),
    "rmsprop_tf_lr_after_momentum": (
        lambda p: torch_npu.optim.NpuFusedRMSpropTF(p, lr=0.01, momentum=0.5, lr_in_momentum=False),
        lambda p, s: rmsprop_tf_reference(p, s, 0.01, 0.9, 1e-10, 0, 0.5, False, False, False)),
}


@pytest.mark.parametrize("name", list(ASCEND_ONLY))
def test_ascend_only_optimizers_follow_their_rules(name):
    make_npu, reference = ASCEND_ONLY[name]
    gen = torch.Generator().manual_seed(0)
    # A Linear before a LayerNorm is scale-invariant (AdamP projects it), one weight has a norm
    # above LAMB's clamp of 10, the zero bias has a trust ratio of 1, and the loss is large
    # enough for BertAdam's clipping.
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    with torch.no_grad():
        model[0].weight.mul_(20)
        model[0].bias.zero_()
    npu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)).npu()
    npu_model.load_state_dict(model.state_dict())
    npu_opt, state = make_npu(npu_model.parameters()), {}
    params = list(model.parameters())
    initial = model[0].weight.detach().clone()
    for _ in range(4):
        x = torch.randn(6, 8, generator=gen)
        for m, data in ((model, x), (npu_model, x.npu())):
            for p in m.parameters():
                p.grad = None
            (m(data).square().mean() * 100).backward()
        with torch.no_grad():
            reference(params, state)
        npu_opt.step()
    for p, q in zip(npu_model.parameters(), params):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=2e-5, atol=2e-6)
    assert (npu_model[0].weight.detach().cpu() - initial).abs().max() > 1e-3  # the steps moved it


def test_ascend_only_optimizers_check_their_arguments():
    p = [torch.nn.Parameter(torch.ones(2, device="npu"))]
    with pytest.raises(TypeError, match="NpuFusedBertAdam: lr is required"):
        torch_npu.optim.NpuFusedBertAdam(p)
    with pytest.raises(ValueError, match="NpuFusedBertAdam: invalid schedule 'cosine'"):
        torch_npu.optim.NpuFusedBertAdam(p, lr=0.1, schedule="cosine")
    with pytest.raises(ValueError, match="NpuFusedLamb: invalid beta parameter at index 1"):
        torch_npu.optim.NpuFusedLamb(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="NpuFusedRMSpropTF: invalid momentum value: -0.5"):
        torch_npu.optim.NpuFusedRMSpropTF(p, momentum=-0.5)


def test_rmsprop_tf_differs_from_pytorchs_rmsprop():
    """The TF form (square average from ones, eps inside the root) is not torch.optim.RMSprop's:
    a test that compared it with PyTorch's could not tell the two apart otherwise."""
    a = torch.nn.Parameter(torch.ones(4, device="npu"))
    b = torch.nn.Parameter(torch.ones(4))
    a.grad, b.grad = torch.full((4,), 0.5, device="npu"), torch.full((4,), 0.5)
    torch_npu.optim.NpuFusedRMSpropTF([a], lr=0.1).step()
    torch.optim.RMSprop([b], lr=0.1, alpha=0.9, eps=1e-10).step()
    # TF: 1 - 0.1 * 0.5 / sqrt(0.9 + 0.025); PyTorch: 1 - 0.1 * 0.5 / sqrt(0.025)
    torch.testing.assert_close(a.detach().cpu(), torch.full((4,), 1 - 0.05 / 0.925 ** 0.5))
    torch.testing.assert_close(b.detach(), torch.full((4,), 1 - 0.05 / 0.025 ** 0.5))


@pytest.mark.parametrize("make", [
    lambda p: torch_npu.optim.NpuFusedLamb(p, lr=0.1, use_global_grad_norm=True),
    lambda p: torch_npu.optim.NpuFusedBertAdam(p, lr=0.1, max_grad_norm=1.0)])
def test_a_nan_gradient_stays_in_its_own_elements(make):
    # Ascend's checks (norm > 1, coefficient < 1) are false for a NaN norm: no scaling, so
    # the NaN does not spread to every other gradient and parameter.
    a = torch.nn.Parameter(torch.ones(4, device="npu"))
    b = torch.nn.Parameter(torch.ones(4, device="npu"))
    a.grad = torch.tensor([float("nan"), 0.5, 0.5, 0.5], device="npu")
    b.grad = torch.full((4,), 0.5, device="npu")
    make([a, b]).step()
    assert torch.isfinite(b.detach()).all() and torch.isfinite(b.grad).all()


@pytest.mark.parametrize("make", [
    lambda p: torch_npu.optim.NpuFusedLamb(p, lr=0.1), lambda p: torch_npu.optim.NpuFusedAdamP(p, lr=0.1),
    lambda p: torch_npu.optim.NpuFusedBertAdam(p, lr=0.1, max_grad_norm=-1),  # (its clipping is in place)
    lambda p: torch_npu.optim.NpuFusedRMSpropTF(p, lr=0.1)])
def test_step_evaluates_the_closure_with_gradients(make):
    w = torch.nn.Parameter(torch.ones(3, device="npu"))
    opt = make([w])

    def closure():
        opt.zero_grad()
        loss = (w * 2).sum()
        loss.backward()
        return loss

    with torch.no_grad():  # as a training loop may call it; the closure still gets gradients
        loss = opt.step(closure)
    assert loss.item() == 6.0 and torch.equal(w.grad.cpu(), torch.full((3,), 2.0))
    assert (w.detach().cpu() < 1).all()  # the step used them
