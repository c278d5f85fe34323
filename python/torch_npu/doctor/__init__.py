"""``torch_npu doctor``: run a model on the npu and get a report of what to fix.

From the shell, a script written for the CPU or CUDA runs unchanged on the npu::

    python -m torch_npu.doctor train.py --epochs 1          # or: torch_npu-doctor train.py ...
    python -m torch_npu.doctor --html report.html --json report.json train.py

In code::

    with torch_npu.doctor.Doctor() as d:
        for batch in loader:
            ...
            optimizer.step()          # each optimizer step is one iteration
    print(d.report())
    for finding in d.findings:
        print(finding.kind, finding.where, finding.remedy)

Without an optimizer (inference, evaluation, generation, a data pipeline), the
iterations are those of the script's hot loop, found from the lines that launch npu
work; ``Doctor(steps_at="file.py:LINE")`` names the line whose every run is one.

Each finding names its kind (CPU fallback, host-to-device copy, hidden sync,
launch-bound line, strided copy, float64, memory growth, wrong result), how often
it happened, what it cost, the user's source line and what to change; those that
cost under 1% of the run's npu op time are marked ``minor`` and come last.
``Doctor(compare=True)`` also runs every npu op on the cpu and reports the ops
whose results differ.

While a Doctor runs, its wrappers of the host-sync functions (``torch.npu.synchronize``
and the streams' and events', ``torch.Tensor.__repr__``) are in place through
:mod:`torch_npu._patches`, in the group ``"doctor"``; it undoes them when it stops.
"""
import functools
import sys
import time
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from .._core import patches as _patches
from .. import fallback as _fallback
from . import _compiled, _findings, _monitor, _quiet
from ._compare import Comparator
from ._findings import KINDS, Finding
from ._report import Report, Run

__all__ = ["Doctor", "Finding", "Report", "KINDS"]

GROUP = "doctor"   # the torch_npu._patches group of a Doctor's wrappers


class Doctor:
    """Watches the npu work of the code run inside it (a context manager).

    compare:  run every npu op on the cpu too and report results that differ (slow).
    profile:  profile three iterations with torch_npu.profiler for host vs device time per op.
    progress: keep a progress line on stderr (steps, ops, elapsed).
    script:   the name shown in the report's header.
    target:   a chip profile name ("ascend910b2", ...): the report ends with that chip's verdict
              (ops that fall back there, the step's time projected there) and the findings are
              ranked by their projected cost on it. Exact when the npu runs as that chip
              (``NPU_EMU_PROFILE``, ``torch.npu.set_profile``; the CLI's ``--target`` does this);
              otherwise derived from this run, with what is not exact said. The CLI's default
              is ascend910b2; here the default is none.
    also_targets: more chip profile names, answered from this run (``Report.also``).
    steps_at: "FILE:LINE" (or (file, line)): each time that line of the script runs is one
              iteration (a step), instead of the optimizer's steps; FILE is a path, or the end of
              one (``train.py`` matches ``/work/train.py``). Lines are traced with
              ``sys.settrace`` while the Doctor runs, which slows Python code down somewhat.

    What an iteration is: the optimizer's steps (of the first optimizer) when the code
    runs one; ``steps_at``'s line when given; ``step()`` when called. Otherwise the
    iterations of the hot loop of the code, found from the lines that launch npu work
    (a line of a frame launching work again after other lines did, with a call, copy or
    sync in between), so that inference, evaluation, generation and data loops are
    judged per iteration too.
    """

    def __init__(self, compare=False, profile=True, progress=False, script=None, steps_at=None, target=None,
                 also_targets=()):
        self.compare, self.profile, self.progress = compare, profile, progress
        self._chip = _check_target(target) if target is not None else None
        self.target = target
        self.also_targets = [t for t in also_targets if t != target]
        for name in self.also_targets:
            _check_target(name)
        self.script = script or (sys.argv[0] if sys.argv and sys.argv[0] else "<python>")
        self.steps_at = _parse_steps_at(steps_at) if steps_at is not None else None
        self.findings = []
        self.run = None
        self._active = False
        self._script_error = None
        self._own_time = []   # (start, end) ns of the doctor's work between ops, on the profiler's clock

    # ---- the context manager ----

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.stop(error=exc)
        return False

    def start(self):
        if self._active:
            raise RuntimeError("torch_npu.doctor: this Doctor is already running")
        torch.npu.init()
        self._active = True
        self._undo = []
        self._stats_before = _fallback.NPUFallbackMode.get_fallback_stats()
        self._compile_before = _compiled.snapshot()
        self._comparator = Comparator() if self.compare else None
        from .._emu import profiles as _profiles
        saturating = [_profiles.load(t) for t in [self.target, *self.also_targets] if t is not None]
        self.monitor = _monitor.Monitor(self._comparator, watch_overflow=any(not c.inf_nan for c in saturating)
                                        or not _profiles.active().inf_nan)
        # What marks the iterations: "loop" (found), "optimizer", "manual" (step()), "line" (steps_at).
        self.clock = "line" if self.steps_at is not None else "loop"
        self.monitor.on_loop_step = self._loop_step
        self.monitor.on_loop_switch = self._loop_switch
        self._profiler = None
        if self.target is not None:
            from ..profiler import set_projection_target
            set_projection_target(self.target)   # the profiled steps are projected onto the target
            self._undo_projection = lambda: set_projection_target(None)
        # A Doctor started inside a running one gets a group of its own: stopping it
        # leaves the outer one's wrappers (under its own) in place.
        self._group = GROUP if not _patches.applied(GROUP) else f"{GROUP}:{id(self):x}"
        try:
            self._undo.append(_monitor.install_fallback_observer(self.monitor))
            self._watch_steps()
            group = self._group
            self._undo.append(lambda: _patches.undo(group))
            self._watch_host_syncs()
            self._watch_backward()
            self._undo.append(_quiet.filter_warnings())
            if self.steps_at is not None:
                self._undo.append(_monitor.trace_line(*self.steps_at, self._tick))
            self._profiler = self._start_profiler() if self.profile else None
        except BaseException:
            self._active = False
            for undo in reversed(self._undo):
                undo()
            raise
        self._sampler = _monitor.Sampler(self.monitor, self.progress)
        self._sampler.start()
        self._wall_start = time.perf_counter()
        self.monitor.__enter__()

    def script_failed(self, error):
        """The script being watched stopped with ``error`` (the CLI catches it inside the
        ``with`` block): the report includes it, and a chip's refusal becomes a finding."""
        self._script_error = error

    def step(self):
        """Marks the end of one iteration (optimizer steps do this by themselves)."""
        if self.clock == "loop":
            self.clock = "manual"
            if self.monitor.step:   # iterations of a loop found before: step() marks them from now on
                self.monitor.restart_steps()
        self._tick()

    def _tick(self):
        start = time.time_ns()   # the profiler's clock
        self.monitor.on_step()
        if self._profiler is not None:
            if self._profiler.step_num < 6:   # the window's start and end (Kineto logs them)
                with _quiet.native_stderr():
                    self._profiler.step()
            else:
                self._profiler.step()
        # The doctor's own time between the script's ops: not the script's Python.
        self._own_time.append((start, time.time_ns()))

    def _loop_step(self):
        if self.clock == "loop":   # no optimizer step, step() or steps_at so far
            self._tick()

    def _loop_switch(self):
        """Another loop's iterations are the steps (a loop over layers came first): count again,
        and profile that loop's iterations."""
        if self.clock != "loop" or not self.monitor.step:
            return
        self.monitor.restart_steps()
        if self._profiler is not None:
            try:
                self._profiler.stop()
            except Exception:  # noqa: BLE001  a profiler problem must not cost the run
                pass
            self._profiler = self._start_profiler()

    def stop(self, error=None):
        if not self._active:
            return
        self._active = False
        device_error = None
        try:
            self.monitor.__exit__(None, None, None)
            try:
                torch.npu.synchronize()   # an error of queued npu work surfaces here
            except Exception as e:  # noqa: BLE001  reported, not raised: the report must survive it
                device_error = e
            wall = time.perf_counter() - self._wall_start
        finally:
            # Whatever happens, the process is left as it was found.
            for undo in reversed(self._undo):
                try:
                    undo()
                except Exception:  # noqa: BLE001  one failed undo must not leave the others installed
                    pass
            self.monitor.forget_frames()
            self._sampler.stop()
            profile = self._stop_profiler()
            if self.target is not None:
                self._undo_projection()
        stats_after = _fallback.NPUFallbackMode.get_fallback_stats()
        self.run = Run.collect(self, wall, stats_after, profile, error or self._script_error or device_error)
        # What the steps were: "optimizer", "manual" (step()), "line" (steps_at) or "loop" (the
        # iterations of primary_loop, found); None: no steps.
        self.run.clock = self.clock if self.monitor.step else None
        self.run.loop = self.monitor.primary_loop if self.clock == "loop" else None
        self.run.compile = _compiled.delta(self._compile_before, _compiled.snapshot())
        self.run.target = self.target
        from .._emu import profiles as _profiles
        active = _profiles.active().name
        if self.target is not None:
            self.run.target_name = self._chip.device_name
            if not self._chip.inf_nan:
                self.run.saturating_chip = self._chip.device_name
        self.findings = _findings.diagnose(self.run)
        if self.target is not None:
            from ._target import rank
            self.run.verdict = rank(self.run, self.findings, self.target, exact=self.target == active)
        if self.also_targets:
            from ._target import verdict
            self.run.also = [verdict(self.run, t, exact=t == active) for t in self.also_targets]
        self.run.findings = self.findings

    def report(self) -> Report:
        """The report of the finished run: str() it, or .to_json(path) / .to_html(path)."""
        if self.run is None:
            raise RuntimeError("torch_npu.doctor: the report exists once the Doctor has stopped "
                               "(leave the `with` block first)")
        return Report(self.run)

    # ---- what the dispatch mode cannot see ----

    def _watch_steps(self):
        counted = [lambda: None]   # a weak reference to the optimizer whose steps are counted

        def after_step(optimizer, args, kwargs):
            # Several optimizers (a GAN) step once each per iteration: count one of them,
            # the first, until it is gone (a new optimizer per fold takes over).
            if counted[0]() is None:
                counted[0] = weakref.ref(optimizer)
            if counted[0]() is optimizer and self.clock != "line":
                if self.clock == "loop":
                    # The iterations are the optimizer's from now on: a loop found before the
                    # first step (inside it, or a warm-up) does not count.
                    self.clock = "optimizer"
                    if self.monitor.step:
                        self.monitor.restart_steps()
                self._tick()

        handle = register_optimizer_step_post_hook(after_step)
        self._undo.append(handle.remove)

    def _patch(self, owner, name, wrapper, *, expects, reason):
        """``owner.name = wrapper(its value)`` until this Doctor stops; returns that value."""
        original = getattr(owner, name)
        _patches.patch(owner, name, wrapper(original), self._group, reason=reason, checked=("2.13",),
                       expects=expects)
        return original

    def _watch_host_syncs(self):
        monitor = self.monitor

        def counted(kind):
            def wrap(fn):
                @functools.wraps(fn)
                def waits(*args, **kwargs):
                    caller = sys._getframe(1)
                    if _monitor._is_internal(caller.f_code.co_filename):   # torch's own, the profiler's
                        return fn(*args, **kwargs)
                    start = time.perf_counter_ns()
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        monitor.on_host_sync(kind, caller, 0, time.perf_counter_ns() - start)
                return waits
            return wrap

        npu = torch.npu
        why = "the doctor counts the host's waits for the npu, which no hook of PyTorch's reports"
        self._patch(npu, "synchronize", counted("synchronize"), expects="(device=None)", reason=why)
        if torch.cuda.synchronize is not _patches.original(torch.cuda, "synchronize"):
            # transfer_to_npu made it the npu's (a wrapper): the script's calls are counted too
            self._patch(torch.cuda, "synchronize", counted("synchronize"), expects="(device=None)", reason=why)
        self._patch(npu.Stream, "synchronize", counted("synchronize"), expects="method_descriptor", reason=why)
        self._patch(npu.Event, "synchronize", counted("synchronize"), expects="method_descriptor", reason=why)

        def watch_repr(fn):
            @functools.wraps(fn)
            def __repr__(tensor, *args, **kwargs):
                if tensor.device.type == "npu":   # printing reads the values: waits for the npu
                    monitor.on_host_sync("print", sys._getframe(1), tensor.numel() * tensor.element_size())
                return fn(tensor, *args, **kwargs)
            return __repr__

        self._patch(torch.Tensor, "__repr__", watch_repr, expects="(self, *, tensor_contents=None)",
                    reason="printing an npu tensor waits for the npu to read its values; the doctor counts that "
                           "wait, which no hook of PyTorch's reports")

    def _watch_backward(self):
        monitor = self.monitor

        def named(fn):
            @functools.wraps(fn)
            def backward(*args, **kwargs):
                monitor.on_backward(sys._getframe(1))
                try:
                    return fn(*args, **kwargs)
                finally:
                    monitor.on_backward(None)
            return backward

        self._patch(torch.autograd, "backward", named,
                    expects="(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None, "
                            "inputs=None)",
                    reason="the backward pass runs on autograd's threads, where no Python frame names a line: the "
                           "doctor reports an op with no forward line at the line that called backward()")

    # ---- the profiler window ----

    def _start_profiler(self):
        from .. import profiler
        prof = profiler.profile(activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.NPU],
                                schedule=profiler.schedule(wait=1, warmup=1, active=3, repeat=1))
        with _quiet.native_stderr():   # Kineto's own log lines (USDT: ...) are not the report's
            prof.start()
        return prof

    def _stop_profiler(self):
        """Host and device time per op of the profiled steps, and the profiler's analysis."""
        prof = self._profiler
        if prof is None:
            return None
        try:
            with _quiet.native_stderr():
                prof.stop()
            if prof.step_num < 3:   # the window (steps 2-4) never opened
                return None
            from .._emu import profiles as _profiles
            from ..profiler import _analyse, _projection, analyse
            # The host time of an op that launches nothing, as the doctor measured it (its
            # own dispatch mode adds to the profiler's figure for every op).
            op_host_us = self.monitor.pure_host_us()
            analysis = analyse(prof, op_host_us=op_host_us, not_python=self._own_time)
            projections = {}
            found = _analyse.projections(prof)
            if found:
                results = prof.profiler.kineto_results
                for name in [t for t in [self.target, *self.also_targets] if t is not None]:
                    projections[name] = _projection.project(results, found, _profiles.load(name), op_host_us,
                                                            not_python=self._own_time)
            per_op = {}
            for event in prof.key_averages():
                if "::" not in event.key:
                    continue
                host, device, count = per_op.get(event.key, (0.0, 0.0, 0))
                per_op[event.key] = (host + event.self_cpu_time_total, device + event.self_device_time_total,
                                     max(count, event.count))
            # Per op, its kernels' measured device time and their time projected onto the
            # target chip (when the window was projected: the doctor's --target).
            projected = {}
            for event in prof.events():
                own = vars(event).get("_npu_projected_us", 0.0)
                if own and event.device_type == torch.autograd.DeviceType.CPU:
                    measured, total = projected.get(event.name, (0.0, 0.0))
                    projected[event.name] = (measured + event.self_device_time_total, total + own)
            return {"steps": min(prof.step_num - 2, 3), "per_op_us": per_op, "analysis": analysis,
                    "per_op_projected_us": projected, "projections": projections}
        except Exception as e:  # noqa: BLE001  a profiler problem must not cost the report
            return {"error": f"{type(e).__name__}: {e}"}


def _check_target(name):
    """The chip profile ``name`` (a ValueError naming the chips when it is none)."""
    from .._emu import profiles as _profiles
    chip = _profiles.load(name)
    if chip.cost is None:
        raise ValueError(f"device profile {name!r} is no chip; pick one of "
                         + ", ".join(n for n in _profiles.names() if n != _profiles.GENERIC))
    return chip


def _parse_steps_at(where):
    """"train.py:42" or ("train.py", 42) -> (path, line)."""
    if isinstance(where, (tuple, list)) and len(where) == 2:
        path, line = where
    else:
        path, sep, line = str(where).rpartition(":")
        if not sep:
            raise ValueError(f"torch_npu.doctor: steps_at={where!r}: give FILE:LINE, e.g. 'train.py:42'")
    try:
        line = int(line)
    except (TypeError, ValueError):
        raise ValueError(f"torch_npu.doctor: steps_at={where!r}: the line must be a number") from None
    if line < 1 or not path:
        raise ValueError(f"torch_npu.doctor: steps_at={where!r}: give FILE:LINE with a line from 1")
    return str(path), line
