"""torch.compile on the npu.

Inductor generates C++ kernels for the npu (its CPU code generator: the emulated
npu's memory is host-addressable) and a Python wrapper that launches them in
stream order with eager work. Nothing here is imported with torch_npu: dynamo
and inductor are heavy, so the registrations happen when PyTorch loads them
(``install()`` puts import hooks in place):

* ``torch._dynamo.device_interface``: the npu's ``DeviceInterface``;
* ``torch._inductor.compile_fx``: ``_codegen.register_backend()`` registers the
  npu's scheduling and wrappers (``register_backend_for_device``, with a pass whose
  uuid versions inductor's cache, so code cached by another torch_npu is never
  loaded) and teaches inductor that the npu is served by its C++ backend.
  Inductor's own registration, which reads ``torch.npu.Scheduling`` and the
  wrappers (``torch_npu.npu.__getattr__`` loads them from ``_codegen``), finds them
  too when it runs first.

``torch.compile(model, backend="npu")`` (``backend.py``) adds graph passes that
put the fused npu ops in place of their compositions; ``torch_npu.compile``
falls back to eager when compilation fails.

Every change to dynamo's and inductor's own objects goes through
:mod:`torch_npu._patches` in the group ``"compile"``:
``torch_npu._patches.undo("compile")`` takes them back (the registrations made
through PyTorch's APIs, the device interface, the "npu" backend and inductor's
device backend, stay).
"""
import importlib.abc
import importlib.util
import sys

GROUP = "compile"   # the torch_npu._patches group of every change made here

_HOOKED = {  # PyTorch's module -> (ours, the function to run once it executed)
    "torch._dynamo.device_interface": ("torch_npu._compile._device_interface", "register"),
    "torch._dynamo.backends.registry": ("torch_npu._compile.backend", "register"),
    # Before inductor compiles (and computes a cache key) anything.
    "torch._inductor.compile_fx": ("torch_npu._compile._codegen", "register_backend"),
}


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``register()`` of our module right after PyTorch's module is executed."""

    def find_spec(self, name, path=None, target=None):
        ours = _HOOKED.get(name)
        if ours is None:
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
            _run(ours)

        loader.exec_module = exec_module
        return spec


def _run(ours):
    module, function = ours
    getattr(importlib.import_module(module), function)()


def install():
    """Registers the npu with dynamo and inductor now if they are loaded, else when they load."""
    for theirs, ours in _HOOKED.items():
        if theirs in sys.modules:
            _run(ours)
    if not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
