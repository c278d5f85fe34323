"""The top-level modules ``torchair`` and ``npugraph_ex``, as the Ascend adapter provides them.

The adapter's wheel carries both packages inside torch_npu and puts a lazy stand-in for each
into ``sys.modules`` when torch_npu loads, so ``import torchair`` works with no package of
that name installed (and, through torch's autoload entry point, in a fresh interpreter).
Here too: ``install()`` (at ``import torch_npu``, from ``_hooks``) puts a ``_LazyModule``
under each name, which imports the real package (``torch_npu._compile.torchair``,
``torch_npu._compile.npugraph_ex``) at the first attribute read and then stands aside
(``sys.modules`` gets the package itself). A finder makes submodules
(``torchair.configs.compiler_config``, ``npugraph_ex.npu_fx_compiler``) the very module
objects of the real package, so patching one patches what the compiler uses.

A name already in ``sys.modules`` is left alone.
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

ALIASES = {   # the adapter's top-level name -> this package's module
    "torchair": "torch_npu._compile.torchair",
    "npugraph_ex": "torch_npu._compile.npugraph_ex",
}


def _load(alias):
    return importlib.import_module(ALIASES[alias])


class _AliasLoader(importlib.abc.Loader):
    """Gives an alias the real module object (not a second copy of its code)."""

    def __init__(self, real_name):
        self.real_name = real_name
        self.real_spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.real_name)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.real_spec   # the import system set the alias's spec; the module keeps its own


class _AliasFinder(importlib.abc.MetaPathFinder):
    """``torchair.x.y`` -> ``torch_npu._compile.torchair.x.y`` (the same module object)."""

    def find_spec(self, name, path=None, target=None):
        top, _, rest = name.partition(".")
        if top not in ALIASES:
            return None
        real_name = ALIASES[top] + ("." + rest if rest else "")
        if real_name not in sys.modules:
            try:
                if importlib.util.find_spec(real_name) is None:
                    return None
            except ModuleNotFoundError:
                return None
        return importlib.machinery.ModuleSpec(name, _AliasLoader(real_name), is_package=True)


class _LazyModule(types.ModuleType):
    """``sys.modules[alias]`` until the package is first used: an attribute read imports it."""

    def __init__(self, alias):
        super().__init__(alias)
        self.__path__ = []
        self.__spec__ = importlib.machinery.ModuleSpec(alias, _AliasLoader(ALIASES[alias]), is_package=True)
        self.__lazy_target__ = ALIASES[alias]

    def __getattr__(self, name):
        if (name.startswith("__") and name.endswith("__") and name != "__all__"
                and self.__lazy_target__ not in sys.modules):
            raise AttributeError(name)   # tools scanning sys.modules (inspect, warnings) do not load the package
        real = importlib.import_module(self.__lazy_target__)
        if sys.modules.get(self.__name__) is self:
            sys.modules[self.__name__] = real
        return getattr(real, name)

    def __dir__(self):
        return dir(importlib.import_module(self.__lazy_target__))


def install():
    """Puts the lazy modules in ``sys.modules`` and the alias finder on ``sys.meta_path``."""
    for alias in ALIASES:
        if alias not in sys.modules:
            sys.modules[alias] = _LazyModule(alias)
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
