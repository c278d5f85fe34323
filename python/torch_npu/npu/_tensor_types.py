"""The legacy typed tensor classes, torch.npu.FloatTensor & co., as torch.cuda's.

``torch.npu.FloatTensor(2, 3)`` makes an uninitialised npu float tensor,
``torch.npu.FloatTensor([1, 2])`` one from data, and ``isinstance(t,
torch.npu.FloatTensor)`` holds for a strided float32 npu tensor, as
``t.type()`` says "torch.npu.FloatTensor".
"""
import torch

_TYPES = {
    "DoubleTensor": torch.float64, "FloatTensor": torch.float32, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "LongTensor": torch.int64, "IntTensor": torch.int32,
    "ShortTensor": torch.int16, "CharTensor": torch.int8, "ByteTensor": torch.uint8, "BoolTensor": torch.bool,
}


class _NPUTensorType(type):
    """The metaclass: instance checks and the legacy constructor."""

    def __instancecheck__(cls, obj):
        return (isinstance(obj, torch.Tensor) and obj.device.type == "npu" and obj.dtype == cls.dtype
                and obj.layout == torch.strided)

    def __call__(cls, *args, device=None):
        device = _npu_device(cls, device)
        if len(args) == 1 and not isinstance(args[0], (int, torch.SymInt)):
            data = args[0]
            if isinstance(data, torch.Size):
                return torch.empty(data, dtype=cls.dtype, device=device)
            if isinstance(data, torch.Tensor):
                return data.to(device=device, dtype=cls.dtype)
            return torch.tensor(data, dtype=cls.dtype, device=device)
        if not all(isinstance(a, (int, torch.SymInt)) for a in args):
            raise TypeError(f"torch.npu.{cls.__name__}(): expected sizes (ints), a torch.Size, a sequence of data or "
                            f"a tensor, got {tuple(type(a).__name__ for a in args)}")
        return torch.empty(args, dtype=cls.dtype, device=device)


def _npu_device(cls, device):
    if device is None:
        return torch.device("npu")
    device = torch.device("npu", device) if isinstance(device, int) else torch.device(device)
    if device.type != "npu":
        raise ValueError(f"torch.npu.{cls.__name__}: device must be an npu device, got {device}")
    return device


def _make(name, dtype):
    # Its C-level name is the full "torch.npu.FloatTensor", as for torch.cuda's types:
    # tensor.type(torch.npu.FloatTensor) converts by that name.
    return _NPUTensorType(f"torch.npu.{name}", (), {
        "dtype": dtype, "is_cuda": False, "is_sparse": False, "__module__": "torch.npu", "__qualname__": name,
        "__doc__": f"npu tensors of {dtype} (the legacy type; use torch.empty(..., dtype={dtype}, device='npu'))"})


globals().update({name: _make(name, dtype) for name, dtype in _TYPES.items()})
__all__ = list(_TYPES)
