"""npugraph_ex: the Ascend adapter's graph-capture backend, on this project's npu graphs.

``import npugraph_ex`` works once torch_npu is loaded (``torch_npu._compile._ascend_modules``
puts the name in ``sys.modules``; this package is its code). ``torch.compile(model,
backend="npugraph_ex", options={...})`` or ``npugraph_ex.get_npu_backend(compiler_config=
npugraph_ex.CompilerConfig())``: AOTAutograd's graphs, after the FX passes, captured as npu
graphs and replayed (``npu_fx_compiler``).
"""
import logging

from . import configs  # noqa: F401
from ._patterns import register_replacement
from .configs.compiler_config import CompilerConfig
from .npu_fx_compiler import compile_fx, get_compiler, get_npu_backend
from . import npu_fx_compiler  # noqa: F401

__all__ = ["get_npu_backend", "get_compiler", "compile_fx", "CompilerConfig", "logger", "register_replacement"]

logger = logging.getLogger("npugraph_ex")
