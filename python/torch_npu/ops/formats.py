"""Storage formats as the Ascend adapter names them, kept as metadata.

On a real chip an npu tensor's storage may be in a private layout (FRACTAL_NZ for the
cube units, NC1HWC0 for convolutions), chosen with ``torch_npu.npu_format_cast``. The
emulated npu computes in PyTorch's layouts: it records the format a tensor was cast to
and reports it (``get_npu_format``), and results are unchanged. A tensor that was never
cast has its default format: NCHW for 4-dimensional tensors, ND otherwise.
"""
import enum

import torch


class Format(enum.IntEnum):
    """The ACL storage formats (their public aclFormat numbers)."""
    UNDEFINED = -1
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    NC1HWC0_C04 = 12
    HWCN = 16
    NDHWC = 27
    FRACTAL_NZ = 29
    NCDHW = 30
    NDC1HWC0 = 32
    FRACTAL_Z_3D = 33
    NC = 35
    NCL = 47

    def __str__(self):
        return self.name


_ATTRIBUTE = "_npu_storage_format"


def _npu(tensor, op):
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "npu":
        where = tensor.device if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise TypeError(f"torch_npu.{op}: expected an npu tensor, got {where}; move it with .npu() first")


def _format(value, op):
    if isinstance(value, torch.Tensor):
        return get_npu_format(value)
    try:
        return Format(int(value))
    except (TypeError, ValueError):
        raise ValueError(f"torch_npu.{op}: {value!r} is not a storage format; use a torch_npu.Format "
                         f"({', '.join(f.name for f in Format)}) or its number") from None


def get_npu_format(tensor) -> Format:
    """The storage format of ``tensor``: the one it was cast to, else its default."""
    _npu(tensor, "get_npu_format")
    recorded = getattr(tensor, _ATTRIBUTE, None)
    if recorded is not None:
        return recorded
    return Format.NCHW if tensor.dim() == 4 else Format.ND


def _layout_dtype(value, name):
    """``customize_dtype``/``input_dtype``: a torch.dtype or a torch_npu dtype code (torch_npu.bfloat16, ...)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        from torch_npu import _C
        names = {code: n for n, code, _ in _C._cd._names()}
        if value in names or 0 <= value < 256:
            return value
    raise ValueError(f"torch_npu.npu_format_cast: {name} must be a torch.dtype or a torch_npu dtype code "
                     f"(torch_npu.float8_e8m0fnu, ...), got {value!r}")


def npu_format_cast(tensor, acl_format, customize_dtype=None, *, input_dtype=None) -> torch.Tensor:
    """A new tensor with ``tensor``'s values in storage format ``acl_format``. ``customize_dtype`` (the
    dtype the chip lays the private format out for, a torch.dtype or a torch_npu dtype code) and
    ``input_dtype`` are recorded with the format (``_npu_format_dtype``): the values are unchanged,
    as the emulated npu keeps PyTorch's layout."""
    _npu(tensor, "npu_format_cast")
    fmt = _format(acl_format, "npu_format_cast")
    layout = (_layout_dtype(customize_dtype, "customize_dtype"), _layout_dtype(input_dtype, "input_dtype"))
    out = tensor.clone()
    setattr(out, _ATTRIBUTE, fmt)
    if layout != (None, None):
        out._npu_format_dtype = layout
    return out


def npu_format_cast_(tensor, src) -> torch.Tensor:
    """``tensor`` itself, now in ``src``'s format (a Format, its number, or a tensor's)."""
    _npu(tensor, "npu_format_cast_")
    setattr(tensor, _ATTRIBUTE, _format(src, "npu_format_cast_"))
    return tensor
