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

It changes the names listed below (DEVICE_CONSTRUCTORS, MORE_DEVICE_FUNCTIONS,
DEVICE_METHODS, CUDA_METHODS, DEVICE_CLASSES, CUDA_NAMES, CUDA_AMP_NAMES,
DEVICE_INDEX_HELPERS, and torch.distributed's in _redirect_nccl), each with what
PyTorch's object is expected to be, and nothing found by searching modules: a
name PyTorch renames or adds shows up in tests/compat/test_transfer_to_npu.py. Every
change goes through :mod:`torch_npu._patches` in the group ``"transfer_to_npu"``:
``torch_npu._patches.undo("transfer_to_npu")`` takes them all back.

Scripts run unchanged may also read the Ascend adapter's ``npu_*`` names of the
profiler's device columns (``npu_time_total``): the import turns them on too
(``torch_npu.profiler.enable_npu_column_aliases()``, group ``"profiler_aliases"``).
"""
import functools
import importlib
import sys
import types

import torch
import torch.profiler
import torch.utils._device

# (Importing this module imports torch_npu first, its package: the npu device is registered.)
from torch_npu._core import patches as _patches
from torch_npu.profiler import enable_npu_column_aliases

GROUP = "transfer_to_npu"
CHECKED = ("2.13",)   # the torch versions every change below was checked against (torch_npu._patches)

# What PyTorch's objects look like (torch_npu._patches.describe): the wrappers pass
# their arguments on, mapping a cuda device, so a C function has nothing to check.
C_FUNCTION = "builtin_function_or_method"
C_METHOD = "method_descriptor"
CLASS = "class (metaclass type)"

# ---- The names it changes, each once (tests/compat/test_transfer_to_npu.py checks that each exists) ----

# PyTorch's device constructors (torch.utils._device._device_constructors(): what
# `with torch.device(...)` applies to), by module. torch.sparse has none of its own:
# the sparse factories are torch.sparse_*_tensor.
DEVICE_CONSTRUCTORS = {
    "torch": dict.fromkeys((
        "arange", "as_tensor", "asarray", "empty", "empty_permuted", "empty_quantized", "empty_strided", "eye",
        "full", "linspace", "logspace", "ones", "rand", "randint", "randn", "randperm", "range", "scalar_tensor",
        "tensor", "tril_indices", "triu_indices", "zeros",
        "bartlett_window", "blackman_window", "hamming_window", "hann_window", "kaiser_window",
        "sparse_bsc_tensor", "sparse_bsr_tensor", "sparse_compressed_tensor", "sparse_coo_tensor",
        "sparse_csc_tensor", "sparse_csr_tensor",
    ), C_FUNCTION),
    "torch.fft": dict.fromkeys(("fftfreq", "rfftfreq"), C_FUNCTION),
    "torch.nested": {
        "nested_tensor": "(tensor_list, *, dtype=None, layout=None, device=None, requires_grad=False, "
                         "pin_memory=False)",
    },
}
# Other functions that take a device (or torch.load's map_location), by module.
MORE_DEVICE_FUNCTIONS = {
    "torch": {
        **dict.fromkeys(("zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
                         "randint_like", "normal", "from_file"), C_FUNCTION),
        "load": "(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **pickle_load_args)",
        "get_device_module": "(device=None)",
    },
    "torch.nested": {"as_nested_tensor": "(ts, dtype=None, device=None, layout=None)"},
}
# Methods that take a device: Tensor's and Module's.
DEVICE_METHODS = {
    "Tensor": dict.fromkeys(("to", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
                             "new_tensor"), C_METHOD),
    "Module": {"to": "(self, *args, **kwargs)", "to_empty": "(self, *, device, recurse=True)"},
}
# .cuda() is .npu().
CUDA_METHODS = {"Tensor": {"cuda": C_METHOD}, "Module": {"cuda": "(self, device=None)"}}
# Device-generic classes whose constructors take a device.
DEVICE_CLASSES = {"Generator": "class (metaclass OpaqueBaseMeta)", "Stream": CLASS, "Event": CLASS}
# torch.cuda's names that torch.npu provides, by kind: torch.cuda.<name> is torch.npu.<name>
# (torch.npu's own name where it differs: NPU_NAMES).
CUDA_NAMES = {
    "devices": {
        "current_device": "()", "device_count": "()", "get_device_capability": "(device=None)",
        "get_device_name": "(device=None)", "get_device_properties": "(device=None)", "init": "()",
        "is_available": "()", "is_bf16_supported": "(including_emulation=True)", "is_initialized": "()",
        "mem_get_info": "(device=None)", "set_device": "(device)", "synchronize": "(device=None)",
        "get_sync_debug_mode": "()", "set_sync_debug_mode": "(debug_mode)",
        "can_device_access_peer": "(device, peer_device)", "clock_rate": "(device=None)",
        "device_memory_used": "(device=None)", "is_tf32_supported": "()", "list_gpu_processes": "(device=None)",
        "memory_usage": "(device=None)", "power_draw": "(device=None)", "temperature": "(device=None)",
        "utilization": "(device=None)", "has_half": "bool",
        "device": CLASS, "device_of": CLASS,
    },
    "streams and events": {
        "Stream": CLASS, "Event": CLASS, "StreamContext": CLASS, "current_stream": "(device=None)",
        "default_stream": "(device=None)", "set_stream": "(stream)", "stream": "(stream)",
        "ExternalStream": CLASS, "get_stream_from_external": "(data_ptr, device=None)",
        "ipc_collect": "()",
    },
    "memory": {
        "empty_cache": "()", "max_memory_allocated": "(device=None)", "max_memory_reserved": "(device=None)",
        "memory_allocated": "(device=None)", "memory_reserved": "(device=None)", "memory_stats": "(device=None)",
        "memory_summary": "(device=None, abbreviated=False)", "reset_accumulated_memory_stats": "(device=None)",
        "reset_max_memory_allocated": "(device=None)", "reset_peak_memory_stats": "(device=None)",
        "MemPool": CLASS, "OutOfMemoryError": CLASS, "caching_allocator_alloc": "(size, device=None, stream=None)",
        "caching_allocator_delete": "(mem_ptr)", "get_allocator_backend": "()",
        "get_per_process_memory_fraction": "(device=None)", "max_memory_cached": "(device=None)",
        "memory_cached": "(device=None)", "memory_snapshot": "(mempool_id=None, include_traces=True)",
        "memory_stats_as_nested_dict": "(device=None)", "reset_max_memory_cached": "(device=None)",
        "set_per_process_memory_fraction": "(fraction, device=None)", "use_mem_pool": "(pool, device=None)",
        "host_memory_stats": "()", "host_memory_stats_as_nested_dict": "()",
        "reset_accumulated_host_memory_stats": "()", "reset_peak_host_memory_stats": "()",
        "caching_allocator_enable": "(value=True)", "caching_allocator_disabled": "()",
        "CUDAPluggableAllocator": CLASS, "change_current_allocator": "(allocator)",
    },
    "legacy tensor types": {name: "class (metaclass tensortype)" for name in (
        "BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor",
        "IntTensor", "LongTensor", "ShortTensor")},
    "graphs": {
        "CUDAGraph": CLASS, "graph": CLASS, "graph_pool_handle": "()", "is_current_stream_capturing": "()",
        "make_graphed_callables": "(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None)",
    },
    "random": {
        "default_generators": "tuple", "get_rng_state": "(device='cuda')", "get_rng_state_all": "()",
        "initial_seed": "()", "manual_seed": "(seed)", "manual_seed_all": "(seed)", "seed": "()", "seed_all": "()",
        "set_rng_state": "(new_state, device='cuda')", "set_rng_state_all": "(new_states)",
    },
}
NPU_NAMES = {"CUDAGraph": "NPUGraph", "CUDAPluggableAllocator": "NPUPluggableAllocator"}
# torch.cuda.amp's names that torch.npu.amp provides.
CUDA_AMP_NAMES = {"autocast": CLASS, "GradScaler": CLASS, "custom_fwd": "(fwd=None, *, cast_inputs=None)",
                  "custom_bwd": "(bwd)", "amp_definitely_not_available": "()"}
# The helper that reads a device's index, (its module, its name), and the modules
# that use it (imported by name): torch.npu's functions and classes, torch.accelerator's.
DEVICE_INDEX_HELPERS = {
    ("torch_npu.npu._device", "_get_device_index", "(device, optional=True)"): (
        "torch_npu.npu._device", "torch_npu.npu", "torch_npu.npu.memory", "torch_npu.npu.random",
        "torch_npu.npu.streams", "torch_npu.npu.comm", "torch_npu.npu._monitoring", "torch_npu.npu._recovery"),
    ("torch.accelerator._utils", "_get_device_index", "(device, optional=False)"): (
        "torch.accelerator._utils", "torch.accelerator", "torch.accelerator.memory"),
}

# Code that asks torch.cuda about CUDA itself keeps CUDA's answers: torch.cuda's
# own functions (they call one another through the module's namespace, where the
# npu's now are), inductor (its cache key reads torch.cuda.get_device_properties(),
# its passes check torch.cuda.is_available()), triton's checks and dynamo's CUDA
# device interface. Dynamo's tracer is not among them: it calls torch.cuda.* for
# the script it traces (constant folding).
_MODULES_ASKING_ABOUT_CUDA = ("torch.cuda.", "torch._inductor.", "torch.utils._triton.",
                              "torch._dynamo.device_interface.")


def _patch(owner, name, value, *, reason, expects):
    return _patches.patch(owner, name, value, GROUP, reason=reason, checked=CHECKED, expects=expects)


def _wrap(owner, name, make, *, reason, expects):
    return _patches.wrap(owner, name, make, GROUP, reason=reason, checked=CHECKED, expects=expects)


def _module(name):
    return importlib.import_module(name)


def _owner(name):
    return {"Tensor": torch.Tensor, "Module": torch.nn.Module}[name]


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
        _patch(torch.jit._builtins._get_builtin_table(), id(redirected), builtin, expects=_patches.ABSENT,
               reason="TorchScript finds the aten op of a call by its function object in this table: the wrapper "
                      "must compile to the op of the function it wraps")
    return redirected


_CUDA_MEANS_NPU = "a script written for CUDA passes a cuda device here; PyTorch has no device alias, so the " \
                  "callable is wrapped to map it to the npu"


def _redirect_device_arguments():
    """Factories, ``to`` and the other callables that take a device take "cuda" to mean the npu.
    Returns the wrappers of PyTorch's device constructors."""
    _pytorch_device_constructors()   # PyTorch's cached set is filled now, with the functions, not the wrappers
    wrappers = []
    for table in (DEVICE_CONSTRUCTORS, MORE_DEVICE_FUNCTIONS):
        for module_name, names in table.items():
            module = _module(module_name)
            for name, expects in names.items():
                wrapper = _wrap(module, name, _redirect_devices, reason=_CUDA_MEANS_NPU, expects=expects)
                if table is DEVICE_CONSTRUCTORS:
                    wrappers.append(wrapper)
    for owner_name, names in DEVICE_METHODS.items():
        for name, expects in names.items():
            _wrap(_owner(owner_name), name, _redirect_devices, reason=_CUDA_MEANS_NPU, expects=expects)
    return wrappers


def _pytorch_device_constructors():
    # PyTorch's own function, its cache filled before any factory is wrapped (the first call,
    # in _redirect_device_arguments): the original functions.
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

    _patch(torch.utils._device, "_device_constructors", _device_constructors, expects="()",
           reason="the device context recognises factories by their function objects: it must also know "
                  "transfer_to_npu's wrappers of them")

    def mapping_the_device(init):
        @functools.wraps(init)
        def __init__(self, device):
            init(self, _to_npu(device))
        return __init__

    _wrap(torch.utils._device.DeviceContext, "__init__", mapping_the_device, expects="(self, device)",
          reason="with torch.device('cuda') / set_default_device('cuda') make the device context of the npu")


def _cuda_method(npu_method):
    @functools.wraps(npu_method)
    def cuda(self, device=None, *args, **kwargs):
        return npu_method(self, _to_npu(device), *args, **kwargs)
    return cuda


def _device_index_helpers_take_cuda():
    """torch.npu's functions and classes (torch.cuda's now) and torch.accelerator's that take a
    device take a cuda device: each family finds a device's index with one helper, which the
    modules of DEVICE_INDEX_HELPERS import by name."""
    def taking_cuda(helper):
        @functools.wraps(helper)
        def _get_device_index(device, *args, **kwargs):
            return helper(_to_npu(device), *args, **kwargs)
        return _get_device_index

    for (home, name, expects), users in DEVICE_INDEX_HELPERS.items():
        replacement = taking_cuda(_patches.original(_module(home), name))
        for user in users:
            _patch(_module(user), name, replacement, expects=expects,
                   reason="every function of the module that takes a device reads its index here: one change "
                          "makes them all take a cuda device to mean the npu")


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
    """torch.cuda's names of CUDA_NAMES are torch.npu's (its functions for all but the code
    that asks about CUDA itself)."""
    reason = "a script written for CUDA calls torch.cuda for its device: torch.npu's answers are the npu's"
    for names in CUDA_NAMES.values():
        for name, expects in names.items():
            npu_value = getattr(torch.npu, NPU_NAMES.get(name, name))
            if isinstance(npu_value, types.FunctionType):
                _wrap(torch.cuda, name,
                      lambda cuda_function, npu_function=npu_value:
                      _npu_for_scripts_cuda_for_pytorch(npu_function, cuda_function),
                      reason=reason, expects=expects)
            else:
                _wrap(torch.cuda, name, lambda _, npu_value=npu_value: npu_value, reason=reason, expects=expects)


def _redirect_profiler_activities():
    def mapping_cuda(original):
        @functools.wraps(original)
        def __init__(self, *args, activities=None, **kwargs):
            if activities is not None:
                activities = [torch.profiler.ProfilerActivity.PrivateUse1
                              if a == torch.profiler.ProfilerActivity.CUDA else a for a in activities]
            original(self, *args, activities=activities, **kwargs)
        return __init__

    _wrap(torch.profiler.profile, "__init__", mapping_cuda,
          expects="(self, *, activities=None, schedule=None, on_trace_ready=None, record_shapes=False, "
                  "profile_memory=False, with_stack=False, with_flops=False, with_modules=False, "
                  "experimental_config=None, execution_trace_observer=None, acc_events=False, use_cuda=None, "
                  "custom_trace_id_callback=None, post_processing_timeout_s=None)",
          reason="ProfilerActivity.CUDA asks for CUDA's activities, which torch.profiler has no way to alias: "
                 "it is mapped to PrivateUse1, the npu's")


def _redirect_device_type_argument(cls, expects, default=None):
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

    _wrap(cls, "__init__", mapping_cuda, expects=expects,
          reason="torch.autocast('cuda') / GradScaler('cuda') select CUDA's mixed precision by device type: "
                 "a script written for CUDA means the npu's")


def _redirect_amp():
    _redirect_device_type_argument(torch.amp.autocast_mode.autocast,
                                   "(self, device_type, dtype=None, enabled=True, cache_enabled=None)")
    _redirect_device_type_argument(    # GradScaler()'s default is "cuda"
        torch.amp.GradScaler, "(self, device='cuda', init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, "
                              "growth_interval=2000, enabled=True)", default="npu")
    for name, expects in CUDA_AMP_NAMES.items():
        _patch(torch.cuda.amp, name, getattr(torch.npu.amp, name), expects=expects,
               reason="torch.cuda.amp's autocast and GradScaler are CUDA's: a script written for CUDA means the "
                      "npu's")


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


_GROUP_FUNCTIONS = {   # (the position of backend, what the function looks like)
    "init_process_group": (0, "(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None, "
                              "group_name='', pg_options=None, device_id=None, _ranks=None)"),
    "new_group": (2, "(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False, "
                     "group_desc=None, device_id=None, sort_ranks=True)"),
}


def _redirect_nccl():
    import torch.distributed as dist
    if not dist.is_available():
        return
    import torch_npu.distributed
    c10d = dist.distributed_c10d
    reason = "a script written for CUDA asks for the 'nccl' backend and binds groups to cuda devices: it means " \
             "the npu's 'hccl'"
    for name, (position, expects) in _GROUP_FUNCTIONS.items():
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

        wrapper = _wrap(c10d, name, mapping_nccl, reason=reason, expects=expects)
        _patch(dist, name, wrapper, reason=reason, expects=expects)
    _patch(dist, "is_nccl_available", lambda: True, expects="()",
           reason="scripts written for CUDA check for NCCL before asking for it; 'nccl' means the npu's 'hccl'")
    # NCCL's backend class: isinstance() checks, Options, construction.
    _patch(dist, "ProcessGroupNCCL", torch_npu.distributed.ProcessGroupHCCL, expects=_patches.ABSENT,
           reason="scripts written for CUDA construct and isinstance-check NCCL's backend class, which a CPU "
                  "build of torch lacks: the npu's backend class stands for it")
    _wrap(dist.ProcessGroup, "_get_backend", _redirect_devices,   # pg._get_backend(torch.device("cuda"))
          expects="instancemethod",
          reason="a group's backend is looked up by device type: the cuda one is the npu's")


def apply():
    """Installs the redirections (done at import; calling it again is harmless)."""
    _device_context_means_the_npu(_redirect_device_arguments())
    for owner_name, names in CUDA_METHODS.items():
        owner = _owner(owner_name)
        for name, expects in names.items():
            _wrap(owner, name, lambda _, owner=owner: _cuda_method(owner.npu), expects=expects,
                  reason=".cuda() moves to CUDA, which a script written for CUDA means as the npu: it is .npu()")
    for name, expects in DEVICE_CLASSES.items():
        _wrap(torch, name, _class_taking_cuda, expects=expects,
              reason="the constructor is C++ and takes no device alias: a stand-in subclass maps cuda to the npu")
    _device_index_helpers_take_cuda()
    _redirect_torch_cuda()
    _redirect_profiler_activities()
    enable_npu_column_aliases()   # the Ascend adapter's npu_* column names: its own group
    _redirect_amp()
    _redirect_nccl()


apply()
