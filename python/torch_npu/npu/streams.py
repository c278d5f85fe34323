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

    @staticmethod
    def priority_range() -> tuple:
        """(lowest, highest) priority, as torch.cuda.Stream.priority_range(): (0, -1)."""
        return (0, -1)

    @property
    def npu_stream(self) -> int:
        """The runtime's stream, as an integer handle (torch.cuda.Stream.cuda_stream's counterpart)."""
        return _C._stream_handle(self.stream_id, self.device_index)

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


class ExternalStream(Stream):
    """A stream given by its handle (``Stream.npu_stream``), as torch.cuda.ExternalStream: work
    queued on it runs on that stream. The npu runtime wraps its own streams only."""

    def __new__(cls, stream_ptr: int, device: Any = None, **kwargs):
        index = _get_device_index(device)
        stream_id = _C._stream_of_handle(int(stream_ptr), index)
        return torch.Stream.__new__(cls, stream_id=stream_id, device_index=index, device_type=_C._device_type())


def get_stream_from_external(data_ptr: int, device: Any = None) -> Stream:
    """The stream of a handle (torch.cuda.get_stream_from_external): an ExternalStream."""
    return ExternalStream(data_ptr, device)


class Event(torch.Event):
    """An npu event: marks a point in a stream; can time and order streams.

    ``interprocess=True`` (as torch.cuda.Event's): the event can be shared with
    other processes (:meth:`ipc_handle`, :meth:`from_ipc_handle`, or sent through
    torch.multiprocessing); it cannot time.

    ``external=True`` (as torch.cuda.Event's): recorded or waited on a stream that
    captures a graph, the event becomes a record or wait of the graph itself, done at
    every replay (CUDA's external event nodes), instead of an order between streams
    at capture time. Outside a capture it is an ordinary event.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                external: bool = False):
        if external:
            if interprocess:
                raise ValueError("torch.npu.Event: an event cannot be both external and interprocess (as on CUDA, "
                                 "where external events live in one process's graphs); drop one of them")
            cls = _ExternalEvent if cls is Event else cls
        if interprocess:
            if enable_timing:
                raise ValueError("torch.npu.Event: an interprocess event cannot time (as CUDA's): create it with "
                                 "enable_timing=False")
            cls = _InterprocessEvent if cls is Event else cls
        self = super().__new__(cls, device=torch.device("npu"), enable_timing=enable_timing,
                               blocking=blocking, interprocess=interprocess)
        return self

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: bytes) -> "Event":
        """The event another process shared with :meth:`ipc_handle`, opened on ``device``."""
        event = Event(interprocess=True)
        event._ipc = _C._IpcEvent.open(_get_device_index(device), handle)
        return event

    def ipc_handle(self) -> bytes:
        """A handle another process opens with :meth:`from_ipc_handle` (``interprocess=True`` events only)."""
        raise RuntimeError("torch.npu.Event.ipc_handle: this event is not interprocess; create it with "
                           "torch.npu.Event(interprocess=True)")

    @property
    def npu_event(self) -> int:
        """The runtime's event, as an integer handle (torch.cuda.Event.cuda_event's counterpart);
        0 before the first record()."""
        return self.event_id

    def record(self, stream: Optional[torch.Stream] = None) -> None:
        super().record(current_stream() if stream is None else stream)

    def wait(self, stream: Optional[torch.Stream] = None) -> None:
        super().wait(current_stream() if stream is None else stream)

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds from this event to ``end_event`` (both recorded and completed)."""
        if isinstance(end_event, _InterprocessEvent):
            raise RuntimeError("Event.elapsed_time: interprocess events cannot time (as CUDA's)")
        return _C._event_elapsed_time(self, end_event)

    def __repr__(self) -> str:
        return f"<torch.npu.Event {self.event_id}>"


class _ExternalEvent(Event):
    """torch.npu.Event(external=True): on a capturing stream, record() and wait() are
    captured as nodes that record the event on, or make wait, the replaying stream at
    each replay (so streams outside the graph can order against it); elsewhere they are
    an ordinary event's."""

    def record(self, stream: Optional[torch.Stream] = None) -> None:
        stream = current_stream() if stream is None else stream
        if not _C._graph_event_node(self, stream.stream_id, stream.device_index, False):
            super().record(stream)

    def wait(self, stream: Optional[torch.Stream] = None) -> None:
        stream = current_stream() if stream is None else stream
        if not _C._graph_event_node(self, stream.stream_id, stream.device_index, True):
            super().wait(stream)

    def __repr__(self) -> str:
        return f"<torch.npu.Event external {self.event_id}>"


class _InterprocessEvent(Event):
    """torch.npu.Event(interprocess=True): the runtime's interprocess event (csrc/core/ipc.h),
    made at the first record() or ipc_handle(), on the stream's device or the current one."""

    _ipc = None

    def _event(self, device_index: Optional[int] = None):
        if self._ipc is None:
            self._ipc = _C._IpcEvent(current_device() if device_index is None else device_index)
        elif device_index is not None and device_index != self._ipc.device:
            raise ValueError(f"torch.npu.Event: this interprocess event belongs to npu:{self._ipc.device}; it "
                             f"cannot be recorded on a stream of npu:{device_index}")
        return self._ipc

    def ipc_handle(self) -> bytes:
        """A handle another process opens with :meth:`Event.from_ipc_handle`.

        If not recorded yet, the event uses the current device.
        """
        return self._event().ipc_handle()

    @property
    def device(self) -> torch.device:
        return torch.device("npu", self._event().device)

    def record(self, stream: Optional[torch.Stream] = None) -> None:
        stream = current_stream() if stream is None else stream
        self._event(stream.device_index).record(stream.stream_id, stream.device_index)

    def wait(self, stream: Optional[torch.Stream] = None) -> None:
        stream = current_stream() if stream is None else stream
        if self._ipc is not None:  # never recorded: nothing to wait for
            self._ipc.wait(stream.stream_id, stream.device_index)

    def query(self) -> bool:
        return self._ipc is None or self._ipc.query()

    def synchronize(self) -> None:
        if self._ipc is not None:
            self._ipc.synchronize()

    def elapsed_time(self, end_event: "Event") -> float:
        raise RuntimeError("Event.elapsed_time: interprocess events cannot time (as CUDA's)")

    def __repr__(self) -> str:
        return f"<torch.npu.Event interprocess {'npu:%d' % self._ipc.device if self._ipc else '(not made yet)'}>"


class ExternalEvent:
    """torch.npu.ExternalEvent (the Ascend adapter's): an event whose wait may come before its
    record. ``wait(stream)`` holds back the stream's later work until a record of the event
    runs, one issued before or after the wait, on any stream; each wait consumes one record
    (the adapter's "wait resets the event"), and ``reset(stream)`` drops records not yet
    consumed. All three are stream-ordered (None: the current stream). On a stream that
    captures a graph they are captured: at each replay the graph's stream waits for a record
    made outside the graph, typically on the stream that updates a task group
    (torch.npu.graph_task_update_begin). A wait whose record never comes fails after 300 s
    on the emulator (the chip would wait forever)."""

    def __init__(self):
        self._event = _C._ExternalEvent()

    def record(self, stream: Optional[torch.Stream] = None) -> None:
        stream = current_stream() if stream is None else stream
        _check_npu_stream(stream)
        self._event.record(stream.stream_id, stream.device_index)

    def wait(self, stream: Optional[torch.Stream] = None) -> None:
        stream = current_stream() if stream is None else stream
        _check_npu_stream(stream)
        self._event.wait(stream.stream_id, stream.device_index)

    def reset(self, stream: Optional[torch.Stream] = None) -> None:
        stream = current_stream() if stream is None else stream
        _check_npu_stream(stream)
        self._event.reset(stream.stream_id, stream.device_index)

    @property
    def npu_event(self) -> int:
        """The event's handle, as an integer."""
        return self._event.handle

    def __repr__(self) -> str:
        return f"<torch_npu.npu.ExternalEvent {self._event.handle:#x}>"


class SyncLaunchStream(Stream):
    """torch.npu.SyncLaunchStream (the Ascend adapter's): a stream whose launches bypass the
    adapter's host task queue, for saving a checkpoint after a device fault. The emulated npu
    has no such queue (every launch reaches the runtime at the call), so it behaves as any
    Stream; as on the adapter, the streams come from a pool of 4 per device, reused in turn."""

    _pool: dict = {}
    _POOL_SIZE = 4

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:
            return super().__new__(cls, device, priority, **kwargs)
        index = _get_device_index(device)
        streams, turn = cls._pool.setdefault((index, priority), ([], [0]))
        if len(streams) < cls._POOL_SIZE:
            made = Stream(index, priority)
            streams.append((made.stream_id, made.device_index, made.device_type))
        sid, dev, dtype = streams[turn[0] % len(streams)]
        turn[0] += 1
        return torch.Stream.__new__(cls, stream_id=sid, device_index=dev, device_type=dtype)

    def set_data_preprocess_stream(self, is_data_preprocess_stream: bool = False) -> None:
        """The adapter marks a data-preprocessing stream for its task queue; nothing to do here."""

    def __repr__(self) -> str:
        return f"<torch.npu.SyncLaunchStream device=npu:{self.device_index} stream_id={self.stream_id}>"


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
