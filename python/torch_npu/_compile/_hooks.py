"""When dynamo and inductor load, the npu registers with them (see the package's docstring).

``install()`` (at ``import torch_npu``) puts an import hook in place that runs each
registration right after PyTorch's module executes (or now, if it is loaded), and provides
on torch.npu the names inductor's own backend registration reads from a device module.
"""
import importlib.abc
import sys

from .. import npu


def _device_interface():
    from . import _device_interface
    _device_interface.register()


def _backends():
    from . import backend
    from .npugraph_ex import npu_fx_compiler
    backend.register()
    backend.register_name("npugraph_ex", npu_fx_compiler._npugraph_ex_backend)   # torchair's capture backend


def _inductor_backend():
    from . import _codegen
    _codegen.register_backend()


_HOOKED = {  # PyTorch's module -> what to run once it executed
    "torch._dynamo.device_interface": _device_interface,
    "torch._dynamo.backends.registry": _backends,
    # Before inductor compiles (and computes a cache key) anything.
    "torch._inductor.compile_fx": _inductor_backend,
}


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Runs a registration right after PyTorch's module is executed."""

    def find_spec(self, name, path=None, target=None):
        register = _HOOKED.get(name)
        if register is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            register()

        loader.exec_module = exec_module
        return spec


# Inductor's backend registration reads these from the device module (torch.npu) when it
# first compiles: loaded then, from _codegen, not at import (inductor is heavy).
_INDUCTOR_NAMES = {
    "Scheduling": "Scheduling",
    "PythonWrapperCodegen": "NpuWrapperCodegen",
    "CppWrapperCodegen": "NpuCppWrapperCodegen",
    "WrapperFxCodegen": "WrapperFxCodegen",
}


def _inductor_name(name):
    from . import _codegen
    _codegen.register()
    return getattr(_codegen, _INDUCTOR_NAMES[name])


def install():
    """Registers the npu with dynamo and inductor now if they are loaded, else when they load,
    and provides the Ascend adapter's top-level modules torchair and npugraph_ex (lazily)."""
    from . import _ascend_modules
    _ascend_modules.install()
    for name in _INDUCTOR_NAMES:
        npu._provide(name, _inductor_name)
    for theirs, register in _HOOKED.items():
        if theirs in sys.modules:
            register()
    if not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
