"""The Ascend adapter's optimisers that PyTorch has no counterpart for: NpuFusedLamb,
NpuFusedAdamP, NpuFusedBertAdam and NpuFusedRMSpropTF, with its signatures, defaults and
update rules.

Each step is a few multi-tensor (``_foreach_*``) kernels per group; the per-parameter
decisions of the rules (LAMB's trust ratio, AdamP's projection, BertAdam's clipping) are
computed on the device with ``torch.where``, so a step never waits for the device.
"""
import math

import torch
from torch.optim.optimizer import required

__all__ = ["NpuFusedLamb", "NpuFusedAdamP", "NpuFusedBertAdam", "NpuFusedRMSpropTF"]


def _check(name, ok, message):
    if not ok:
        raise ValueError(f"torch_npu.optim.{name}: {message}")


def _loss_of(closure):
    """The closure's loss (None without one), computed with gradients on: step() runs under no_grad."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _dense_grads(name, group):
    params = [p for p in group["params"] if p.grad is not None]
    for p in params:
        if p.grad.is_sparse:
            raise RuntimeError(f"torch_npu.optim.{name} does not support sparse gradients; use torch.optim.SparseAdam")
    return params


def _moments(optimizer, params):
    """Each parameter's (exp_avg, exp_avg_sq), made at its first step; the step counts advance."""
    exp_avgs, exp_avg_sqs = [], []
    for p in params:
        state = optimizer.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        exp_avgs.append(state["exp_avg"])
        exp_avg_sqs.append(state["exp_avg_sq"])
    return exp_avgs, exp_avg_sqs


def _update_moments(exp_avgs, exp_avg_sqs, grads, beta1, beta2):
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)


class NpuFusedLamb(torch.optim.Optimizer):
    """LAMB (arXiv:1904.00962) as the Ascend adapter's NpuFusedLamb computes it (after
    pytorch-lamb): no bias correction; the Adam step ``m / (sqrt(v) + eps)`` plus
    ``weight_decay * p`` is scaled per parameter by the trust ratio
    ``min(||p||, 10) / ||step||`` (1 where either norm is 0, always 1 with ``adam=True``).
    With ``use_global_grad_norm`` the gradients are divided by their global norm where it
    passes 1. The gradients themselves are left unchanged.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0, adam=False,
                 use_global_grad_norm=False):
        _check("NpuFusedLamb", lr >= 0.0, f"invalid learning rate: {lr}")
        _check("NpuFusedLamb", 0.0 <= betas[0] < 1.0, f"invalid beta parameter at index 0: {betas[0]}")
        _check("NpuFusedLamb", 0.0 <= betas[1] < 1.0, f"invalid beta parameter at index 1: {betas[1]}")
        _check("NpuFusedLamb", eps >= 0.0, f"invalid epsilon value: {eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.adam = adam
        self.use_global_grad_norm = use_global_grad_norm

    @torch.no_grad()
    def step(self, closure=None):
        loss = _loss_of(closure)
        groups = [(group, _dense_grads("NpuFusedLamb", group)) for group in self.param_groups]
        scale = None
        if self.use_global_grad_norm:
            grads = [p.grad for _, params in groups for p in params]
            if grads:
                norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)).float())
                # Divide only where the norm passes 1 (a NaN norm divides nothing, as Ascend's check).
                scale = torch.where(norm > 1, norm, torch.ones_like(norm))
        for group, params in groups:
            if not params:
                continue
            beta1, beta2 = group["betas"]
            grads = [p.grad for p in params]
            if scale is not None:
                grads = torch._foreach_div([g.float() for g in grads], scale.to(params[0].device))
                grads = [g.to(p.grad.dtype) for g, p in zip(grads, params)]
            exp_avgs, exp_avg_sqs = _moments(self, params)
            for p in params:
                self.state[p]["step"] += 1
            _update_moments(exp_avgs, exp_avg_sqs, grads, beta1, beta2)
            steps = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_add_(steps, group["eps"])
            steps = torch._foreach_div(exp_avgs, steps)
            if group["weight_decay"] != 0:
                torch._foreach_add_(steps, params, alpha=group["weight_decay"])
            if self.adam:
                torch._foreach_add_(params, steps, alpha=-group["lr"])
                continue
            weight_norms = torch._foreach_norm(params)
            step_norms = torch._foreach_norm(steps)
            for p, step, weight_norm, step_norm in zip(params, steps, weight_norms, step_norms):
                weight_norm = weight_norm.clamp(0, 10)
                trust = torch.where((weight_norm == 0) | (step_norm == 0), torch.ones_like(weight_norm),
                                    weight_norm / step_norm)
                p.add_(step * trust, alpha=-group["lr"])
        return loss


class NpuFusedAdamP(torch.optim.Optimizer):
    """AdamP (arXiv:2006.08217) as the Ascend adapter's NpuFusedAdamP: Adam with bias
    correction whose step, for parameters of 2 or more dimensions whose gradient is nearly
    orthogonal to them (cosine below ``delta / sqrt(fan)``, per output channel, else per
    layer), loses its radial part; such parameters take ``wd_ratio`` of the weight decay.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, delta=0.1, wd_ratio=0.1,
                 nesterov=False):
        _check("NpuFusedAdamP", lr >= 0.0, f"invalid learning rate: {lr}")
        _check("NpuFusedAdamP", 0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0, f"invalid betas: {betas}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, delta=delta,
                                      wd_ratio=wd_ratio, nesterov=nesterov))

    @staticmethod
    def _projection(p, grad, perturb, delta, wd_ratio, eps):
        """(perturb, weight decay ratio): the first view (channel, then layer) whose rows are all
        nearly orthogonal to the gradient removes perturb's component along p."""
        expand = [-1] + [1] * (p.dim() - 1)
        result, ratio = perturb, torch.ones((), device=p.device, dtype=torch.float32)
        done = torch.zeros((), device=p.device, dtype=torch.bool)
        for rows in (p.size(0), 1):
            pv, gv = p.reshape(rows, -1), grad.reshape(rows, -1)
            cosine = (pv * gv).sum(1).abs() / gv.norm(dim=1).add(eps) / pv.norm(dim=1).add(eps)
            taken = (cosine.max() < delta / math.sqrt(pv.size(1))) & ~done
            p_n = p / pv.norm(dim=1).add(eps).view(expand if rows > 1 else [1] * p.dim())
            projected = perturb - p_n * (p_n * perturb).reshape(rows, -1).sum(1).view(expand if rows > 1 else [1] * p.dim())
            result = torch.where(taken, projected, result)
            ratio = torch.where(taken, torch.full_like(ratio, wd_ratio), ratio)
            done = done | taken
        return result, ratio

    @torch.no_grad()
    def step(self, closure=None):
        loss = _loss_of(closure)
        for group in self.param_groups:
            params = _dense_grads("NpuFusedAdamP", group)
            if not params:
                continue
            beta1, beta2 = group["betas"]
            grads = [p.grad for p in params]
            exp_avgs, exp_avg_sqs = _moments(self, params)
            _update_moments(exp_avgs, exp_avg_sqs, grads, beta1, beta2)
            for p, grad, exp_avg, exp_avg_sq in zip(params, grads, exp_avgs, exp_avg_sqs):
                state = self.state[p]
                state["step"] += 1
                bias1, bias2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
                denom = (exp_avg_sq.sqrt() / math.sqrt(bias2)).add_(group["eps"])
                if group["nesterov"]:
                    perturb = (beta1 * exp_avg + (1 - beta1) * grad) / denom
                else:
                    perturb = exp_avg / denom
                ratio = 1.0
                if p.dim() > 1:
                    perturb, ratio = self._projection(p, grad, perturb, group["delta"], group["wd_ratio"],
                                                      group["eps"])
                if group["weight_decay"] > 0:
                    p.mul_(1 - group["lr"] * group["weight_decay"] * ratio)
                p.add_(perturb, alpha=-group["lr"] / bias1)
        return loss


def _warmup_cosine(x, warmup):
    return x / warmup if x < warmup else 0.5 * (1.0 + math.cos(math.pi * x))


def _warmup_constant(x, warmup):
    return x / warmup if x < warmup else 1.0


def _warmup_linear(x, warmup):
    return x / warmup if x < warmup else max((x - 1.0) / (warmup - 1.0), 0.0)


def _warmup_poly(x, warmup, degree=0.5):
    return x / warmup if x < warmup else (1.0 - x) ** degree


SCHEDULES = {"warmup_cosine": _warmup_cosine, "warmup_constant": _warmup_constant,
             "warmup_linear": _warmup_linear, "warmup_poly": _warmup_poly}


class NpuFusedBertAdam(torch.optim.Optimizer):
    """BERT's Adam (no bias correction, decoupled ``weight_decay * p`` added to the step) as the
    Ascend adapter's NpuFusedBertAdam: the gradients of each group's parameters of one dtype are
    first clipped together to ``max_grad_norm`` (in place, as there; -1: no clipping), and with
    ``t_total`` the learning rate follows ``schedule`` with ``warmup``.
    """

    def __init__(self, params, lr=required, warmup=-1, t_total=-1, schedule="warmup_linear", b1=0.9, b2=0.999,
                 e=1e-6, weight_decay=0.01, max_grad_norm=1.0):
        if lr is required:
            raise TypeError("torch_npu.optim.NpuFusedBertAdam: lr is required (NpuFusedBertAdam(params, lr=1e-4))")
        _check("NpuFusedBertAdam", lr >= 0.0, f"invalid learning rate: {lr}")
        _check("NpuFusedBertAdam", warmup == -1 or 0.0 <= warmup < 1.0, f"invalid warmup: {warmup}")
        _check("NpuFusedBertAdam", schedule in SCHEDULES,
               f"invalid schedule {schedule!r}; one of {sorted(SCHEDULES)}")
        _check("NpuFusedBertAdam", 0.0 <= b1 < 1.0, f"invalid b1 parameter: {b1}")
        _check("NpuFusedBertAdam", 0.0 <= b2 < 1.0, f"invalid b2 parameter: {b2}")
        _check("NpuFusedBertAdam", e >= 0.0, f"invalid epsilon value: {e}")
        super().__init__(params, dict(lr=lr, schedule=schedule, warmup=warmup, t_total=t_total, b1=b1, b2=b2, e=e,
                                      weight_decay=weight_decay, max_grad_norm=max_grad_norm))
        self.max_grad_norm = max_grad_norm

    @torch.no_grad()
    def step(self, closure=None):
        loss = _loss_of(closure)
        for group in self.param_groups:
            params = _dense_grads("NpuFusedBertAdam", group)
            by_dtype = {}
            for p in params:
                by_dtype.setdefault(p.dtype, []).append(p)
            for same_dtype in by_dtype.values():
                grads = [p.grad for p in same_dtype]
                if self.max_grad_norm > 0:
                    norm = torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads]))
                    coef = self.max_grad_norm / (norm + 1e-6)
                    coef = torch.where(coef < 1, coef, torch.ones_like(coef))  # NaN: no clipping, as on Ascend
                    torch._foreach_mul_(grads, coef.to(grads[0].dtype))
                exp_avgs, exp_avg_sqs = _moments(self, same_dtype)
                _update_moments(exp_avgs, exp_avg_sqs, grads, group["b1"], group["b2"])
                updates = torch._foreach_sqrt(exp_avg_sqs)
                torch._foreach_add_(updates, group["e"])
                updates = torch._foreach_div(exp_avgs, updates)
                if group["weight_decay"] > 0.0:
                    torch._foreach_add_(updates, same_dtype, alpha=group["weight_decay"])
                step = self.state[same_dtype[0]]["step"]
                lr = group["lr"]
                if group["t_total"] != -1:
                    lr = lr * SCHEDULES[group["schedule"]](step / group["t_total"], group["warmup"])
                torch._foreach_add_(same_dtype, updates, alpha=-lr)
                for p in same_dtype:
                    self.state[p]["step"] += 1
        return loss


class NpuFusedRMSpropTF(torch.optim.Optimizer):
    """RMSprop as TensorFlow computes it (the Ascend adapter's NpuFusedRMSpropTF, after timm's
    RMSpropTF). Unlike ``torch.optim.RMSprop``: the square average starts at ones, ``eps`` is
    added inside the square root, and with ``lr_in_momentum`` the momentum buffer accumulates
    ``lr * g / avg`` and is subtracted whole. ``decoupled_decay`` shrinks the parameters by
    ``lr * weight_decay`` instead of adding ``weight_decay * p`` to the gradient.
    """

    def __init__(self, params, lr=1e-2, alpha=0.9, eps=1e-10, weight_decay=0, momentum=0., centered=False,
                 decoupled_decay=False, lr_in_momentum=True):
        for name, value in (("learning rate", lr), ("alpha", alpha), ("epsilon", eps),
                            ("weight_decay", weight_decay), ("momentum", momentum)):
            _check("NpuFusedRMSpropTF", value >= 0.0, f"invalid {name} value: {value}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, decoupled_decay=decoupled_decay,
                                      lr_in_momentum=lr_in_momentum))

    def _state(self, params, group):
        """(square_avgs, grad_avgs, momentum_buffers) of the group's parameters; steps advance."""
        square_avgs, grad_avgs, buffers = [], [], []
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
                if group["momentum"] > 0:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["centered"]:
                    state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            square_avgs.append(state["square_avg"])
            grad_avgs.append(state.get("grad_avg"))
            buffers.append(state.get("momentum_buffer"))
        return square_avgs, grad_avgs, buffers

    @torch.no_grad()
    def step(self, closure=None):
        loss = _loss_of(closure)
        for group in self.param_groups:
            params = _dense_grads("NpuFusedRMSpropTF", group)
            if not params:
                continue
            lr, alpha, eps, wd, momentum = (group[k] for k in ("lr", "alpha", "eps", "weight_decay", "momentum"))
            square_avgs, grad_avgs, buffers = self._state(params, group)
            grads = [p.grad for p in params]
            if wd != 0:
                if group["decoupled_decay"]:
                    torch._foreach_mul_(params, 1 - lr * wd)
                else:
                    grads = torch._foreach_add(grads, params, alpha=wd)
            # square_avg += (1 - alpha) * (g^2 - square_avg)
            torch._foreach_add_(square_avgs, torch._foreach_sub(torch._foreach_mul(grads, grads), square_avgs),
                                alpha=1 - alpha)
            if group["centered"]:
                torch._foreach_add_(grad_avgs, torch._foreach_sub(grads, grad_avgs), alpha=1 - alpha)
                avgs = torch._foreach_addcmul(square_avgs, grad_avgs, grad_avgs, value=-1)
                torch._foreach_add_(avgs, eps)
            else:
                avgs = torch._foreach_add(square_avgs, eps)
            torch._foreach_sqrt_(avgs)
            if momentum > 0:
                torch._foreach_mul_(buffers, momentum)
                if group["lr_in_momentum"]:
                    torch._foreach_addcdiv_(buffers, grads, avgs, value=lr)
                    torch._foreach_sub_(params, buffers)
                else:
                    torch._foreach_addcdiv_(buffers, grads, avgs)
                    torch._foreach_add_(params, buffers, alpha=-lr)
            else:
                torch._foreach_addcdiv_(params, grads, avgs, value=-lr)
        return loss
