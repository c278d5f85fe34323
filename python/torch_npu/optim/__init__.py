"""Optimisers under the Ascend adapter's names (``torch_npu.optim.NpuFused*``; the HF Trainer's
``optim="adamw_torch_npu_fused"``): each is PyTorch's optimizer with the Ascend signature and
defaults, stepping all parameters of a group as one fused (``_fused_*_``) or multi-tensor
(``_foreach_*``) kernel per step on the npu. Results equal PyTorch's. NpuFusedLamb,
NpuFusedAdamP, NpuFusedBertAdam and NpuFusedRMSpropTF, which PyTorch has no counterpart for,
follow the Ascend adapter's update rules (``_ascend_only.py``).
"""
import torch
from torch.optim.optimizer import required

from ._ascend_only import NpuFusedAdamP, NpuFusedBertAdam, NpuFusedLamb, NpuFusedRMSpropTF

__all__ = ["NpuFusedAdam", "NpuFusedAdamW", "NpuFusedSGD", "NpuFusedRMSprop", "NpuFusedAdadelta", "NpuFusedLamb",
           "NpuFusedAdamP", "NpuFusedBertAdam", "NpuFusedRMSpropTF"]


class NpuFusedAdamW(torch.optim.AdamW):
    """AdamW as one fused multi-tensor kernel per step on the npu (``_fused_adamw_``).

    The same arguments and results as ``torch.optim.AdamW``; only ``fused`` is fixed.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, capturable=False, differentiable=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, capturable=capturable, differentiable=differentiable, fused=True)


class NpuFusedAdam(torch.optim.Adam):
    """Adam (L2 weight decay, default 0) as one fused kernel per step (``_fused_adam_``)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 maximize=False, capturable=False, differentiable=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, capturable=capturable, differentiable=differentiable, fused=True)


class NpuFusedSGD(torch.optim.SGD):
    """SGD (momentum, dampening, Nesterov) as one fused kernel per step (``_fused_sgd_``); ``lr``
    is required, as in the Ascend adapter."""

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False):
        if lr is required:
            raise TypeError("torch_npu.optim.NpuFusedSGD: lr is required (NpuFusedSGD(params, lr=0.1))")
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, fused=True)


class NpuFusedRMSprop(torch.optim.RMSprop):
    """RMSprop as multi-tensor kernels per step (``_foreach_*``)."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False):
        super().__init__(params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                         centered=centered, foreach=True)


class NpuFusedAdadelta(torch.optim.Adadelta):
    """Adadelta as multi-tensor kernels per step (``_foreach_*``)."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0):
        super().__init__(params, lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, foreach=True)
