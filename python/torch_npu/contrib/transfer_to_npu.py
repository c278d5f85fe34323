"""``import torch_npu.contrib.transfer_to_npu``: a script written for CUDA runs
on the npu unchanged.

After the import, ``"cuda"`` / ``"cuda:N"`` / ``torch.device("cuda")`` mean the
npu wherever a device is given: factory functions (every one ``with
torch.device(...)`` applies to, the ``*_like`` ones, ``torch.fft.fftfreq``, the
sparse ones), ``Tensor.to``, ``Module.to``/``to_empty``, ``torch.load``'s
``map_location``, the ``new_*`` methods, ``with torch.device("cuda")`` and
``torch.set_default_device("cuda")``, ``torch.Generator``/``torch.Stream``/
``torch.Event``, ``torch.get_device_module``, and every torch.npu (so torch.cuda)
function or class that takes a device. ``.cuda()`` is ``.npu()``;
``torch.cuda.*`` (devices, streams, events, memory, random) is ``torch.npu.*``;
``ProfilerActivity.CUDA`` asks torch.profiler for the npu;
``torch.autocast("cuda")``, ``torch.amp.GradScaler("cuda")`` and torch.cuda.amp's
``autocast``/``GradScaler`` are the npu's mixed precision; the "nccl" backend
(``init_process_group("nccl")``, ``"cpu:gloo,cuda:nccl"``) is the npu's "hccl",
and ``torch.distributed.ProcessGroupNCCL`` its backend class.
Code that inspects ``tensor.device.type`` sees ``"npu"``.

PyTorch's compiler (dynamo, inductor) and torch.cuda's own code still see CUDA's
torch.cuda functions: they ask about CUDA, not about the device a script means.

Every change goes through :mod:`torch_npu._patches` in the group
``"transfer_to_npu"``: ``torch_npu._patches.undo("transfer_to_npu")`` takes them
all back.
"""
import functools
import sys
import types

import torch
import torch.profiler
import torch.utils._device

import torch_npu  # noqa: F401  (registers the npu device)
from torch_npu import _patches

GROUP = "transfer_to_npu"

# Functions that take a device besides PyTorch's own list of device constructors
# (torch.utils._device._device_constructors, what `with torch.device(...)` applies to).
_MORE_DEVICE_FUNCTIONS = (
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
    "normal", "load", "from_file", "get_device_module",
)
_DEVICE_METHODS = {
    torch.Tensor: ("to", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "new_tensor"),
    torch.nn.Module: ("to", "to_empty"),
}
# Where PyTorch's device constructors live (torch.fft.fftfreq, torch.nested.nested_tensor).
_CONSTRUCTOR_MODULES = (torch, torch.fft, torch.nested, torch.sparse)
# Code that asks torch.cuda about CUDA itself keeps CUDA's answers: torch.cuda's
# own functions (they call one another through the module's namespace, where the
# npu's now are), inductor (its cache key reads torch.cuda.get_device_properties(),
# its passes check torch.cuda.is_available()), triton's checks and dynamo's CUDA
# device interface. Dynamo's tracer is not among them: it calls torch.cuda.* for
# the script it traces (constant folding).
_MODULES_ASKING_ABOUT_CUDA = ("torch.cuda.", "torch._inductor.", "torch.utils._triton.",
                              "torch._dynamo.device_interface.")


def _patch(owner, name, value):
    return _patches.patch(owner, name, value, GROUP)


def _wrap(owner, name, make):
    return _patches.wrap(owner, name, make, GROUP)


def _to_npu(device):
    """The npu device for a CUDA device; anything else unchanged."""
    if isinstance(device, str) and (device == "cuda" or device.startswith("cuda:")):
        return "npu" + device[len("cuda"):]
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("npu", device.index) if device.index is not None else torch.device("npu")
    return device


def _redirect_devices(fn):
    @functools.wraps(fn)
    def redirected(*args, **kwargs):
        for key in ("device", "map_location"):
            if key in kwargs:
                kwargs[key] = _to_npu(kwargs[key])
        return fn(*(_to_npu(a) for a in args), **kwargs)

    # TorchScript compiles a builtin from its function object: the wrapper
    # compiles to the same aten op (scripted code gives devices explicitly).
    builtin = torch.jit._builtins._find_builtin(fn)
    if builtin is not None:
        _patch(torch.jit._builtins._get_builtin_table(), id(redirected), builtin)
    return redirected


def _redirect_device_arguments():
    """Factories, ``to`` and the other callables that take a device take "cuda" to mean the npu.
    Returns the wrappers of PyTorch's device constructors."""
    constructors = set(_pytorch_device_constructors())
    wrappers = []
    for module in _CONSTRUCTOR_MODULES:
        for name, value in list(vars(module).items()):
            if _is_in(value, constructors):
                wrappers.append(_wrap(module, name, _redirect_devices))
    for name in _MORE_DEVICE_FUNCTIONS:
        _wrap(torch, name, _redirect_devices)
    for owner, names in _DEVICE_METHODS.items():
        for name in names:
            _wrap(owner, name, _redirect_devices)
    return wrappers


def _is_in(value, functions):
    try:
        return value in functions
    except TypeError:  # unhashable
        return False


def _pytorch_device_constructors():
    # PyTorch's own function, its cache filled before any factory is wrapped: the original functions.
    return _patches.original(torch.utils._device, "_device_constructors")()


def _device_context_means_the_npu(wrappers):
    """``with torch.device(d)`` and ``torch.set_default_device(d)``: factories make tensors on d,
    and "cuda" means the npu."""
    # The device context recognises factories by their function objects: the
    # originals (what C++ passes to __torch_function__) and the wrappers (what
    # Python code that hands itself to the mode passes) alike.
    known = frozenset(_pytorch_device_constructors()) | frozenset(wrappers)

    def _device_constructors():
        return known

    _patch(torch.utils._device, "_device_constructors", _device_constructors)

    def mapping_the_device(init):
        @functools.wraps(init)
        def __init__(self, device):
            init(self, _to_npu(device))
        return __init__

    _wrap(torch.utils._device.DeviceContext, "__init__", mapping_the_device)


def _cuda_method(npu_method):
    @functools.wraps(npu_method)
    def cuda(self, device=None, *args, **kwargs):
        return npu_method(self, _to_npu(device), *args, **kwargs)
    return cuda


def _device_index_helpers_take_cuda():
    """torch.npu's functions and classes (torch.cuda's now) and torch.accelerator's that take a
    device take a cuda device: each family finds a device's index with one helper."""
    from torch_npu.npu import _device
    import torch.accelerator._utils

    _helper_takes_cuda(_device, "_get_device_index", "torch_npu.")
    _helper_takes_cuda(torch.accelerator._utils, "_get_device_index", "torch.accelerator.")


def _helper_takes_cuda(home, name, package):
    """``home.name`` and every copy of it imported by name into the modules of ``package``
    map a cuda device to the npu first."""
    helper = _patches.original(home, name)

    @functools.wraps(helper)
    def taking_cuda(device, *args, **kwargs):
        return helper(_to_npu(device), *args, **kwargs)

    for module in list(sys.modules.values()):
        if ((getattr(module, "__name__", "") + ".").startswith(package)
                and getattr(module, "__dict__", {}).get(name) is helper):
            _patch(module, name, taking_cuda)


def _class_taking_cuda(torch_class):
    """A stand-in for ``torch_class`` (torch.Generator, torch.Stream, torch.Event) whose
    constructor takes "cuda" to mean the npu."""

    class StandInType(type(torch_class)):
        # Objects made anywhere (torch.default_generator, torch.npu.Stream) are still
        # torch_class's instances to isinstance().
        def __instancecheck__(cls, obj):
            return isinstance(obj, torch_class)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, torch_class)

    def __new__(cls, *args, **kwargs):
        if args:
            args = (_to_npu(args[0]),) + args[1:]
        elif "device" in kwargs:
            kwargs["device"] = _to_npu(kwargs["device"])
        return torch_class.__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        pass  # __new__ made it

    namespace = {"__new__": __new__, "__init__": __init__, "__doc__": torch_class.__doc__,
                 "__module__": torch_class.__module__, "__qualname__": torch_class.__qualname__}
    return StandInType(torch_class.__name__, (torch_class,), namespace)


def _npu_for_scripts_cuda_for_pytorch(npu_function, cuda_function):
    @functools.wraps(npu_function)
    def chosen(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if (caller + ".").startswith(_MODULES_ASKING_ABOUT_CUDA):
            return cuda_function(*args, **kwargs)
        return npu_function(*args, **kwargs)
    return chosen


def _redirect_torch_cuda():
    """torch.cuda's public names that torch.npu has become torch.npu's (its functions
    for all but the code that asks about CUDA itself)."""
    for name in dir(torch.npu):
        if name.startswith("_") or name in ("torch", "amp") or not hasattr(torch.cuda, name):
            continue
        npu_value = getattr(torch.npu, name)
        if isinstance(npu_value, types.FunctionType):
            _wrap(torch.cuda, name,
                  lambda cuda_function, npu_function=npu_value:
                  _npu_for_scripts_cuda_for_pytorch(npu_function, cuda_function))
        else:
            _wrap(torch.cuda, name, lambda _, npu_value=npu_value: npu_value)


def _redirect_profiler_activities():
    def mapping_cuda(original):
        @functools.wraps(original)
        def __init__(self, *args, activities=None, **kwargs):
            if activities is not None:
                activities = [torch.profiler.ProfilerActivity.PrivateUse1
                              if a == torch.profiler.ProfilerActivity.CUDA else a for a in activities]
            original(self, *args, activities=activities, **kwargs)
        return __init__

    _wrap(torch.profiler.profile, "__init__", mapping_cuda)


def _redirect_device_type_argument(cls, default=None):
    """``cls(device_type, ...)`` with "cuda" means "npu" (autocast, GradScaler); with
    no device given, ``default`` (when set) is passed."""
    def mapping_cuda(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            if "device_type" in kwargs:
                kwargs["device_type"] = _to_npu(kwargs["device_type"])
            elif "device" in kwargs:
                kwargs["device"] = _to_npu(kwargs["device"])
            elif args:
                args = (_to_npu(args[0]),) + args[1:]
            elif default is not None:
                kwargs["device"] = default
            original(self, *args, **kwargs)
        return __init__

    _wrap(cls, "__init__", mapping_cuda)


def _redirect_amp():
    _redirect_device_type_argument(torch.amp.autocast_mode.autocast)
    _redirect_device_type_argument(torch.amp.GradScaler, default="npu")   # GradScaler()'s default is "cuda"
    for name in ("autocast", "GradScaler", "custom_fwd", "custom_bwd"):
        _patch(torch.cuda.amp, name, getattr(torch.npu.amp, name))


def _to_hccl(backend):
    """"nccl" -> "hccl", "cpu:gloo,cuda:nccl" -> "cpu:gloo,npu:hccl"; anything else unchanged."""
    if not isinstance(backend, str):
        return backend
    pairs = []
    for part in backend.split(","):
        device, sep, name = part.rpartition(":")
        name = "hccl" if name.strip().lower() == "nccl" else name
        device = "npu" if device.strip().lower() == "cuda" else device
        pairs.append(f"{device}{sep}{name}")
    return ",".join(pairs)


def _redirect_nccl():
    import torch.distributed as dist
    if not dist.is_available():
        return
    import torch_npu.distributed
    c10d = dist.distributed_c10d
    for name, position in (("init_process_group", 0), ("new_group", 2)):
        def mapping_nccl(original, position=position):
            @functools.wraps(original)
            def redirected(*args, **kwargs):
                if "backend" in kwargs:
                    kwargs["backend"] = _to_hccl(kwargs["backend"])
                elif len(args) > position:
                    args = args[:position] + (_to_hccl(args[position]),) + args[position + 1:]
                if "device_id" in kwargs:
                    kwargs["device_id"] = _to_npu(kwargs["device_id"])
                return original(*args, **kwargs)
            return redirected

        wrapper = _wrap(c10d, name, mapping_nccl)
        _patch(dist, name, wrapper)
    _patch(dist, "is_nccl_available", lambda: True)
    # NCCL's backend class: isinstance() checks, Options, construction.
    _patch(dist, "ProcessGroupNCCL", torch_npu.distributed.ProcessGroupHCCL)
    _wrap(dist.ProcessGroup, "_get_backend", _redirect_devices)   # pg._get_backend(torch.device("cuda"))


def apply():
    """Installs the redirections (done at import; calling it again is harmless)."""
    _device_context_means_the_npu(_redirect_device_arguments())
    _wrap(torch.Tensor, "cuda", lambda _: _cuda_method(torch.Tensor.npu))
    _wrap(torch.nn.Module, "cuda", lambda _: _cuda_method(torch.nn.Module.npu))
    for name in ("Generator", "Stream", "Event"):
        _wrap(torch, name, _class_taking_cuda)
    _device_index_helpers_take_cuda()
    _redirect_torch_cuda()
    _redirect_profiler_activities()
    _redirect_amp()
    _redirect_nccl()


apply()
