"""torchair's ``get_npu_backend`` and ``get_compiler``: npugraph_ex's compiler with torchair's
nested ``CompilerConfig`` (its ``mode`` picks the compile path: max-autotune -> the "npu"
backend, reduce-overhead / npugraph_ex -> npu graphs)."""
import functools

from ..npugraph_ex import npu_fx_compiler as _compiler
from .configs.compiler_config import CompilerConfig

__all__ = ["get_npu_backend", "get_compiler"]


def get_compiler(compiler_config=None):
    """The FX compiler alone (AOTAutograd's per-graph compiler)."""
    return _compiler._NpuFxCompiler(compiler_config if compiler_config is not None else CompilerConfig())


def get_npu_backend(*, compiler_config=None, custom_decompositions={}):  # noqa: B006  (the adapter's signature)
    """The dynamo backend for ``compiler_config`` (a fresh ``CompilerConfig()``, mode
    max-autotune, when None): ``torch.compile(model, backend=torchair.get_npu_backend(...))``."""
    if compiler_config is None:
        compiler_config = CompilerConfig()
    return functools.partial(_compiler._npu_backend, compiler_config=compiler_config,
                             decompositions=dict(custom_decompositions or {}))
