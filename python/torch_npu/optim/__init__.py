"""Optimisers under the Ascend adapter's names (the HF Trainer's ``optim="adamw_torch_npu_fused"``)."""
import torch

__all__ = ["NpuFusedAdamW"]


class NpuFusedAdamW(torch.optim.AdamW):
    """AdamW as one fused multi-tensor kernel per step on the npu (``_fused_adamw_``).

    The same arguments and results as ``torch.optim.AdamW``; only ``fused`` is fixed.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, capturable=False, differentiable=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, capturable=capturable, differentiable=differentiable, fused=True)
