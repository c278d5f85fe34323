"""torchair: the Ascend adapter's graph-mode package, on this project's compile paths.

``import torchair`` works once torch_npu is loaded (``torch_npu._compile._ascend_modules``
puts the name in ``sys.modules``; this package is its code):

    config = torchair.CompilerConfig()
    config.mode = "reduce-overhead"          # or "max-autotune" (default), "npugraph_ex"
    model = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config))

"max-autotune" compiles with the "npu" backend (the fused-op pass, then inductor: on the chip,
GE); "reduce-overhead" and "npugraph_ex" capture AOTAutograd's graphs as npu graphs (on the
chip, aclgraphs). Options this project cannot honour warn, naming what they do on the chip.
"""
import logging
import warnings

from . import configs, ge  # noqa: F401
from ..npugraph_ex._patterns import register_replacement
from .configs.compiler_config import CompilerConfig
from .npu_fx_compiler import get_compiler, get_npu_backend
from . import npu_fx_compiler  # noqa: F401

__all__ = ["get_compiler", "get_npu_backend", "dynamo_export", "CompilerConfig", "use_internal_format_weight",
           "logger", "register_fx_node_ge_converter", "patch_for_hcom", "register_replacement",
           "npu_format_cast_via_cpu"]

logger = logging.getLogger("torchair")

_GE_CONVERTERS = {}   # op -> the converter code registered for it (kept; never called here)


def register_fx_node_ge_converter(aten_op):
    """Accepts a GE converter for ``aten_op`` (a decorator) with a warning: on the chip,
    max-autotune calls it to turn the op into GE operators; here inductor runs the op's own kernel."""
    def register(converter):
        if not _GE_CONVERTERS:
            warnings.warn("torchair.register_fx_node_ge_converter: GE converters are accepted but not used on this "
                          "device; on the chip, max-autotune calls them to build the GE graph, here inductor "
                          "compiles max-autotune and calls each op's own kernel", UserWarning, stacklevel=2)
        _GE_CONVERTERS[aten_op] = converter
        return converter
    return register


def dynamo_export(*args, **kwargs):
    """Refused: on the chip it writes an offline GE model (.air) of the traced graph."""
    raise RuntimeError("torchair.dynamo_export: exporting an offline GE model (.air) needs the chip's graph engine "
                       "(GE), which this project does not have; torch.export.export works on npu models")


def patch_for_hcom():
    """Nothing to do: PyTorch >= 2.3.1 traces the collectives itself (the adapter says the same)."""
    logger.warning("For versions 2.3.1 and above of PyTorch, there is no need to call patch_for_hcom anymore.")


def use_internal_format_weight(model):
    """Accepted with a warning: on the chip it casts the model's weights to the matmul and
    convolution kernels' internal formats (FRACTAL_NZ, ...) once, before the graph runs."""
    warnings.warn("torchair.use_internal_format_weight: on the chip it casts the weights to the kernels' internal "
                  "formats (FRACTAL_NZ, ...) once; the emulated device's kernels read the ND layout, so the weights "
                  "stay as they are", UserWarning, stacklevel=2)
    return model


def npu_format_cast_via_cpu(tensor, acl_format):
    """``torch_npu.npu_format_cast`` of ``tensor`` (the adapter casts on the cpu to save device memory)."""
    from ...ops.formats import npu_format_cast
    return npu_format_cast(tensor, acl_format)
