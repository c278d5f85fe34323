"""``import torch_npu.contrib.transfer_to_npu``: a script written for CUDA runs
on the npu unchanged.

After the import, ``"cuda"`` / ``"cuda:N"`` / ``torch.device("cuda")`` given as
a device to factory functions, ``Tensor.to``, ``Module.to``, ``torch.load``'s
``map_location`` and the ``new_*`` methods mean the npu; ``.cuda()`` is
``.npu()``; ``torch.Generator(device="cuda")`` is an npu generator; ``torch.cuda.*`` (devices, streams, events, memory, random) is
``torch.npu.*``; ``ProfilerActivity.CUDA`` asks torch.profiler for the npu;
``torch.autocast("cuda")``, ``torch.amp.GradScaler("cuda")`` and torch.cuda.amp's
``autocast``/``GradScaler`` are the npu's mixed precision; the "nccl"
backend (``init_process_group("nccl")``, ``"cpu:gloo,cuda:nccl"``) is the
npu's "hccl".
Code that inspects ``tensor.device.type`` sees ``"npu"``.
"""
import functools

import torch
import torch.profiler

import torch_npu  # noqa: F401  (registers the npu device)

_FACTORIES = (
    "tensor", "as_tensor", "asarray", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
    "randperm", "arange", "range", "linspace", "logspace", "eye", "empty_strided", "zeros_like",
    "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "normal",
    "tril_indices", "triu_indices", "scalar_tensor", "sparse_coo_tensor", "load",
)
_TENSOR_METHODS = ("to", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor")


def _to_npu(device):
    """The npu device for a CUDA device; anything else unchanged."""
    if isinstance(device, str) and (device == "cuda" or device.startswith("cuda:")):
        return "npu" + device[len("cuda"):]
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("npu", device.index) if device.index is not None else torch.device("npu")
    return device


def _redirect_devices(fn):
    if getattr(fn, "_transfer_to_npu", False):
        return fn

    @functools.wraps(fn)
    def redirected(*args, **kwargs):
        for key in ("device", "map_location"):
            if key in kwargs:
                kwargs[key] = _to_npu(kwargs[key])
        return fn(*(_to_npu(a) for a in args), **kwargs)

    redirected._transfer_to_npu = True
    # TorchScript compiles a builtin from its function object: the wrapper
    # compiles to the same aten op (scripted code gives devices explicitly).
    builtin = torch.jit._builtins._find_builtin(fn)
    if builtin is not None:
        torch.jit._builtins._register_builtin(redirected, builtin)
    return redirected


def _cuda_method(npu_method):
    @functools.wraps(npu_method)
    def cuda(self, device=None, *args, **kwargs):
        return npu_method(self, _to_npu(device), *args, **kwargs)

    cuda._transfer_to_npu = True
    return cuda


def _redirect_torch_cuda():
    """torch.cuda's public names that torch.npu has become torch.npu's."""
    for name in dir(torch.npu):
        if not name.startswith("_") and hasattr(torch.cuda, name) and name not in ("torch", "amp"):
            setattr(torch.cuda, name, getattr(torch.npu, name))


class _GeneratorType(type(torch.Generator)):
    # Every generator, however made, is still a torch.Generator to isinstance().
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, torch._C.Generator)


class _Generator(torch._C.Generator, metaclass=_GeneratorType):
    """torch.Generator(device="cuda") makes an npu generator."""

    _transfer_to_npu = True

    def __new__(cls, device="cpu"):
        return super().__new__(cls, _to_npu(device))

    def __init__(self, device="cpu"):
        pass


def _redirect_profiler_activities():
    original = torch.profiler.profile.__init__
    if getattr(original, "_transfer_to_npu", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, activities=None, **kwargs):
        if activities is not None:
            activities = [torch.profiler.ProfilerActivity.PrivateUse1
                          if a == torch.profiler.ProfilerActivity.CUDA else a for a in activities]
        original(self, *args, activities=activities, **kwargs)

    __init__._transfer_to_npu = True
    torch.profiler.profile.__init__ = __init__


def _redirect_device_type_argument(cls, default=None):
    """``cls(device_type, ...)`` with "cuda" means "npu" (autocast, GradScaler); with
    no device given, ``default`` (when set) is passed."""
    original = cls.__init__
    if getattr(original, "_transfer_to_npu", False):
        return

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

    __init__._transfer_to_npu = True
    cls.__init__ = __init__


def _redirect_amp():
    _redirect_device_type_argument(torch.amp.autocast_mode.autocast)
    _redirect_device_type_argument(torch.amp.GradScaler, default="npu")   # GradScaler()'s default is "cuda"
    for name in ("autocast", "GradScaler", "custom_fwd", "custom_bwd"):
        setattr(torch.cuda.amp, name, getattr(torch.npu.amp, name))


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
    c10d = dist.distributed_c10d
    for name, position in (("init_process_group", 0), ("new_group", 2)):
        original = getattr(c10d, name)
        if getattr(original, "_transfer_to_npu", False):
            continue

        def redirected(*args, _original=original, _position=position, **kwargs):
            if "backend" in kwargs:
                kwargs["backend"] = _to_hccl(kwargs["backend"])
            elif len(args) > _position:
                args = args[:_position] + (_to_hccl(args[_position]),) + args[_position + 1:]
            return _original(*args, **kwargs)

        redirected = functools.wraps(original)(redirected)
        redirected._transfer_to_npu = True
        setattr(c10d, name, redirected)
        setattr(dist, name, redirected)
    dist.is_nccl_available = lambda: True


def apply():
    """Installs the redirections (done at import; calling it again is harmless)."""
    for name in _FACTORIES:
        setattr(torch, name, _redirect_devices(getattr(torch, name)))
    for name in _TENSOR_METHODS:
        setattr(torch.Tensor, name, _redirect_devices(getattr(torch.Tensor, name)))
    torch.nn.Module.to = _redirect_devices(torch.nn.Module.to)
    if not getattr(torch.Tensor.cuda, "_transfer_to_npu", False):
        torch.Tensor.cuda = _cuda_method(torch.Tensor.npu)
        torch.nn.Module.cuda = _cuda_method(torch.nn.Module.npu)
    if not getattr(torch.Generator, "_transfer_to_npu", False):
        torch.Generator = _Generator
    _redirect_torch_cuda()
    _redirect_profiler_activities()
    _redirect_amp()
    _redirect_nccl()


apply()
