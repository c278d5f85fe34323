"""``torch_npu.HiFloat8Tensor``: a tensor whose values are stored in HiFloat8 (HiF8), Huawei's
8-bit tapered-precision float, one uint8 per element (``._data``), and that behaves as a tensor of
its nominal dtype (float32, float16 or bfloat16): every op dequantises it first. As the Ascend
adapter's ``torch_npu.utils.hif8_tensor._HiFloat8Tensor``; MindSpeed's quantized AdamW stores its
moments with ``HiFloat8Tensor.to_hifloat8(x)``.

The encoding (sign, prefix-coded dot field, sign-magnitude exponent, 1 to 3 mantissa bits; largest
finite 32768; round to nearest, ties away from zero) and the casts are C++:
``torch_npu._C._cd.cast_to_fp8`` / ``cast_from_fp8`` (``csrc/ops/fused/custom_dtype.h``).
"""
import torch
from torch.utils._pytree import tree_map

from torch_npu import _C

__all__ = ["HiFloat8Tensor"]

_HIF8 = _C._cd.DType.hifloat8
_NOMINAL = (torch.float32, torch.float16, torch.bfloat16)
_CODE = {t: code for _, code, t in _C._cd._names() if t is not None}   # torch.float32 -> 256, ...


def _encode(x: torch.Tensor) -> torch.Tensor:
    if x.dtype not in _NOMINAL:
        x = x.float()
    return _C._cd.cast_to_fp8(x, _HIF8)


def _decode(data: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _C._cd.cast_from_fp8(data, _HIF8, _CODE[dtype])


class _ToHiFloat8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        dtype = tensor.dtype if tensor.dtype in _NOMINAL else torch.float32
        return HiFloat8Tensor(data=_encode(tensor.detach()), dtype=dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad   # the gradient passes through the rounding


class _FromHiFloat8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dtype):
        return _decode(tensor._data, dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class HiFloat8Tensor(torch.Tensor):
    """``HiFloat8Tensor(data=uint8_tensor, dtype=torch.float32)``: ``data`` holds HiF8 codes."""

    @staticmethod
    def __new__(cls, *, data: torch.Tensor, dtype: torch.dtype = torch.float32):
        if not isinstance(data, torch.Tensor) or data.element_size() != 1:
            raise ValueError("HiFloat8Tensor: data must be a tensor of 1-byte elements (uint8) holding HiFloat8 codes, "
                             f"got {getattr(data, 'dtype', type(data).__name__)}")
        if dtype not in _NOMINAL:
            raise ValueError(f"HiFloat8Tensor: dtype (the values' nominal dtype) must be float32, float16 or "
                             f"bfloat16, got {dtype}")
        if data.dtype != torch.uint8:
            data = data.view(torch.uint8)
        self = torch.Tensor._make_wrapper_subclass(cls, data.size(), strides=data.stride(),
                                                   storage_offset=data.storage_offset(), dtype=dtype,
                                                   device=data.device, requires_grad=False)
        self._data = data
        return self

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def to_hifloat8(cls, tensor: torch.Tensor) -> "HiFloat8Tensor":
        """``tensor`` rounded to HiFloat8 (its dtype stays the nominal one; others become float32)."""
        if isinstance(tensor, HiFloat8Tensor):
            return tensor
        return _ToHiFloat8.apply(tensor)

    def from_hifloat8(self, dtype: torch.dtype = None) -> torch.Tensor:
        """The values as a plain tensor of ``dtype`` (the nominal dtype by default)."""
        return _FromHiFloat8.apply(self, dtype or self.dtype)

    def float(self):
        return self.from_hifloat8(torch.float32)

    def half(self):
        return self.from_hifloat8(torch.float16)

    def bfloat16(self):
        return self.from_hifloat8(torch.bfloat16)

    def cpu(self):
        return self.from_hifloat8().cpu()

    def make_like(self, data: torch.Tensor) -> "HiFloat8Tensor":
        return HiFloat8Tensor(data=data, dtype=self.dtype)

    def __repr__(self, *, tensor_contents=None):
        return f"HiFloat8Tensor(data={self.from_hifloat8()!r}, dtype={self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func is aten.detach.default:
            return args[0].make_like(args[0]._data.detach())
        if func is aten.clone.default:
            return args[0].make_like(args[0]._data.clone())
        if func in (aten.view.default, aten._unsafe_view.default, aten.slice.Tensor, aten.select.int,
                    aten.t.default, aten.transpose.int, aten.reshape.default, aten.expand.default,
                    aten.permute.default, aten.squeeze.dim, aten.unsqueeze.default):
            return args[0].make_like(func(args[0]._data, *args[1:], **kwargs))
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            if isinstance(dst, HiFloat8Tensor):
                data = src._data if isinstance(src, HiFloat8Tensor) else _encode(src)
                dst._data.copy_(data)
                return dst
            return dst.copy_(_decode(src._data, dst.dtype if dst.dtype in _NOMINAL else torch.float32))
        if func is aten._to_copy.default and kwargs.get("dtype") in (None, args[0].dtype) and \
                kwargs.get("device") is not None:
            return args[0].make_like(args[0]._data.to(kwargs["device"]))

        def plain(x):
            return _decode(x._data, x.dtype) if isinstance(x, HiFloat8Tensor) else x

        return func(*tree_map(plain, args), **tree_map(plain, kwargs))
