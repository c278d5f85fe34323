"""torch.npu.amp: as torch.cuda.amp, for the npu (accelerate creates its scaler here)."""
import torch

__all__ = ["GradScaler"]


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("npu", ...)``: scales the loss, unscales and checks
    gradients for inf/NaN on the npu (``_amp_foreach_non_finite_check_and_unscale_``)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
