"""The ledger of every change torch_npu makes to PyTorch's internals.

Every replacement of an attribute of torch (a function, a method, a class) goes
through :func:`patch` or :func:`wrap`, which remember what was there, so
``undo(group)`` puts PyTorch back exactly as it was and ``applied()`` lists what
is changed now. A group names the feature that asked ("transfer_to_npu",
"profiler", ...). An owner may also be a dict (a registry of PyTorch's, such as
TorchScript's table of builtins): ``name`` is then a key.

Changes that are not Python attribute replacements (the CPU allocator wrapper
``torch_npu._C`` installs when it loads) and private PyTorch objects torch_npu
relies on (the autograd engine's ``run_backward``, which the exit drain calls)
are entries too, made with :func:`record`: a name, and an undo callable where
one exists.

Every entry says why PyTorch's own object is not good enough (``reason``, one
line), which torch versions it was checked against (``checked``, ``("2.13",)``),
and what PyTorch's object is expected to look like (``expects``, in the words of
:func:`describe`: its signature, ``"class (metaclass type)"``, ``"absent"`` for a
name torch_npu adds...). An object that no longer looks so is reported when the
change is made (a :class:`TorchInternalsChanged` warning), and
tests/package/test_patches.py checks every entry against the pinned torch: an upgrade
that changes a target fails loudly instead of leaving a wrapper that quietly
misreads its arguments. :func:`ledger` gives the entries, oldest first.

Groups may change the same attribute: each change is a layer over the one
before it. Undoing the newest layer restores the value under it; undoing an
older one leaves the newer value in place (which, if made by :func:`wrap`,
still calls the older one) and makes undoing the newer one restore what the
older layer had replaced.
"""
import inspect
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

_INHERITED = object()  # the attribute was not the owner's own: undo deletes the patch
_ABSENT = object()     # the owner had no such attribute or key at all

ABSENT = "absent"      # ``expects`` of a name torch_npu adds: PyTorch must not have it


class TorchInternalsChanged(RuntimeWarning):
    """An object of PyTorch's that torch_npu changes no longer looks as the ledger expects."""


@dataclass(eq=False)   # entries are compared by identity
class Entry:
    """One change in the ledger.

    ``owner``/``attr`` locate the changed object (``attr`` is a key when ``owner``
    is a dict); a :func:`record` entry without a Python target has neither.
    ``original`` is the value under this layer (as stored), ``replacement`` what
    is there now; a record has neither, but may have ``undo``.
    """
    group: str
    name: str
    reason: str
    checked: Tuple[str, ...]
    expects: Optional[str]
    owner: Any = None
    attr: Any = None
    original: Any = _INHERITED
    replacement: Any = None
    undo: Optional[Callable[[], Any]] = None
    is_patch: bool = True

    def pytorch_value(self) -> Any:
        """PyTorch's own object this entry expects (``_ABSENT``-free: None when it has none)."""
        value = self._pytorch_value()
        return None if value is _ABSENT else value

    def _pytorch_value(self) -> Any:
        if self.owner is None and self.attr is None:
            return _ABSENT
        if not self.is_patch:
            return _lookup(self.owner, self.attr)
        with _lock:
            layers = _layers.get((id(self.owner), self.attr))
            stored = layers[0].original if layers else self.original
        return _under(self.owner, self.attr, stored)

    def found(self) -> Optional[str]:
        """:func:`describe` of PyTorch's object now (None for an entry without a Python target)."""
        if self.owner is None and self.attr is None:
            return None
        return describe(self._pytorch_value())


_lock = threading.RLock()
_layers: Dict[Tuple[int, Any], List[Entry]] = {}  # (id(owner), name) -> its layers, oldest first
_order: List[Entry] = []                           # every entry, oldest first


def describe(value: Any) -> str:
    """What an entry's ``expects`` says about PyTorch's object ``value``: ``"absent"``; for a
    class ``"class (metaclass M)"``; for a static/class method its kind and its function's
    description; for a callable with a signature, its parameters as ``inspect.signature``
    writes them without annotations (``"(self, device=None)"``); else the name of its type
    (``"builtin_function_or_method"``, ``"property"``, ``"tuple"``)."""
    if value is _ABSENT:
        return ABSENT
    if isinstance(value, type):
        return f"class (metaclass {type(value).__qualname__})"
    if isinstance(value, (staticmethod, classmethod)):
        return f"{type(value).__name__} {describe(value.__func__)}"
    if callable(value) and not isinstance(value, property):
        try:
            signature = inspect.signature(value)
        except (TypeError, ValueError):   # a builtin without a text signature
            pass
        else:   # names, kinds and defaults: what a wrapper relies on (annotations change with style)
            empty = inspect.Parameter.empty
            parameters = [p.replace(annotation=empty) for p in signature.parameters.values()]
            return str(signature.replace(parameters=parameters, return_annotation=empty))
    return type(value).__qualname__


def _own_value(owner: Any, name: Any) -> Any:
    if isinstance(owner, dict):
        return owner.get(name, _INHERITED)
    namespace = getattr(owner, "__dict__", None)
    if namespace is not None and name in namespace:
        return namespace[name]  # as stored: a staticmethod stays a staticmethod
    return _INHERITED


def _under(owner: Any, name: Any, stored: Any) -> Any:
    """The value a layer's ``stored`` original stands for: an inherited one is its base's."""
    if stored is not _INHERITED:
        return stored
    for base in getattr(owner, "__mro__", ())[1:]:
        if name in vars(base):
            return vars(base)[name]
    return _ABSENT


def _lookup(owner: Any, name: Any) -> Any:
    if isinstance(owner, dict):
        return owner.get(name, _ABSENT)
    return getattr(owner, name, _ABSENT)


def _get(owner: Any, name: Any) -> Any:
    return owner.get(name) if isinstance(owner, dict) else getattr(owner, name, None)


def _set(owner: Any, name: Any, value: Any) -> None:
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)


def _restore(owner: Any, name: Any, value: Any) -> None:
    if value is not _INHERITED:
        _set(owner, name, value)
    elif isinstance(owner, dict):
        owner.pop(name, None)
    else:
        try:
            delattr(owner, name)
        except AttributeError:
            pass


def _where(owner: Any, name: Any) -> str:
    if isinstance(owner, dict):
        return f"dict[{name!r}]"[:100]
    return f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"


def _checked_entry(reason: Any, checked: Any, expects: Any, *, expects_required: bool) -> Tuple[str, Tuple[str, ...]]:
    if not isinstance(reason, str) or not reason.strip() or "\n" in reason:
        raise ValueError(f"torch_npu._patches: reason must be one non-empty line (why PyTorch's own object is "
                         f"replaced), got {reason!r}")
    if isinstance(checked, str) or not isinstance(checked, (tuple, list)) or not checked \
            or not all(isinstance(v, str) and v.count(".") == 1 for v in checked):
        raise ValueError(f"torch_npu._patches: checked must be the torch versions the change was checked "
                         f"against, as ('2.13',), got {checked!r}")
    if (expects_required or expects is not None) and not isinstance(expects, str):
        raise ValueError(f"torch_npu._patches: expects must say what PyTorch's object looks like (see describe()), "
                         f"got {expects!r}")
    return reason.strip(), tuple(checked)


def _warn_if_changed(entry: Entry) -> None:
    found = entry.found()
    if entry.expects is None or found == entry.expects:
        return
    warnings.warn(
        f"torch_npu: PyTorch's {entry.name} (changed by torch_npu's {entry.group!r} feature) is not what torch_npu "
        f"was checked against (torch {', '.join(entry.checked)}): expected {entry.expects}, found {found}. "
        f"torch_npu changes it because {entry.reason}; the change may misbehave with torch {torch_version()}.",
        TorchInternalsChanged, stacklevel=4)


def torch_version() -> str:
    """The running torch's "major.minor" (what ``checked`` lists)."""
    import torch
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def patch(owner: Any, name: Any, replacement: Any, group: str, *, reason: str, checked: Tuple[str, ...],
          expects: str) -> Any:
    """Sets ``owner.name = replacement`` for ``group``; returns the value it replaces.

    ``reason`` (one line) says why PyTorch's object is replaced, ``checked`` the torch
    versions the change was checked against, ``expects`` what PyTorch's object is
    (:func:`describe`; :data:`ABSENT` for a name torch_npu adds). Patching the same
    attribute again in the same group keeps that group's first original, so undo
    restores the value from before the group's changes.
    """
    reason, checked = _checked_entry(reason, checked, expects, expects_required=True)
    with _lock:
        previous = _get(owner, name)
        layers = _layers.setdefault((id(owner), name), [])
        if layers and layers[-1].group == group:
            layers[-1].replacement = replacement
        else:
            entry = Entry(group, _where(owner, name), reason, checked, expects, owner=owner, attr=name,
                          original=_own_value(owner, name), replacement=replacement)
            layers.append(entry)
            _order.append(entry)
            _warn_if_changed(entry)
        _set(owner, name, replacement)
        return previous


def wrap(owner: Any, name: Any, make: Callable[[Any], Any], group: str, *, reason: str,
         checked: Tuple[str, ...], expects: str) -> Any:
    """Replaces ``owner.name`` by ``make(current value)``, once per group; returns the wrapper.
    ``reason``, ``checked`` and ``expects`` are :func:`patch`'s."""
    _checked_entry(reason, checked, expects, expects_required=True)
    with _lock:
        for p in _layers.get((id(owner), name), ()):
            if p.group == group:
                return p.replacement
        replacement = make(_get(owner, name))
        patch(owner, name, replacement, group, reason=reason, checked=checked, expects=expects)
        return replacement


def record(name: str, *, group: str, reason: str, checked: Tuple[str, ...], undo: Optional[Callable[[], Any]] = None,
           target: Optional[Tuple[Any, Any]] = None, expects: Optional[str] = None) -> Entry:
    """Enters a change that is not an attribute replacement (made by C++ code, a switch of
    PyTorch's) in the ledger; ``undo`` takes it back where that is possible. ``target``,
    ``(owner, name)``, is the PyTorch object the change relies on, ``expects`` what it is
    (:func:`describe`). Recording the same name in the same group again changes nothing."""
    reason, checked = _checked_entry(reason, checked, expects, expects_required=target is not None)
    owner, attr = target if target is not None else (None, None)
    with _lock:
        for entry in _order:
            if not entry.is_patch and entry.group == group and entry.name == name:
                return entry
        entry = Entry(group, name, reason, checked, expects, owner=owner, attr=attr, undo=undo, is_patch=False)
        _order.append(entry)
        _warn_if_changed(entry)
        return entry


def original(owner: Any, name: Any) -> Any:
    """What ``owner.name`` was before torch_npu changed it (its value now, if unchanged)."""
    with _lock:
        layers = _layers.get((id(owner), name))
        if not layers:
            return _get(owner, name)
        value = _under(owner, name, layers[0].original)
    return None if value is _ABSENT else value


def undo(group: Optional[str] = None) -> int:
    """Restores what ``group`` (or every group) changed, newest first; returns how many.
    A recorded change without an undo callable stays in place (and in the ledger)."""
    with _lock:
        undone = [p for p in reversed(_order) if (group is None or p.group == group) and (p.is_patch or p.undo)]
        for p in undone:
            if not p.is_patch:
                p.undo()
                _order.remove(p)
                continue
            key = (id(p.owner), p.attr)
            layers = _layers[key]
            position = layers.index(p)
            if position == len(layers) - 1:
                _restore(p.owner, p.attr, p.original)
            else:  # a newer layer stays: it now sits on what this one replaced
                layers[position + 1].original = p.original
            del layers[position]
            if not layers:
                del _layers[key]
            _order.remove(p)
        return len(undone)


def applied(group: Optional[str] = None) -> List[str]:
    """``"group: owner.name"`` (``"group: name"`` for a recorded change) for each change in
    place now, oldest first."""
    def where(p: Entry) -> str:
        if isinstance(p.owner, dict):
            return f"{p.name} = {p.replacement!r}"[:100]
        return p.name

    with _lock:
        return [f"{p.group}: {where(p)}" for p in _order if group is None or p.group == group]


def ledger(group: Optional[str] = None) -> List[Entry]:
    """The entries of the changes in place now, oldest first."""
    with _lock:
        return [p for p in _order if group is None or p.group == group]


def record_host_allocator_redirect() -> Entry:
    """Enters the CPU allocator wrapper ``torch_npu._C`` installs when it loads (its
    PYBIND11_MODULE calls ``npu::ops::installHostAllocatorRedirect``, host_execution.cpp)."""
    return record(
        "c10::SetCPUAllocator(npu::ops::HostAllocatorRedirect)", group="host_execution",
        reason="npu kernels that run PyTorch's CPU kernels on npu memory need the CPU kernel's output allocations "
               "served by the npu allocator; c10 has no per-call allocator hook, so the process's CPU allocator is "
               "wrapped (it forwards to the original outside an npu kernel)",
        checked=("2.13",))   # no undo: the wrapper may own live allocations; C++ checks it is in place
