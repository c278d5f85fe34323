"""What the doctor watches while a script runs on the npu.

A ``TorchDispatchMode`` sees every aten op after PyTorch's decompositions (what
reaches the device), with its arguments, on the thread that launched it, so the
Python stack at that moment names the user's source line. The C++ fallback tells
the fallback observers why an op went to the CPU; optimizer steps mark the
iterations; a sampler thread records npu memory over time and shows progress.
Everything is aggregated per source line (a ``Site``): the findings are rules over
these counters (``_findings.py``).
"""
import collections
import os
import sys
import threading
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import fallback as _fallback

_aten = torch.ops.aten

# ---- which frames are the user's -------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_NPU_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
# Frames between a tensor method called on the user's line and the dispatch mode:
# an op that comes through only these was called directly by that line.
_PLUMBING = tuple(os.path.join(_TORCH_DIR, p) for p in (
    "_dynamo/eval_frame.py", "_compile.py", "utils/_python_dispatch.py", "_tensor.py", "functional.py",
    "nn/functional.py", "overrides.py", "_jit_internal.py", "utils/_device.py")) + (
    os.path.join(_NPU_DIR, "contrib"), os.path.join(_NPU_DIR, "doctor"))


def _is_internal(filename):
    if filename.startswith(_TORCH_DIR) or filename.startswith(_NPU_DIR) or filename.startswith("<frozen"):
        return True
    return filename.startswith(_STDLIB_DIR) and "-packages" not in filename


def is_library(filename):
    """Installed packages: their lines are reported, but they are not the user's to rewrite."""
    return "site-packages" in filename or "dist-packages" in filename


_internal_code = {}   # code object -> (internal, plumbing)


def user_frame(frame):
    """(the innermost frame of user code at or above ``frame``, whether only plumbing
    frames lie between them)."""
    direct = True
    while frame is not None:
        code = frame.f_code
        kind = _internal_code.get(code)
        if kind is None:
            name = code.co_filename
            kind = _internal_code[code] = (_is_internal(name), name.startswith(_PLUMBING))
        if not kind[0]:
            return frame, direct
        direct = direct and kind[1]
        frame = frame.f_back
    return None, False


# ---- per-line counters -----------------------------------------------------------

class Site:
    """Everything that happened on one line of user code."""

    __slots__ = ("file", "line", "library", "ops", "ns", "direct_ops", "direct_ns", "steps_hit", "last_step",
                 "call_frame", "call_ops", "most_ops_per_call",
                 "h2d", "h2d_bytes", "h2d_ns", "h2d_repeats", "h2d_seen", "h2d_steps", "h2d_last_step",
                 "syncs", "sync_ns", "sync_steps", "sync_last_step", "sync_kinds", "d2h_bytes",
                 "strided_copies", "strided_bytes", "strided_ns", "strided_writes", "strided_steps",
                 "strided_last_step", "strided_sources", "strided_repeats", "f64_created", "f64_ops", "f64_ns", "fallbacks", "fallback_dtypes", "op_names",
                 "kept_steps")

    def __init__(self, file, line):
        self.file, self.line = file, line
        self.library = is_library(file)
        self.ops = self.ns = self.direct_ops = self.direct_ns = self.steps_hit = 0
        self.last_step = -1
        # Direct ops of one execution of the enclosing function: a Python loop on this
        # line makes many, a line run once per layer (a new call each time) makes few.
        # The frame is held until the step ends (Monitor.on_step), not longer.
        self.call_frame, self.call_ops, self.most_ops_per_call = None, 0, 0
        self.h2d = self.h2d_bytes = self.h2d_ns = self.h2d_repeats = self.h2d_steps = 0
        self.h2d_last_step = -1
        self.h2d_seen = set()
        self.syncs = self.sync_ns = self.sync_steps = self.d2h_bytes = 0
        self.sync_last_step = -1
        self.sync_kinds = collections.Counter()
        self.strided_copies = self.strided_bytes = self.strided_ns = self.strided_writes = 0
        self.strided_steps = self.strided_repeats = 0
        self.strided_last_step = -1
        self.strided_sources = {}   # id(base tensor) -> (weak reference, the view and version copied)
        self.f64_created = self.f64_ops = self.f64_ns = 0
        self.fallbacks = collections.Counter()   # (op, reason) -> count
        self.fallback_dtypes = {}                # op -> dtypes of the npu inputs that fell back
        self.op_names = collections.Counter()
        self.kept_steps = 0                      # most distinct earlier steps with tensors still alive

    @property
    def where(self):
        return f"{self.file}:{self.line}"


def _nbytes(t):
    return t.numel() * t.element_size() if t.layout == torch.strided else 0


_returns_view = {}   # op -> whether it returns a view of an input (no kernel runs)


def _is_view_op(func):
    view = _returns_view.get(func)
    if view is None:
        view = _returns_view[func] = any(r.alias_info is not None and not r.alias_info.is_write
                                         for r in func._schema.returns)
    return view


def _content_key(t):
    """Identifies the data of a host tensor (a hash of its bytes; sampled when large),
    or None for what has no plain bytes (sparse, nested, quantized tensors)."""
    if t.layout != torch.strided or t.is_nested or t.is_quantized or t.dtype.is_complex:
        return None
    try:
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        if flat.numel() > (1 << 20):
            flat = torch.cat([flat[:1 << 16], flat[-(1 << 16):]])
        return (tuple(t.shape), t.dtype, hash(flat.numpy().tobytes()))
    except (RuntimeError, TypeError):
        return None


_DATA_DEPENDENT = {"aten::nonzero", "aten::masked_select", "aten::_unique2", "aten::unique_dim",
                   "aten::unique_consecutive", "aten::repeat_interleave", "aten::nonzero_static"}
_FLOAT64 = (torch.float64, torch.complex128)


class Monitor(TorchDispatchMode):
    """Collects per-line counters for every op that touches an npu tensor."""

    def __init__(self, compare=None):
        super().__init__()
        self.sites = {}
        self.op_calls = collections.Counter()     # op -> calls on the npu
        self.op_ns = collections.Counter()        # op -> host ns
        self.total_ops = 0
        self.step = 0                             # optimizer steps (or Doctor.step()) so far
        self.step_memory = []                     # (step, seconds, allocated, reserved) after each step
        self.step_times = []
        self.compare = compare                    # a _compare.Comparator or None
        self._current = None                      # the site, args and float64-ness of the op now running
        self._current_args = ()
        self._current_f64 = False
        self._live = {}                           # id(weakref) -> (site, step): npu tensors made by ops
        self._start = time.perf_counter()

    # ---- the dispatch mode ----

    def _site(self, frame):
        key = (frame.f_code.co_filename, frame.f_lineno)
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = Site(*key)
        return site

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        npu_args, f64_in = self._scan(args, kwargs)
        if not npu_args and not self._makes_npu(func, kwargs):
            return func(*args, **kwargs)
        frame, direct = user_frame(sys._getframe(1))
        site = self._site(frame) if frame is not None else self._site_unknown()
        name = func._schema.name
        previous = self._current, self._current_args, self._current_f64
        self._current, self._current_args, self._current_f64 = site, args, f64_in
        comparing = self.compare is not None and self.compare.wants(func)
        if comparing:
            host_args, host_kwargs = self.compare.to_host(args, kwargs)
        start = time.perf_counter_ns()
        try:
            out = func(*args, **kwargs)
        finally:
            self._current, self._current_args, self._current_f64 = previous
        ns = time.perf_counter_ns() - start
        if comparing:
            self.compare.check(func, args, kwargs, out, host_args, host_kwargs, site)

        self.total_ops += 1
        self.op_calls[name] += 1
        self.op_ns[name] += ns
        site.ops += 1
        site.ns += ns
        site.op_names[name] += 1
        if site.last_step != self.step:
            site.last_step = self.step
            site.steps_hit += 1
        if direct and not _is_view_op(func):
            site.direct_ops += 1
            site.direct_ns += ns
            if site.call_frame is not frame:
                site.call_frame, site.call_ops = frame, 0
            site.call_ops += 1
            site.most_ops_per_call = max(site.most_ops_per_call, site.call_ops)
        self._classify(func, name, args, kwargs, out, site, ns, direct, f64_in)
        return out

    def _site_unknown(self):
        key = ("<unknown>", 0)
        if key not in self.sites:
            self.sites[key] = Site(*key)
        return self.sites[key]

    @staticmethod
    def _scan(args, kwargs):
        """(whether an npu tensor is among the arguments, whether a float64 one is)."""
        npu = f64 = False
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                if a.device.type == "npu":
                    npu = True
                    f64 = f64 or a.dtype in _FLOAT64
            elif isinstance(a, (list, tuple)):
                for t in a:
                    if isinstance(t, torch.Tensor) and t.device.type == "npu":
                        npu = True
                        f64 = f64 or t.dtype in _FLOAT64
        return npu, f64

    @staticmethod
    def _makes_npu(func, kwargs):
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "npu"

    def _classify(self, func, name, args, kwargs, out, site, ns, direct, f64_in):
        first = args[0] if args else None
        # Host <-> device copies, and reads of device values on the host (syncs).
        if name == "aten::_to_copy" and isinstance(first, torch.Tensor):
            target = kwargs.get("device")
            if first.device.type == "cpu" and isinstance(out, torch.Tensor) and out.device.type == "npu":
                self._host_to_device(site, first, ns)
            elif first.device.type == "npu" and target is not None and torch.device(target).type == "cpu":
                self._sync(site, ns, "copy", _nbytes(first))
        elif name == "aten::copy_" and len(args) > 1:
            dst, src = args[0], args[1]
            if dst.device.type == "npu" and src.device.type == "cpu":
                self._host_to_device(site, src, ns)
            elif dst.device.type == "cpu" and src.device.type == "npu":
                self._sync(site, ns, "copy", _nbytes(src))
            # (a copy into a strided slice is how buffers such as a KV cache are filled: not a trap)
        elif name == "aten::lift_fresh":  # torch.tensor(data, device="npu"): host data copied in
            self._host_to_device(site, None, ns, out)
        elif name == "aten::_local_scalar_dense":
            self._sync(site, ns, "scalar", 0)
        elif name in _DATA_DEPENDENT or (name == "aten::index" and self._bool_index(args)):
            self._sync(site, ns, "shape", 0)
        elif (direct and name == "aten::clone" and isinstance(first, torch.Tensor) and first.layout == torch.strided
              and not first.is_contiguous()):
            self._strided(site, ns, write=False, nbytes=_nbytes(first), source=first)
        elif (direct and func._schema.is_mutable and isinstance(first, torch.Tensor) and first.device.type == "npu"
              and first.layout == torch.strided and not first.is_contiguous() and first.numel() > 1):
            self._strided(site, ns, write=True, nbytes=_nbytes(first))

        # float64: where it enters the device, and every op it costs.
        outs = out if isinstance(out, (list, tuple)) else (out,)
        f64_out = any(isinstance(o, torch.Tensor) and o.dtype in _FLOAT64 for o in outs)
        if f64_in or f64_out:
            site.f64_ops += 1
            site.f64_ns += ns
            if f64_out and not f64_in:
                site.f64_created += 1
        self._track(outs, args, kwargs, site)

    @staticmethod
    def _bool_index(args):
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())

    def _host_to_device(self, site, host, ns, device_tensor=None):
        site.h2d += 1
        site.h2d_ns += ns
        if site.h2d_last_step != self.step:
            site.h2d_last_step = self.step
            site.h2d_steps += 1
        if host is not None:
            site.h2d_bytes += _nbytes(host)
            key = _content_key(host)
        else:
            site.h2d_bytes += _nbytes(device_tensor)
            # Small constants are what gets rebuilt in loops; reading them back is cheap.
            small = device_tensor.layout == torch.strided and device_tensor.numel() <= 4096
            key = _content_key(device_tensor.cpu()) if small else None
        if key is not None:
            if key in site.h2d_seen:
                site.h2d_repeats += 1
            elif len(site.h2d_seen) < 64:
                site.h2d_seen.add(key)

    def _sync(self, site, ns, kind, nbytes):
        site.syncs += 1
        site.sync_ns += ns
        site.sync_kinds[kind] += 1
        site.d2h_bytes += nbytes
        if site.sync_last_step != self.step:
            site.sync_last_step = self.step
            site.sync_steps += 1

    def _strided(self, site, ns, write, nbytes, source=None):
        if write:
            site.strided_writes += 1
        else:
            site.strided_copies += 1
            # The same view of the same, unchanged tensor copied again: the copy could be made once.
            base = source._base if source._base is not None else source
            view = (source.storage_offset(), tuple(source.shape), tuple(source.stride()), source._version)
            seen = site.strided_sources.get(id(base))
            if seen is not None and seen[0]() is base and seen[1] == view:
                site.strided_repeats += 1
            else:
                if len(site.strided_sources) >= 64:   # forget the tensors that are gone
                    site.strided_sources = {k: v for k, v in site.strided_sources.items() if v[0]() is not None}
                if len(site.strided_sources) < 64:
                    site.strided_sources[id(base)] = (weakref.ref(base), view)
        site.strided_bytes += nbytes
        site.strided_ns += ns
        if site.strided_last_step != self.step:
            site.strided_last_step = self.step
            site.strided_steps += 1

    def _track(self, outs, args, kwargs, site):
        """Remembers which line made each new npu tensor, to name what is kept alive
        (not the inputs an in-place or out= op returns)."""
        for o in outs:
            if (isinstance(o, torch.Tensor) and o.device.type == "npu" and not o._is_view()
                    and not any(o is a for a in args) and not any(o is a for a in kwargs.values())):
                live = self._live
                ref = weakref.ref(o, lambda r, live=live: live.pop(id(r), None))
                live[id(ref)] = (ref, site, self.step)

    # ---- events from outside the dispatch mode ----

    def on_fallback(self, op, reason):
        site = self._current
        if site is None:  # an op the mode did not see (printing runs with modes off)
            frame, _ = user_frame(sys._getframe(1))
            site = self._site(frame) if frame is not None else self._site_unknown()
        if reason == "dtype" and self._current_f64:
            reason = "float64"
        site.fallbacks[(op, reason)] += 1
        dtypes = site.fallback_dtypes.setdefault(op, set())
        for a in self._current_args:
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(t, torch.Tensor) and t.device.type == "npu":
                    dtypes.add(str(t.dtype).replace("torch.", ""))

    def on_host_sync(self, kind, frame, nbytes=0, ns=0):
        """A wait the dispatch mode cannot see: synchronize(), printing a tensor."""
        frame, _ = user_frame(frame)
        site = self._site(frame) if frame is not None else self._site_unknown()
        self._sync(site, ns, kind, nbytes)

    def release_frames(self):
        for site in self.sites.values():
            site.call_frame = None

    def on_step(self):
        self.release_frames()
        self.step += 1
        now = time.perf_counter() - self._start
        self.step_times.append(now)
        if torch.npu.is_initialized():
            self.step_memory.append((self.step, now, torch.npu.memory_allocated(), torch.npu.memory_reserved()))
        self._count_kept()

    def _count_kept(self):
        """Per line: in how many earlier steps did it make tensors that are still alive?"""
        old = self.step - 2   # this step's and the last one's tensors may be in use
        steps = collections.defaultdict(set)
        for ref, site, made in list(self._live.values()):
            if made <= old and made > 0 and ref() is not None:
                steps[site].add(made)
        for site, made in steps.items():
            site.kept_steps = max(site.kept_steps, len(made))


class Sampler(threading.Thread):
    """Samples npu memory over time and keeps a progress line on stderr."""

    def __init__(self, monitor, progress, interval=0.1):
        super().__init__(name="torch_npu.doctor sampler", daemon=True)
        self.monitor, self.progress, self.interval = monitor, progress, interval
        self.memory = []     # (seconds, allocated, reserved)
        self._done = threading.Event()
        self._tty = progress and sys.stderr.isatty()

    def run(self):
        start = time.perf_counter()
        last_line = start
        while not self._done.wait(self.interval):
            now = time.perf_counter()
            if torch.npu.is_initialized():
                self.memory.append((now - start, torch.npu.memory_allocated(), torch.npu.memory_reserved()))
            if self.progress and (self._tty or now - last_line >= 10):
                last_line = now
                line = (f"[torch_npu doctor] step {self.monitor.step} | {self.monitor.total_ops:,} npu ops | "
                        f"{now - start:.1f} s")
                sys.stderr.write(("\r" + line) if self._tty else line + "\n")
                sys.stderr.flush()

    def stop(self):
        self._done.set()
        self.join()
        if self._tty:
            sys.stderr.write("\r" + " " * 72 + "\r")
            sys.stderr.flush()


def install_fallback_observer(monitor):
    _fallback._observers.append(monitor.on_fallback)
    return lambda: _fallback._observers.remove(monitor.on_fallback)
