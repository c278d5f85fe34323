"""Host functions in stream order (the Ascend adapter's torch_npu.npu._launch_host_func and
_subscribe_report): ``fn(user_data)`` runs when the stream reaches it, after the work queued
before it; captured into a graph, it runs at every replay. The emulated npu runs it on the
launching thread, holding the stream (torch_npu._C._run_in_stream_order): the caller returns
once it ran. As on the chip, a stream takes host functions only while subscribed."""
from typing import Any, Callable

import torch

from torch_npu import _C

_subscribed = set()


def _key(stream, what: str):
    if not isinstance(stream, torch.Stream) or stream.device.type != "npu":
        raise TypeError(f"torch_npu.npu.{what}: expected a torch.npu.Stream, got {type(stream).__name__}")
    return stream.device_index, stream.stream_id


def _subscribe_report(stream: torch.Stream) -> None:
    """Lets ``stream`` run host functions (on the chip: starts its callback thread)."""
    _subscribed.add(_key(stream, "_subscribe_report"))


def _unsubscribe_report(stream: torch.Stream) -> None:
    """Waits for the host functions queued on ``stream``, then stops it taking more."""
    key = _key(stream, "_unsubscribe_report")
    if key not in _subscribed:
        raise RuntimeError(f"torch_npu.npu._unsubscribe_report: {stream} is not subscribed "
                           f"(torch_npu.npu._subscribe_report(stream) first)")
    if not torch.npu.is_current_stream_capturing():
        stream.synchronize()
    _subscribed.discard(key)


def _launch_host_func(stream: torch.Stream, fn: Callable[[Any], Any], user_data: Any) -> None:
    """Calls ``fn(user_data)`` in ``stream``'s order (at each replay when the stream captures)."""
    key = _key(stream, "_launch_host_func")
    if not callable(fn):
        raise TypeError(f"torch_npu.npu._launch_host_func: fn must be callable, got {type(fn).__name__}")
    if key not in _subscribed:
        raise RuntimeError(f"torch_npu.npu._launch_host_func: {stream} is not subscribed to host functions: call "
                           f"torch_npu.npu._subscribe_report(stream) once first (the chip needs it to run them)")
    with torch.npu.stream(stream):
        _C._run_in_stream_order(stream.device_index, "host_func", fn, user_data)


def _launch_host_func_pending(stream: torch.Stream, fn: Callable[[Any], Any], user_data: Any) -> None:
    """The adapter's variant for callbacks whose tensor arguments must be read when the stream
    reaches them: here every host function is called then, so it is :func:`_launch_host_func`."""
    _launch_host_func(stream, fn, user_data)
