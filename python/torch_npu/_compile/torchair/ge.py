"""torchair.ge: the names of the adapter's GE graph-building API, for code that defines GE
converters at import (MindSpeed's op builders).

On the chip, max-autotune converts each FX node to GE operators through converters
registered with ``register_fx_node_ge_converter``. This project compiles max-autotune with
inductor, which calls each op's own kernel: converters are accepted (with a warning) and
never needed, and building GE operators is refused by name.
"""
import enum

__all__ = ["Tensor", "TensorSpec", "DataType", "Format", "custom_op", "Const", "Cast", "Fill"]

_REFUSED = ("torchair.ge.{name}: building GE graph operators needs the chip's graph engine (GE), which this project "
            "does not have; its max-autotune compiles with inductor and runs the op's own kernel, so a GE converter "
            "is never called")


class DataType(enum.IntEnum):
    """GE's data types (ge::DataType's codes)."""
    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_INT8 = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 6
    DT_UINT16 = 7
    DT_UINT32 = 8
    DT_INT64 = 9
    DT_UINT64 = 10
    DT_DOUBLE = 11
    DT_BOOL = 12
    DT_STRING = 13
    DT_COMPLEX64 = 16
    DT_COMPLEX128 = 17
    DT_BF16 = 27
    DT_INT4 = 29


class Format(enum.IntEnum):
    """GE's tensor formats (the ones torch_npu.Format also names)."""
    FORMAT_NCHW = 0
    FORMAT_NHWC = 1
    FORMAT_ND = 2
    FORMAT_NC1HWC0 = 3
    FORMAT_FRACTAL_Z = 4
    FORMAT_FRACTAL_NZ = 29


class Tensor:
    """A GE graph tensor (a type for converters' annotations; never built here)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(_REFUSED.format(name="Tensor"))


class TensorSpec:
    """A GE tensor's meta (a type for converters' annotations; never built here)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(_REFUSED.format(name="TensorSpec"))


def _refused(name):
    def refuse(*args, **kwargs):
        raise RuntimeError(_REFUSED.format(name=name))
    refuse.__name__ = name
    return refuse


custom_op = _refused("custom_op")
Const = _refused("Const")
Cast = _refused("Cast")
Fill = _refused("Fill")
