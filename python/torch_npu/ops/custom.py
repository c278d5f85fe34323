"""User operators on the npu: ``torch.ops.npu.<name>`` with priorities and dtype sets.

``register(name, impl, priority, device, dtype, schema, backward)`` defines the
operator once (in the ``npu`` namespace, through ``torch.library``) and adds an
implementation; several implementations may share a name. The operator's one
kernel picks, at each call, the implementation of the inputs' device with the
highest priority whose dtype set accepts the inputs. For npu inputs that no
npu implementation accepts (or when the op's fallback policy is "cpu"), a
``device="cpu"`` implementation runs on cpu copies, decided and counted by the
C++ fallback of aten ops: the same mode, op policies ("npu" forbids it),
warning, logger and statistics. Without one the call raises "not supported", naming the dtypes and
the implementations.

The kernel is registered for CompositeImplicitAutograd: autograd flows through
the implementation's own ops (or its ``torch.autograd.Function``), torch.compile
traces through it on fake tensors, and torch.jit records the operator by name.
"""
import inspect
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.utils._pytree import tree_flatten, tree_map

from .. import _C

__all__ = ["register", "register_npu_op", "CustomOp", "Implementation"]

NAMESPACE = "npu"
DEVICES = ("npu", "cpu")
DEFAULT_PRIORITY = 100

_library = torch.library.Library(NAMESPACE, "FRAGMENT")
_lock = threading.Lock()


@dataclass(frozen=True)
class Implementation:
    impl: Callable
    priority: int
    device: str
    dtypes: Optional[frozenset]  # None: every dtype
    backward: Optional[Callable]

    def accepts(self, dtypes) -> bool:
        return self.dtypes is None or all(d in self.dtypes for d in dtypes)

    def describe(self) -> str:
        kinds = "any dtype" if self.dtypes is None else ", ".join(sorted(str(d).replace("torch.", "")
                                                                        for d in self.dtypes))
        return f"{self.device} (priority {self.priority}, {kinds})"


@dataclass
class CustomOp:
    name: str                      # "my_custom_op"
    schema: str                    # "(Tensor x, Tensor w) -> Tensor"
    implementations: List[Implementation]

    def __post_init__(self):
        self.parsed = torch._C.parse_schema(f"{NAMESPACE}::{self.name}{self.schema}")

    def complete(self, args, kwargs):
        """The call's arguments with the defaults the dispatcher leaves out filled in."""
        args, kwargs = list(args), dict(kwargs)
        for index, argument in enumerate(self.parsed.arguments):
            if argument.kwarg_only:
                if argument.name not in kwargs and argument.default_value is not None:
                    kwargs[argument.name] = argument.default_value
            elif index >= len(args) and argument.name not in kwargs and argument.default_value is not None:
                args.append(argument.default_value)
        return tuple(args), kwargs

    @property
    def qualified_name(self) -> str:
        return f"{NAMESPACE}::{self.name}"

    def best(self, device: str) -> Optional[Implementation]:
        ranked = [i for i in self.implementations if i.device == device]
        return max(ranked, key=lambda i: i.priority) if ranked else None


_ops: Dict[str, CustomOp] = {}


def custom_op(name: str) -> Optional[CustomOp]:
    """The custom op called ``name``, "npu::name" or "torch.ops.npu.name", if registered.

    Names are read by the C++ parser every op name goes through; a name without a
    namespace, which it reads as aten's, may be a custom op's too.
    """
    try:
        qualified, overload = _C._canonical_op_name(name)
    except RuntimeError:  # text that is no operator name ("", "::"): no op of ours
        return None
    if overload not in ("", "default"):
        return None  # a custom op has one overload, the default
    namespace, _, short = qualified.partition("::")
    explicit = "::" in name or name.strip().startswith("torch.ops.")
    if namespace == NAMESPACE or (namespace == "aten" and not explicit):
        return _ops.get(short)
    return None


def all_custom_ops() -> List[CustomOp]:
    return list(_ops.values())


# ---- validation ------------------------------------------------------------------


def _dtype_set(dtype) -> Optional[frozenset]:
    if dtype is None:
        return None
    items = [dtype] if isinstance(dtype, (str, torch.dtype)) else list(dtype)
    resolved = set()
    for item in items:
        found = item if isinstance(item, torch.dtype) else getattr(torch, str(item).replace("torch.", ""), None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"register_npu_op: {item!r} is not a dtype name; use e.g. 'float16', 'float32', "
                             f"'bfloat16' or torch.float32")
        resolved.add(found)
    if not resolved:
        raise ValueError("register_npu_op: dtype=[] accepts nothing; give dtypes or None (all)")
    return frozenset(resolved)


def _clashes_with_aten(name: str) -> bool:
    return _C._resolve_op(f"aten::{name}") is not None


def _schema_of(name: str, impl: Callable, schema: Optional[str]) -> str:
    """The schema without the name: "(Tensor x, Tensor w) -> Tensor"."""
    if schema is not None:
        schema = schema.strip()
        if not schema.startswith("("):
            schema = schema[schema.index("("):] if "(" in schema else schema
        return schema
    signature = inspect.signature(impl)
    params = list(signature.parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        raise ValueError(f"register_npu_op('{name}'): an impl with *args/**kwargs needs schema=, e.g. "
                         f"schema='(Tensor x, Tensor w) -> Tensor'")
    annotated = any(p.annotation is not p.empty for p in params) or signature.return_annotation is not signature.empty
    if annotated:
        return torch.library.infer_schema(impl, mutates_args=())
    # An unannotated callable (lambda x, w: ...): Tensors in, a Tensor out; a
    # parameter with a number or bool default takes that default's type.
    def declare(p):
        for kind, name in ((bool, "bool"), (int, "int"), (float, "float")):
            if p.default is not p.empty and type(p.default) is kind:
                return f"{name} {p.name}={p.default!r}"
        return f"Tensor {p.name}"

    return "(" + ", ".join(declare(p) for p in params) + ") -> Tensor"


# ---- the one kernel of each op ----------------------------------------------------


def _tensors(args) -> List[torch.Tensor]:
    return [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]


def _computing_dtypes(tensors) -> set:
    # Integer and bool tensors pass as indices and masks, as in the npu op library.
    return {t.dtype for t in tensors if t.is_floating_point() or t.is_complex()}


def _not_supported(op: CustomOp, device: str, dtypes, why: str, remedy: str) -> NotImplementedError:
    names = ", ".join(sorted(str(d).replace("torch.", "") for d in dtypes)) or "none"
    impls = "; ".join(i.describe() for i in op.implementations)
    return NotImplementedError(f"Operator '{op.qualified_name}' is not yet supported on {device} (dtype {names}): "
                               f"{why}. Registered implementations: {impls}. {remedy}")


def _register_hint(op: CustomOp, device: str) -> str:
    return (f"register {'an npu' if device == 'npu' else 'a cpu'} implementation that accepts these dtypes: "
            f"torch_npu._ops_registry.register(name='{op.name}', impl=..., device='{device}', dtype=[...]).")


def _with_backward(chosen: Implementation, args, kwargs):
    """Runs chosen.impl with chosen.backward as its derivative (gradients for the positional inputs)."""
    class _Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            # Saved, so an in-place change of an input before backward raises, as autograd does.
            ctx.save_for_backward(*[a for a in inputs if isinstance(a, torch.Tensor)])
            ctx.is_tensor = [isinstance(a, torch.Tensor) for a in inputs]
            ctx.others = [a for a in inputs if not isinstance(a, torch.Tensor)]
            with torch.no_grad():
                return chosen.impl(*inputs, **kwargs)

        @staticmethod
        def backward(ctx, *grads):
            tensors, others = iter(ctx.saved_tensors), iter(ctx.others)
            inputs = [next(tensors) if is_tensor else next(others) for is_tensor in ctx.is_tensor]
            result = chosen.backward(grads[0] if len(grads) == 1 else grads, *inputs)
            return tuple(result) if isinstance(result, (tuple, list)) else (result,)

    return _Op.apply(*args)


def _run(chosen: Implementation, args, kwargs):
    if chosen.backward is not None:
        return _with_backward(chosen, args, kwargs)
    return chosen.impl(*args, **kwargs)


def _dtype_names(dtypes) -> str:
    return ", ".join(sorted(str(d).replace("torch.", "") for d in dtypes))


def _fall_back(op: CustomOp, cpu_impl: Implementation, args, kwargs, dtypes, policy: str, target: torch.device):
    """Runs ``cpu_impl`` for npu inputs as a fallback of aten ops is run: the C++ fallback
    decides (mode, op policy, warning, logger: the doctor's observers) and counts it. The
    copies are made here, per tensor, so autograd and fake tensors see them (the op runs
    above autograd, unlike aten's fallback)."""
    npu_impls = [i for i in op.implementations if i.device == "npu"]
    if policy == "cpu":
        reason, refused, supported = "policy", "", ""
    elif npu_impls:
        reason, refused = "dtype", _dtype_names(dtypes) or "none"
        supported = "; ".join(i.describe() for i in npu_impls)
    else:
        reason, refused, supported = "no_kernel", "", ""
    # Traced on fake tensors (torch.compile, export), nothing runs: check, but do not announce or
    # count. The compiled graph then holds the copies and the cpu implementation's ops.
    tracing = any(is_fake(t) for t in _tensors((args, kwargs)))
    _C._check_custom_op_fallback(op.qualified_name, reason, refused, supported, not tracing, *args, **kwargs)
    start = time.perf_counter_ns()
    moved = {"to_cpu": 0, "to_npu": 0}

    def to_cpu(t):
        if isinstance(t, torch.Tensor) and t.device.type == "npu":
            moved["to_cpu"] += t.numel() * t.element_size()
            return t.cpu()
        return t

    def to_npu(t):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            moved["to_npu"] += t.numel() * t.element_size()
            return t.to(target)
        return t

    full_args, full_kwargs = op.complete(args, kwargs)
    result = tree_map(to_npu, _run(cpu_impl, tree_map(to_cpu, full_args), tree_map(to_cpu, full_kwargs)))
    if not tracing:
        _C._record_fallback(op.qualified_name, reason, time.perf_counter_ns() - start, moved["to_cpu"],
                            moved["to_npu"])
    return result


def _kernel_for(op: CustomOp):
    def kernel(*args, **kwargs):
        full_args, full_kwargs = op.complete(args, kwargs)
        tensors = _tensors((full_args, full_kwargs))
        device = "npu" if any(t.device.type == "npu" for t in tensors) else "cpu"
        dtypes = _computing_dtypes(tensors)
        policy = _C._op_fallback(op.qualified_name) if device == "npu" else "default"
        if policy != "cpu":
            for candidate in sorted((i for i in op.implementations if i.device == device), key=lambda i: -i.priority):
                if candidate.accepts(dtypes):
                    return _run(candidate, full_args, full_kwargs)
        if device == "cpu":
            raise _not_supported(op, "cpu", dtypes, "no cpu implementation accepts them",
                                 "Move the inputs to the npu (.npu()), or " + _register_hint(op, "cpu"))
        fallback = next((i for i in sorted((i for i in op.implementations if i.device == "cpu"),
                                           key=lambda i: -i.priority) if i.accepts(dtypes)), None)
        if fallback is None:
            raise _not_supported(op, "npu", dtypes, "no npu implementation accepts them and no cpu one does",
                                 "To run it, " + _register_hint(op, "npu")
                                 + " A device='cpu' one would serve as the fallback.")
        target = next(t.device for t in tensors if t.device.type == "npu")
        return _fall_back(op, fallback, args, kwargs, dtypes, policy, target)

    kernel.__name__ = f"npu_{op.name}"
    return kernel


# ---- registration -----------------------------------------------------------------


def register(name: str, impl: Callable, priority: int = DEFAULT_PRIORITY, device: str = "npu",
             dtype: Union[None, str, torch.dtype, Sequence] = None, schema: Optional[str] = None,
             backward: Optional[Callable] = None):
    """Defines ``torch.ops.npu.<name>`` (first call) and adds an implementation.

    ``impl``: a callable of the op's arguments. ``priority``: higher wins among
    the implementations of one device. ``device``: "npu" or "cpu" (a cpu
    implementation serves cpu inputs, and npu inputs as the fallback).
    ``dtype``: the floating dtypes it accepts (names or torch dtypes; None:
    all); integer and bool inputs always pass. ``schema``: e.g. "(Tensor x,
    float eps=1e-6) -> Tensor"; else from the annotations; else every
    parameter is a Tensor (a number or bool default gives its type) and the
    result a Tensor. ``backward``: optional ``backward(grad_output, *inputs) ->
    grads``, one per positional input (None for non-tensors); without it
    autograd differentiates through ``impl``.
    Returns the operator (``torch.ops.npu.<name>``).
    """
    if not callable(impl):
        raise TypeError(f"register_npu_op('{name}'): impl must be callable, got {type(impl).__name__}")
    if backward is not None and not callable(backward):
        raise TypeError(f"register_npu_op('{name}'): backward must be callable, got {type(backward).__name__}")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_npu_op: {name!r} is not a valid operator name (letters, digits, _)")
    if device not in DEVICES:
        raise ValueError(f"register_npu_op('{name}'): device must be one of {DEVICES}, got {device!r}")
    if not isinstance(priority, int):
        raise TypeError(f"register_npu_op('{name}'): priority must be an int, got {priority!r}")
    dtypes = _dtype_set(dtype)
    implementation = Implementation(impl, priority, device, dtypes, backward)
    with _lock:
        op = _ops.get(name)
        if op is None:
            if _clashes_with_aten(name):
                raise ValueError(f"register_npu_op: '{name}' clashes with the aten operator aten::{name}; "
                                 f"choose another name")
            if hasattr(torch.ops.npu, name) or _C._resolve_op(f"{NAMESPACE}::{name}") is not None:
                raise ValueError(f"register_npu_op: npu::{name} is already defined (a built-in torch_npu op); "
                                 f"choose another name")
            op_schema = _schema_of(name, impl, schema)
            op = CustomOp(name, op_schema, [])
            _library.define(name + op_schema)
            _library.impl(name, _kernel_for(op), "CompositeImplicitAutograd")
            _ops[name] = op
        elif schema is not None and str(torch._C.parse_schema(name + _schema_of(name, impl, schema))) != str(
                torch._C.parse_schema(name + op.schema)):
            raise ValueError(f"register_npu_op('{name}'): schema {schema!r} differs from the registered "
                             f"{op.schema!r}; all implementations of one op share its schema")
        for existing in op.implementations:
            if existing.device == device and existing.priority == priority:
                raise ValueError(f"register_npu_op('{name}'): an implementation for {device} with priority "
                                 f"{priority} is already registered; give another priority")
        op.implementations.append(implementation)
    return getattr(torch.ops.npu, name)


def register_npu_op(name: Optional[str] = None, device: str = "npu", priority: int = DEFAULT_PRIORITY,
                    dtype=None, schema: Optional[str] = None, backward: Optional[Callable] = None):
    """Decorator form of :func:`register`: ``@register_npu_op(name="fused_add_matmul", dtype=["float32"])``.
    The name defaults to the function's; returns the operator."""
    def decorate(fn):
        return register(name or fn.__name__, fn, priority=priority, device=device, dtype=dtype, schema=schema,
                        backward=backward)

    return decorate
