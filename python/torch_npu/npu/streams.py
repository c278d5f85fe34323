"""Streams and events of the npu, as torch.cuda.Stream / torch.cuda.Event.

They are torch.Stream / torch.Event subclasses, so torch.accelerator and
device-generic code accept them too.
"""
from typing import Any, Optional

import torch

from torch_npu import _C

from ._device import _get_device_index, current_device


class Stream(torch.Stream):
    """An npu stream: kernels queued on it run in order, asynchronously to the host.

    ``priority`` 0 (default) or negative (higher priority).
    """

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:  # wrapping an existing stream: it must exist
            stream_id, index, device_type = (kwargs.get(k) for k in ("stream_id", "device_index", "device_type"))
            if device_type != _C._device_type():
                raise ValueError(f"torch.npu.Stream: device_type {device_type} is not the npu's "
                                 f"({_C._device_type()}); wrap only streams of npu devices")
            index = _get_device_index(index)
            _C._check_stream(stream_id, index)
            return super().__new__(cls, stream_id=stream_id, device_index=index, device_type=device_type)
        index = _get_device_index(device)
        return super().__new__(cls, device=torch.device("npu", index), priority=priority)

    @classmethod
    def _of(cls, stream_id: int, device_index: int, device_type: int) -> "Stream":
        """A stream the runtime just named (current_stream(), default_stream()): no checks."""
        return torch.Stream.__new__(cls, stream_id=stream_id, device_index=device_index, device_type=device_type)

    @property
    def priority(self) -> int:
        """0 (normal) or -1 (high), as given when the stream was created."""
        return _C._stream_priority(self.stream_id, self.device_index)

    def wait_event(self, event: "Event") -> None:
        """Work queued on this stream later waits for ``event``."""
        event.wait(self)

    def wait_stream(self, stream: "Stream") -> None:
        """Work queued on this stream later waits for all work now queued on ``stream``."""
        self.wait_event(stream.record_event())

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.npu.Stream device=npu:{self.device_index} stream_id={self.stream_id}>"


class Event(torch.Event):
    """An npu event: marks a point in a stream; can time and order streams."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, device=torch.device("npu"), enable_timing=enable_timing,
                               blocking=blocking, interprocess=interprocess)

    def record(self, stream: Optional[torch.Stream] = None) -> None:
        super().record(current_stream() if stream is None else stream)

    def wait(self, stream: Optional[torch.Stream] = None) -> None:
        super().wait(current_stream() if stream is None else stream)

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds from this event to ``end_event`` (both recorded and completed)."""
        return _C._event_elapsed_time(self, end_event)

    def __repr__(self) -> str:
        return f"<torch.npu.Event {self.event_id}>"


def current_stream(device: Any = None) -> Stream:
    return Stream._of(*_C._current_stream(_get_device_index(device)))


def default_stream(device: Any = None) -> Stream:
    return Stream._of(*_C._default_stream(_get_device_index(device)))


def _check_npu_stream(stream: torch.Stream) -> None:
    if not isinstance(stream, torch.Stream):
        raise TypeError(f"expected a torch.npu.Stream, got {type(stream).__name__}")
    if stream.device.type != "npu":
        raise ValueError(f"expected an npu stream, got a {stream.device.type} stream ({stream}); "
                         "create one with torch.npu.Stream()")


def set_stream(stream: Optional[torch.Stream]) -> None:
    """Makes ``stream`` the current stream of its device (None: no change)."""
    if stream is None:
        return
    _check_npu_stream(stream)
    _C._set_stream(stream.stream_id, stream.device_index)


class StreamContext:
    """Within the block, ``stream`` and its device are current (restored on exit)."""

    def __init__(self, stream: Optional[torch.Stream]):
        if stream is not None:
            _check_npu_stream(stream)
        self.stream = stream
        self.prev_device = -1
        self.prev_stream: Optional[Stream] = None
        self.prev_stream_on_target: Optional[Stream] = None

    def __enter__(self):
        if self.stream is None:
            return self.stream
        self.prev_device = current_device()
        self.prev_stream = current_stream(self.prev_device)
        target = self.stream.device_index
        if target != self.prev_device:
            _C._set_device(target)
            self.prev_stream_on_target = current_stream(target)
        set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        if self.prev_stream_on_target is not None:
            set_stream(self.prev_stream_on_target)
            _C._set_device(self.prev_device)
        set_stream(self.prev_stream)
        return False


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    """``with torch.npu.stream(s):`` queues the block's npu work on ``s``."""
    return StreamContext(stream)
