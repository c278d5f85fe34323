"""torch.npu.amp: as torch.cuda.amp, for the npu (accelerate creates its scaler here).

``autocast`` is ``torch.autocast("npu", ...)``; what it casts is registered in C++
(csrc/amp: CUDA's op lists and policies). ``GradScaler`` is
``torch.amp.GradScaler("npu", ...)``.
"""
import functools

import torch

__all__ = ["GradScaler", "amp_definitely_not_available", "autocast", "custom_bwd", "custom_fwd"]


def amp_definitely_not_available() -> bool:
    """Whether autocast on the npu cannot work here (torch.cuda.amp's question): no npu."""
    return not torch.npu.is_available()


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801  (torch.cuda.amp's name)
    """``torch.npu.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True)``:
    ``torch.autocast("npu", ...)`` under the name torch.cuda.amp users know."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="npu")
custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="npu")


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("npu", ...)``: scales the loss, unscales and checks
    gradients for inf/NaN on the npu (``_amp_foreach_non_finite_check_and_unscale_``)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
