"""The one place where torch_npu changes PyTorch's own Python objects.

Every replacement of an attribute of torch (a function, a method, a class) goes
through :func:`patch` or :func:`wrap`, which remember what was there, so
``undo(group)`` puts PyTorch back exactly as it was and ``applied()`` lists what
is changed now. A group names the feature that asked ("transfer_to_npu",
"profiler", ...). An owner may also be a dict (a registry of PyTorch's, such as
TorchScript's table of builtins): ``name`` is then a key.

Groups may change the same attribute: each change is a layer over the one
before it. Undoing the newest layer restores the value under it; undoing an
older one leaves the newer value in place (which, if made by :func:`wrap`,
still calls the older one) and makes undoing the newer one restore what the
older layer had replaced.
"""
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

_INHERITED = object()  # the attribute was not the owner's own: undo deletes the patch


@dataclass
class _Patch:
    group: str
    owner: Any
    name: Any
    original: Any      # the value under this layer, as stored (or _INHERITED)
    replacement: Any


_lock = threading.RLock()
_layers: Dict[Tuple[int, Any], List[_Patch]] = {}  # (id(owner), name) -> its layers, oldest first
_order: List[_Patch] = []                           # every layer, oldest first


def _own_value(owner: Any, name: Any) -> Any:
    if isinstance(owner, dict):
        return owner.get(name, _INHERITED)
    namespace = getattr(owner, "__dict__", None)
    if namespace is not None and name in namespace:
        return namespace[name]  # as stored: a staticmethod stays a staticmethod
    return _INHERITED


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


def patch(owner: Any, name: Any, replacement: Any, group: str) -> Any:
    """Sets ``owner.name = replacement`` for ``group``; returns the value it replaces.

    Patching the same attribute again in the same group keeps that group's
    first original, so undo restores the value from before the group's changes.
    """
    with _lock:
        previous = _get(owner, name)
        layers = _layers.setdefault((id(owner), name), [])
        if layers and layers[-1].group == group:
            layers[-1].replacement = replacement
        else:
            p = _Patch(group, owner, name, _own_value(owner, name), replacement)
            layers.append(p)
            _order.append(p)
        _set(owner, name, replacement)
        return previous


def wrap(owner: Any, name: Any, make: Callable[[Any], Any], group: str) -> Any:
    """Replaces ``owner.name`` by ``make(current value)``, once per group; returns the wrapper."""
    with _lock:
        for p in _layers.get((id(owner), name), ()):
            if p.group == group:
                return p.replacement
        replacement = make(_get(owner, name))
        patch(owner, name, replacement, group)
        return replacement


def original(owner: Any, name: Any) -> Any:
    """What ``owner.name`` was before torch_npu changed it (its value now, if unchanged)."""
    with _lock:
        layers = _layers.get((id(owner), name))
        if not layers:
            return _get(owner, name)
        value = layers[0].original
    if value is _INHERITED:
        for base in getattr(owner, "__mro__", ())[1:]:
            if name in vars(base):
                return vars(base)[name]
        return None
    return value


def undo(group: Optional[str] = None) -> int:
    """Restores what ``group`` (or every group) changed, newest first; returns how many."""
    with _lock:
        undone = [p for p in reversed(_order) if group is None or p.group == group]
        for p in undone:
            key = (id(p.owner), p.name)
            layers = _layers[key]
            position = layers.index(p)
            if position == len(layers) - 1:
                _restore(p.owner, p.name, p.original)
            else:  # a newer layer stays: it now sits on what this one replaced
                layers[position + 1].original = p.original
            del layers[position]
            if not layers:
                del _layers[key]
            _order.remove(p)
        return len(undone)


def applied(group: Optional[str] = None) -> List[str]:
    """``"group: owner.name"`` for each change in place now, oldest first."""
    def where(p: _Patch) -> str:
        if isinstance(p.owner, dict):
            return f"dict[{p.name!r}] = {p.replacement!r}"[:100]
        return f"{getattr(p.owner, '__name__', type(p.owner).__name__)}.{p.name}"

    with _lock:
        return [f"{p.group}: {where(p)}" for p in _order if group is None or p.group == group]
