"""What the doctor watches while a script runs on the npu.

A ``TorchDispatchMode`` sees every aten op after PyTorch's decompositions (what
reaches the device), with its arguments, on the thread that launched it, so the
Python stack at that moment names the user's source line. The C++ fallback tells
the fallback observers why an op went to the CPU; optimizer steps mark the
iterations (or, without an optimizer, the iterations of the script's loops found
from the lines that launch npu work: ``Monitor._boundary``); a sampler thread
records npu memory over time and shows progress. Everything is aggregated per
source line (a ``Site``): the findings are rules over these counters
(``_findings.py``).
"""
import collections
import dis
import gc
import linecache
import os
import re
import sys
import threading
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import fallback as _fallback
from .._C import _memory_stats

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


# The code inductor generates for torch.compile (its cache directory): its ops are
# the compiled function's, reported at the user's line that called it.
_INDUCTOR_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.sep + "torchinductor_"


def _is_internal(filename):
    if filename.startswith(_TORCH_DIR) or filename.startswith(_NPU_DIR) or filename.startswith("<frozen"):
        return True
    if _INDUCTOR_CACHE in filename:
        return True
    return filename.startswith(_STDLIB_DIR) and "-packages" not in filename


def is_library(filename):
    """Installed packages: not the user's to rewrite; their work is reported at the user's line
    that called them (``site_frame``)."""
    return "site-packages" in filename or "dist-packages" in filename


_library_code = {}   # code object -> whether it is an installed package's


def site_frame(frame):
    """(the frame an op is reported at, the library line it ran in or None): for a frame of an
    installed package, the user's line that called into it; when none called it (the whole
    program is a package's), the package's own line."""
    code = frame.f_code
    library = _library_code.get(code)
    if library is None:
        library = _library_code[code] = is_library(code.co_filename)
    if not library:
        return frame, None
    via = (code.co_filename, frame.f_lineno)
    f = frame.f_back
    while f is not None:
        code = f.f_code
        kind = _internal_code.get(code)
        if kind is None:
            name = code.co_filename
            kind = _internal_code[code] = (_is_internal(name), name.startswith(_PLUMBING))
        if not kind[0]:
            library = _library_code.get(code)
            if library is None:
                library = _library_code[code] = is_library(code.co_filename)
            if not library:
                return f, via
        f = f.f_back
    return frame, None


_internal_code = {}   # code object -> (internal, plumbing)


def user_frame(frame):
    """(the innermost frame of user code at or above ``frame``, whether only plumbing
    frames lie between them)."""
    frame, direct, _ = user_frame_and_call(frame)
    return frame, direct


def user_frame_and_call(frame):
    """user_frame's answer, and the frame just below the user's (the call into PyTorch the
    op comes from: a new one for each call of a module; None when it is the user frame)."""
    direct = True
    below = None
    while frame is not None:
        code = frame.f_code
        kind = _internal_code.get(code)
        if kind is None:
            name = code.co_filename
            kind = _internal_code[code] = (_is_internal(name), name.startswith(_PLUMBING))
        if not kind[0]:
            return frame, direct, below
        direct = direct and kind[1]
        below = frame
        frame = frame.f_back
    return None, False, None


# Work PyTorch does by itself inside one of its calls, not what the user's line asked
# for: GradScaler reads found_inf with .item() and takes the float64 reciprocal of the
# scale in scaler.step()/unscale_(); printing a tensor formats it with reductions in
# float64. The user cannot change these lines of PyTorch: they are left out.
_BEHALF = {"grad_scaler.py": frozenset({"step", "_maybe_opt_step", "unscale_", "_unscale_grads_", "update"}),
           "_tensor_str.py": None}   # None: any function of the file
_behalf_code = {}   # code object -> True (on the user's behalf), False (internal, go on), None (user code: stop)


def on_users_behalf(frame):
    """Is the op now running part of a PyTorch call that does this work itself
    (GradScaler.step, printing), between ``frame`` and the first user frame above it?"""
    while frame is not None:
        code = frame.f_code
        hit = _behalf_code.get(code, 0)
        if hit == 0:
            name = code.co_filename
            if not _is_internal(name):
                hit = None
            else:
                base = os.path.basename(name)
                hit = base in _BEHALF and (_BEHALF[base] is None or code.co_name in _BEHALF[base])
            _behalf_code[code] = hit
        if hit is None:
            return False
        if hit:
            return True
        frame = frame.f_back
    return False


# ---- what the user's line wrote, where it waits for the npu ----------------------

_positions = {}   # code object -> (its bytecode, co_positions() as a list)
_JUMPS = ("POP_JUMP", "JUMP_IF_", "UNARY_NOT")
_STOP = re.compile(r":\s*(break|return)\b")


def _instruction(frame):
    """(opcode name, (line, end line, column, end column)) of the instruction a user frame
    is executing: the call, jump or subscript that made the npu value a Python one."""
    code = frame.f_code
    cached = _positions.get(code)
    if cached is None:
        cached = _positions[code] = (code.co_code, list(code.co_positions()))
    raw, positions = cached
    i = frame.f_lasti
    while i > 0 and dis.opname[raw[i]] == "CACHE":   # a specialised call leaves f_lasti on its cache
        i -= 2
    if not 0 <= i < len(raw) or i // 2 >= len(positions):
        return "", (None, None, None, None)
    return dis.opname[raw[i]], positions[i // 2]


def _source_span(filename, position):
    line, end_line, col, end_col = position
    if line is None or col is None:
        return linecache.getline(filename, line).strip() if line else ""
    if end_line != line:
        return linecache.getline(filename, line)[col:].rstrip()
    return linecache.getline(filename, line)[col:end_col]


_DISTRIBUTIONS = os.path.join(_TORCH_DIR, "distributions") + os.sep


def _in_distribution_checks(caller, user):
    """Is the read torch.distributions checking its arguments (validate_args), between
    ``caller`` and the user's frame?"""
    frame = caller
    while frame is not None and frame is not user:
        code = frame.f_code
        if code.co_filename.startswith(_DISTRIBUTIONS) and code.co_name in ("__init__", "_validate_sample"):
            return True
        frame = frame.f_back
    return False


def sync_form(frame, kind):
    """How the user's line reads an npu value on the host: (form, expression, statement).

    form: "item" (.item()), "tolist", "to_host" (.cpu(), .numpy(), .to("cpu")), "convert"
    (int()/float()/bool() of a tensor), "branch" (if/while/and/or on a tensor), "stop" (the same,
    deciding whether to stop a loop: an end-of-sequence check), "index" (a 0-dim tensor used as an
    index or slice bound), "print" (printing or formatting a tensor), "call" (a function that reads
    one), "shape" (an op whose output shape depends on the data), "synchronize"."""
    opname, position = _instruction(frame)
    filename = frame.f_code.co_filename
    statement = linecache.getline(filename, position[0] or frame.f_lineno).strip()
    expr = _source_span(filename, position) or statement
    if kind in ("shape", "synchronize", "print"):
        form = kind
    elif opname.startswith(_JUMPS):
        form, expr = "branch", statement
    elif opname in ("BINARY_SUBSCR", "STORE_SUBSCR", "DELETE_SUBSCR", "BUILD_SLICE"):
        form = "index"
    elif opname == "FORMAT_VALUE":
        form = "print"
    else:
        text = expr.rstrip()
        if text.endswith(".item()"):
            form = "item"
        elif text.endswith(".tolist()"):
            form = "tolist"
        elif kind == "copy" or re.search(r"\.(cpu|numpy)\(\)$", text):
            form = "to_host"
        elif re.match(r"(int|float|bool|complex)\(", text):
            form = "convert"
        elif text.startswith("print("):
            form = "print"
        else:
            form = "call"
    if form in ("item", "convert", "branch", "call"):
        following = linecache.getline(filename, (position[0] or frame.f_lineno) + 1).strip()
        if (statement.startswith("while ") or _STOP.search(statement)
                or (statement.startswith(("if ", "elif ")) and following.startswith(("break", "return")))):
            form = "stop"
    return form, " ".join(expr.split()), statement


# ---- per-line counters -----------------------------------------------------------

class Site:
    """Everything that happened on one line of user code."""

    __slots__ = ("file", "line", "library", "ops", "ns", "direct_ops", "direct_ns", "steps_hit", "last_step",
                 "call_frame", "call_ops", "most_ops_per_call", "parent_frame", "parent_ops",
                 "h2d", "h2d_bytes", "h2d_ns", "h2d_repeats", "h2d_seen", "h2d_steps", "h2d_last_step",
                 "syncs", "sync_ns", "sync_steps", "sync_last_step", "sync_kinds", "d2h_bytes", "sync_gap_ns",
                 "strided_copies", "strided_bytes", "strided_ns", "strided_writes", "strided_steps",
                 "strided_last_step", "strided_sources", "strided_repeats", "f64_created", "f64_ops", "f64_ns",
                 "fallbacks", "fallback_dtypes", "op_names",
                 "kept_steps", "kept_bytes", "kept_graph", "holder", "loop", "loop_hits", "sync_forms", "sync_at",
                 "h2d_mark", "h2d_fresh", "h2d_fresh_ns", "h2d_fresh_bytes", "h2d_fresh_steps", "h2d_fresh_last_step",
                 "h2d_origins", "callers", "f16_ops", "bf16_ops", "f16_overflows", "via", "backward_ops",
                 "fallback_parents", "fallback_backward", "direct_small", "library_syncs")

    def __init__(self, file, line):
        self.file, self.line = file, line
        self.library = is_library(file)
        self.ops = self.ns = self.direct_ops = self.direct_ns = self.steps_hit = 0
        self.last_step = -1
        # Direct ops of one execution of the enclosing function: a Python loop on this
        # line makes many, a line run once per layer (a new call each time) makes few.
        # The frame is held until the step ends (Monitor.on_step), not longer.
        self.call_frame, self.call_ops, self.most_ops_per_call = None, 0, 0
        # ... and of the calls one execution of the user function that calls it makes: a
        # function of small ops called in a Python loop (a list comprehension over samples).
        self.parent_frame, self.parent_ops = None, 0
        self.h2d = self.h2d_bytes = self.h2d_ns = self.h2d_repeats = self.h2d_steps = 0
        self.h2d_last_step = -1
        self.h2d_seen = set()
        self.syncs = self.sync_ns = self.sync_steps = self.d2h_bytes = 0
        # Host time from the end of each wait to the next npu launch: the chip idles through
        # it on real hardware, having drained its queue for the wait.
        self.sync_gap_ns = 0
        self.sync_last_step = -1
        self.sync_kinds = collections.Counter()
        self.strided_copies = self.strided_bytes = self.strided_ns = self.strided_writes = 0
        self.strided_steps = self.strided_repeats = 0
        self.strided_last_step = -1
        self.strided_sources = {}   # id(base tensor) -> (weak reference, the view and version copied)
        self.f64_created = self.f64_ops = self.f64_ns = 0
        self.f16_ops = self.bf16_ops = 0         # ops on float16 / bfloat16 npu tensors (the target chip's verdict)
        # float16 results holding an inf, counted on the npu (read once at the end; Monitor.watch_overflow)
        self.f16_overflows = None
        self.fallbacks = collections.Counter()   # (op, reason) -> count
        self.fallback_dtypes = {}                # op -> dtypes of the npu inputs that fell back
        self.op_names = collections.Counter()
        self.kept_steps = 0                      # most distinct earlier steps with tensors still alive
        self.kept_bytes = 0                      # ... and the bytes of those tensors, then
        self.kept_graph = False                  # ... whether they need gradients (they keep their graphs)
        self.holder = None                       # (file, line, name, what) of the line that keeps them, if found
        # The loop the line runs in (a Loop, found from the lines that launch npu work), and per
        # (event, loop): [the loop iteration of the last event, the iterations with one].
        self.loop = None
        self.loop_hits = {}
        self.sync_forms = collections.Counter()  # (form, expression, statement) -> syncs (see sync_form)
        self.sync_at = {}                        # f_lasti -> (form, expression, statement), computed once
        # Host tensors made by a factory op (torch.randn, arange, ...) of the same function and
        # copied in after this line's previous copy: fresh host data, made where the npu could make it.
        self.h2d_mark = -1
        self.h2d_fresh = self.h2d_fresh_ns = self.h2d_fresh_bytes = self.h2d_fresh_steps = 0
        self.h2d_fresh_last_step = -1
        self.h2d_origins = collections.Counter()  # (file, line, op) of the factory -> copies
        self.callers = ()                        # (file, line) of the user frames above it, when first seen
        self.via = collections.Counter()         # (file, line) of installed packages' lines its ops ran in
        self.backward_ops = 0                    # ops of the backward pass of what this line computed
        self.fallback_parents = {}               # op that fell back -> Counter of the ops it ran inside
        self.fallback_backward = collections.Counter()   # op that fell back -> calls in the backward pass
        self.direct_small = 0                    # direct ops on tensors of at most _TINY_ELEMENTS elements
        self.library_syncs = 0                   # host reads made inside an installed package it called

    @property
    def where(self):
        return f"{self.file}:{self.line}"


# A direct op whose tensors have at most this many elements is tiny: its work on a chip
# (a few us at most) is below the cost of launching it.
_TINY_ELEMENTS = 1 << 16


class Loop:
    """A loop of the user's code, found from the lines that launch npu work: the same line
    of a frame launching work again after other lines did, with work in between
    (``Monitor._line_change``). ``line`` is where its iterations were seen to start."""

    __slots__ = ("code", "file", "line", "function", "boundaries", "frames", "data", "depth")

    def __init__(self, code, line, depth):
        self.code = code
        self.file, self.line, self.function = code.co_filename, line, code.co_name
        self.boundaries = 0   # iterations seen to start again
        self.frames = 0       # calls of the function in which it looped
        self.data = False     # whether its iterations copy data in or read results out (a data loop)
        self.depth = depth    # how deep in the user's calls it runs (0: the outermost user frame)

    @property
    def iterations(self):
        return self.boundaries + self.frames

    @property
    def rank(self):
        """Which loop's iterations are the steps: a loop that copies data in or reads results out
        (batches) before one that does not (layers in a forward()); among those, the most
        iterations per call of its function (batches, not epochs); among the others, the
        outermost (generation steps, not the layers of each step)."""
        per_call = self.boundaries / max(1, self.frames)
        return (True, per_call, 0) if self.data else (False, -self.depth, per_call)

    def __repr__(self):
        return f"Loop({self.file}:{self.line}, {self.iterations} iterations)"


class _FrameState:
    """What the loop finder knows of one live frame of user code on the stack."""

    __slots__ = ("frame", "line", "lasti", "below", "seen", "work", "loop", "iteration", "depth", "looped",
                 "data_mark")

    def __init__(self, frame, line, depth):
        self.frame, self.line, self.depth = frame, line, depth
        self.lasti = frame.f_lasti   # the instruction it was at
        self.below = None            # the call into PyTorch its latest op came from (see user_frame_and_call)
        self.seen = {line}     # the lines that launched work since the iteration began
        self.work = False      # whether work other than direct ops of this frame happened since then
        self.loop = None       # the Loop of its current iteration, once one was seen
        self.iteration = -1    # a number for the current iteration, unique in the run
        self.looped = ()       # the Loops it counted itself in (Loop.frames)
        self.data_mark = 0     # Monitor._data_events when its iteration began


KEPT_STEPS = 3   # a line whose tensors from this many earlier steps are alive keeps them
_CONTAINERS = (list, dict, set, collections.deque)


def _names_of(obj, frames):
    """Where ``obj`` is bound: [(name, frame or None, how)] from the frames' local variables,
    module globals and the attributes of objects (``self.history``)."""
    found = []
    for frame in frames:
        try:
            local = frame.f_locals
        except Exception:  # noqa: BLE001
            continue
        for name, value in local.items():
            if value is obj:
                found.append((name, frame, "local"))
    if found:
        return found
    for ref in gc.get_referrers(obj):
        if isinstance(ref, dict):
            for name, value in ref.items():
                if value is obj and isinstance(name, str):
                    found.append((name, None, "attribute or global"))
    return found


def find_holder(tensors, chain):
    """The line of the user's code that keeps ``tensors`` (made in earlier steps, still alive)
    alive: the line that puts them into a container (``history.append(out)``), searched in the
    source of the live user frames; (file, line, name) or None (held otherwise: an autograd
    graph, a variable)."""
    frames = [state.frame for state in reversed(chain)]   # innermost first
    ignore = {id(tensors), id(frames)}
    containers = {}
    try:
        sample = tensors[-256:]
        ignore.add(id(sample))
        pairs = []
        for ref in gc.get_referrers(*sample):   # one pass over the heap
            if id(ref) in ignore:
                continue
            if isinstance(ref, _CONTAINERS):
                containers[id(ref)] = ref
            elif isinstance(ref, tuple) and len(pairs) < 8:   # (logits, labels) appended as a pair
                pairs.append(ref)
        if pairs and not containers:
            for ref in gc.get_referrers(*pairs):
                if isinstance(ref, _CONTAINERS) and id(ref) not in ignore:
                    containers[id(ref)] = ref
        for container in containers.values():
            for name, frame, _ in _names_of(container, frames):
                where = _line_adding_to(name, [frame] if frame is not None else frames)
                if where is not None:
                    return where + (name,)
    except Exception:  # noqa: BLE001  finding the holder must never cost the run
        return None
    return None


def _line_adding_to(name, frames):
    """(file, line) of the first line in these frames' functions that adds to ``name``."""
    pattern = re.compile(r"(?<![\w.])" + r"(?:self\.)?" + re.escape(name)
                         + r"(?:\.(?:append|extend|insert|add|update|appendleft|setdefault)\("
                         + r"|\s*\+=|\[[^\]]*\]\s*=[^=])")
    for frame in frames:
        code = frame.f_code
        lines = sorted({line for _, _, line in code.co_lines() if line is not None})
        for line in lines:
            text = linecache.getline(code.co_filename, line)
            if pattern.search(text):
                return code.co_filename, line
    return None


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


_next_sequence_nr = torch._C._autograd._get_sequence_nr
_HALF_MAX = 65504.0


def _largest_npu(args):
    """The most elements of an npu tensor among ``args`` (lists included)."""
    most = 0
    for a in args:
        if isinstance(a, _Tensor):
            if a.device in _npu_devices or (not a.is_cpu and a.device.type == "npu"):
                n = a.numel()
                if n > most:
                    most = n
        elif isinstance(a, (list, tuple)):
            for t in a:
                if isinstance(t, _Tensor) and (t.device in _npu_devices or (not t.is_cpu and t.device.type == "npu")):
                    n = t.numel()
                    if n > most:
                        most = n
    return most


_DATA_DEPENDENT = {"aten::nonzero", "aten::masked_select", "aten::_unique2", "aten::unique_dim",
                   "aten::unique_consecutive", "aten::repeat_interleave", "aten::nonzero_static"}
_FLOAT64 = (torch.float64, torch.complex128)
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_COPIES = ("aten::_to_copy", "aten::to")
_SCALAR_READS = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero")
_CLONES = ("aten::clone", "aten::contiguous")

# Host tensors made from nothing by these ops (random numbers, ranges, constants) could be
# made on the npu directly; the ones with data written into them after (a staging buffer
# filled from the host: their version moves) are host data, not this.
_RANDOM_FACTORIES = {"aten::randn", "aten::rand", "aten::randint", "aten::randperm", "aten::normal",
                     "aten::randn_like", "aten::rand_like", "aten::randint_like", "aten::bernoulli",
                     "aten::multinomial", "aten::poisson", "aten::arange", "aten::linspace", "aten::logspace",
                     "aten::eye"}
_CONSTANT_FACTORIES = {"aten::zeros", "aten::ones", "aten::full", "aten::empty", "aten::zeros_like",
                       "aten::ones_like", "aten::full_like", "aten::empty_like", "aten::scalar_tensor"}
_RANDOM_FILLS = {"aten::normal_", "aten::uniform_", "aten::bernoulli_", "aten::random_", "aten::exponential_",
                 "aten::cauchy_", "aten::log_normal_", "aten::geometric_"}
_host_factory = {}   # op -> 0 (not a factory), 1 (random, range), 2 (constant), 3 (random fill in place)


def _factory_kind(func):
    kind = _host_factory.get(func)
    if kind is None:
        name = func._schema.name
        kind = _host_factory[func] = (1 if name in _RANDOM_FACTORIES else 2 if name in _CONSTANT_FACTORIES
                                      else 3 if name in _RANDOM_FILLS else 0)
    return kind


# What the dispatch path decides from the op alone, once per op (_describe), by id(op) (an
# OpOverload hashes in Python; the entry holds the op, so its id is never reused):
# (name, returns a view, classification kind, mutates an input, host factory kind, the C++ callable, op).
_K_OTHER, _K_SPECIAL = 0, 1
_SPECIAL = frozenset(_COPIES + ("aten::copy_", "aten::lift_fresh") + _SCALAR_READS + _CLONES) | _DATA_DEPENDENT | {
    "aten::index"}
_op_info = {}


def _describe(func):
    name = func._schema.name
    info = _op_info[id(func)] = (name, _is_view_op(func), _K_SPECIAL if name in _SPECIAL else _K_OTHER,
                                 func._schema.is_mutable, _factory_kind(func), getattr(func, "_op", func), func)
    return info


_Tensor = torch.Tensor
_LIVE_MIN = 1 << 16
_weakref = weakref.ref
_NO_KWARGS = {}
_getframe = sys._getframe
_get_ident = threading.get_ident
_eval_frame = torch._C._dynamo.eval_frame
_set_eval_frame = _eval_frame.set_eval_frame
# The npu devices (an npu tensor's device is one of them: a set lookup, where `device.type`
# costs most of a microsecond); filled when a Monitor starts, after the npu's init.
_npu_devices = set()


class Monitor(TorchDispatchMode):
    """Collects per-line counters for every op that touches an npu tensor."""

    @classmethod
    def ignore_compile_internals(cls):
        # Without this, dynamo skips every frame while a dispatch mode is on and a
        # compiled script runs eager under the doctor. With it, the mode is off
        # while dynamo and inductor compile and on while the compiled code runs.
        return True

    @classmethod
    def _should_skip_dynamo(cls):
        # torch wraps a mode's __torch_dispatch__ in _disable_dynamo when this is True; ours
        # turns dynamo off itself, at a fraction of the cost per op (see __torch_dispatch__).
        return False

    def __init__(self, compare=None, watch_overflow=False):
        super().__init__()
        if torch.npu.is_initialized():
            _npu_devices.update(torch.device("npu", i) for i in range(torch.npu.device_count()))
        # dynamo, running compiled code, leaves this frame alone (it turns dynamo off inside)
        _eval_frame.set_code_exec_strategy(Monitor.__torch_dispatch__.__code__, _eval_frame._FrameExecStrategy(
            _eval_frame._FrameAction.SKIP, _eval_frame._FrameAction.DEFAULT))
        # Count float16 results that overflowed to inf, per line (for a target chip that
        # saturates instead): a reduction per float16 op, kept on the npu, no wait.
        self.watch_overflow = watch_overflow
        self.sites = {}
        self.op_calls = collections.Counter()     # op -> calls on the npu
        self.op_ns = collections.Counter()        # op -> host ns
        self.host_op_calls = collections.Counter()   # OpOverload -> calls on host tensors only
        self.host_op_ns = collections.Counter()      # ... and their host ns
        self.total_ops = 0
        self.step = 0                             # iterations so far (optimizer steps, Doctor.step(), loops)
        self.step_memory = []                     # (step, seconds, allocated, reserved) after each step
        self.step_times = []
        self.compare = compare                    # a _compare.Comparator or None
        # The op now running: (site, args, float64-ness, op, whether it is the backward pass's).
        self._now = (None, (), False, None, False)
        self._site_at = None                      # (frame, line, site, via) of the latest op
        # (weak reference, site, step) of the npu tensors made by ops: no callback when one dies
        # (a Python call per tensor); the dead are dropped each step and when the list doubles.
        self._live = []
        self._live_limit = _LIVE_MIN
        self._start = time.perf_counter()
        # The loop finder (see _line_change): the live frames of user code on the stack of the
        # latest op, outermost first, and what it knows of each.
        self._thread = threading.get_ident()
        self._chain = []                          # _FrameState, outermost first
        self._index = {}                          # id(frame) -> its position in _chain
        self._top = None                          # the innermost state (_chain[-1]) and its frame
        self._top_frame = None
        self._ctx = None                          # the innermost state of _chain in a loop, or None
        self.loops = {}                           # (code, line) -> Loop
        self.primary_loop = None                  # the loop whose iterations are the steps, without optimizer
        self.on_loop_step = None                  # called at each iteration of primary_loop (Doctor)
        self.on_loop_switch = None                # called when another loop becomes primary_loop (Doctor)
        self._iterations = 0                      # numbers the iterations of all loops
        self._data_events = 0                     # host-to-device copies and host reads so far
        self._waited_at = None                    # (site, ns) of the last host wait, until the next launch
        # Host tensors made by factory ops on the user's lines: id -> (weak reference, origin).
        self._host_made = {}
        self._host_serial = 0
        # Autograd nodes -> the site of the op they were made for (by sequence number, this
        # thread's), for the backward pass; the next number, and where each step began.
        self._seq_site = {}
        self._next_seq = _next_sequence_nr()
        self._step_seqs = collections.deque(maxlen=3)
        self.backward_caller = None              # the site whose backward() runs now

    # ---- the dispatch mode ----

    def _site(self, frame, line=None):
        key = (frame.f_code.co_filename, frame.f_lineno if line is None else line)
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = Site(*key)
            if self._top_frame is frame:   # the lines of the user's calls that lead here
                site.callers = tuple((state.frame.f_code.co_filename, state.line) for state in self._chain[:-1])
        return site

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # What torch's own wrapper (_disable_dynamo) does around a mode's __torch_dispatch__,
        # without its two Python frames per op: no compilation of what runs in here.
        prior = _set_eval_frame(None)
        try:
            info = _op_info.get(id(func))
            if info is None:
                info = _describe(func)
            if kwargs is None:
                kwargs = _NO_KWARGS
            # (inlined _scan: whether an npu tensor is among the arguments, whether a float64
            # one is, the 16-bit floating dtype of one)
            npu = f64_in = False
            low = None
            for a in args:
                if isinstance(a, _Tensor):
                    if a.device in _npu_devices or (not a.is_cpu and a.device.type == "npu"):
                        npu = True
                        dtype = a.dtype
                        if dtype in _FLOAT64:
                            f64_in = True
                        elif dtype in _LOW_PRECISION:
                            low = dtype
                elif isinstance(a, (list, tuple)):
                    for t in a:
                        if isinstance(t, _Tensor) and (t.device in _npu_devices
                                                       or (not t.is_cpu and t.device.type == "npu")):
                            npu = True
                            dtype = t.dtype
                            if dtype in _FLOAT64:
                                f64_in = True
                            elif dtype in _LOW_PRECISION:
                                low = dtype
            if kwargs:
                found, f64_kw, low_kw = self._scan((), kwargs)
                npu = npu or found
                f64_in = f64_in or f64_kw
                if low_kw is not None:
                    low = low_kw
                if not npu and self._makes_npu(func, kwargs):
                    npu = True
            if not npu:
                return self._host_dispatch(func, args, kwargs, info[4])
            caller = _getframe().f_back   # None on autograd's threads
            if caller is self._top_frame and caller is not None:   # the user's frame called it, as its last op
                frame, direct, below = caller, True, None
            else:
                frame, direct, below = user_frame_and_call(caller)
            if frame is not None:
                line = frame.f_lineno
                if frame is self._top_frame:    # the same frame as the last op: at most its line moved
                    top = self._top
                    lasti = frame.f_lasti
                    # Another line, or this one run again: its instructions start over (a loop of one
                    # line), or a new call of a module from the same instruction.
                    if (line != top.line or lasti < top.lasti
                            or (not direct and lasti == top.lasti and below is not top.below)):
                        self._line_change(top, line)
                    top.lasti = lasti
                    if not direct:
                        top.work = True
                        top.below = below
                else:
                    self._rewalk(frame, line, direct, below)
                # The site of a frame's line is the same each time (its callers are fixed while it runs).
                cached = self._site_at
                if cached is not None and cached[0] is frame and cached[1] == line:
                    site, via = cached[2], cached[3]
                else:
                    shown, via = site_frame(frame)
                    site = self._site(frame, line) if via is None else self._site(shown)
                    self._site_at = (frame, line, site, via)
                if via is not None:            # inside an installed package: the user's line that called it
                    site.via[via] += 1
                if self._thread == _get_ident():
                    # The autograd nodes made for this op (before it reached this mode): their
                    # backward runs where no Python frame names a line, so they name this one.
                    made = _next_sequence_nr()
                    if made != self._next_seq:
                        for seq in range(self._next_seq, made):
                            self._seq_site[seq] = site
                        self._next_seq = made
            else:   # autograd's thread, or no user frame at all: the backward pass (resolved when it matters)
                site = self.backward_caller or self._site_unknown()
            name = info[0]
            previous = self._now
            self._now = (site, args, f64_in, func, frame is None)
            comparing = self.compare is not None and self.compare.wants(func)
            if comparing:
                host_args, host_kwargs = self.compare.to_host(args, kwargs)
            start = time.perf_counter_ns()
            if self._waited_at is not None:   # the first launch after a host wait
                self._waited_at[0].sync_gap_ns += start - self._waited_at[1]
                self._waited_at = None
            try:
                out = info[5](*args, **kwargs)   # func(), without OpOverload.__call__'s frame
            finally:
                self._now = previous
            ns = time.perf_counter_ns() - start
            if comparing:
                self.compare.check(func, args, kwargs, out, host_args, host_kwargs, site)

            self.total_ops += 1
            self.op_calls[name] += 1
            self.op_ns[name] += ns
            site.ops += 1
            site.ns += ns
            site.op_names[name] += 1
            if low is not None:
                if low == torch.float16:
                    site.f16_ops += 1
                    # Not in the backward pass: scaled gradients overflow by design, and GradScaler
                    # reads the chip's overflow flag for them.
                    if self.watch_overflow and frame is not None:
                        self._count_overflow(site, out)
                else:
                    site.bf16_ops += 1
            if site.last_step != self.step:
                site.last_step = self.step
                site.steps_hit += 1
            if direct and not info[1]:
                site.direct_ops += 1
                site.direct_ns += ns
                if _largest_npu(args) <= _TINY_ELEMENTS:
                    site.direct_small += 1
                if site.call_frame is not frame:
                    site.call_frame, site.call_ops = frame, 0
                    parent = frame.f_back
                    if parent is not None:
                        kind = _internal_code.get(parent.f_code)
                        if kind is None:
                            path = parent.f_code.co_filename
                            kind = _internal_code[parent.f_code] = (_is_internal(path), path.startswith(_PLUMBING))
                        if kind[0]:
                            parent = None   # called through PyTorch (a module's forward): one call each
                    if parent is None or site.parent_frame is not parent:
                        site.parent_frame, site.parent_ops = parent, 0
                site.call_ops += 1
                site.parent_ops += 1
                most = site.call_ops if site.parent_frame is None else site.parent_ops
                if most > site.most_ops_per_call:
                    site.most_ops_per_call = most
                if site.loop is None and self._ctx is not None:
                    site.loop = self._ctx.loop
            # (an op that copies, reads or writes nothing the classification looks at, with no
            # float64 in: only its outputs' dtype and whether they are new npu tensors matter)
            if info[2] == _K_OTHER and not info[3] and not f64_in:
                if isinstance(out, _Tensor):
                    if out.dtype in _FLOAT64:
                        self._classify(func, name, args, kwargs, out, site, ns, direct, f64_in, caller, frame)
                    elif out._base is None and (out.device in _npu_devices
                                                or (not out.is_cpu and out.device.type == "npu")):
                        # (inlined _track_one: a new npu tensor, not a view, not an input returned)
                        for a in args:
                            if out is a:
                                return out
                        for a in kwargs.values():
                            if out is a:
                                return out
                        live = self._live
                        live.append((_weakref(out), site, self.step))
                        if len(live) > self._live_limit:
                            self._prune_live()
                    return out
            self._classify(func, name, args, kwargs, out, site, ns, direct, f64_in, caller, frame)
            return out
        finally:
            _set_eval_frame(prior)

    def _host_dispatch(self, func, args, kwargs, factory):
        start = time.perf_counter_ns()   # the op's own host time (for the chip's projection)
        try:
            if factory or self._host_made:
                return self._host_op(func, args, kwargs, factory)
            return func(*args, **kwargs)
        finally:
            self.host_op_ns[func] += time.perf_counter_ns() - start
            self.host_op_calls[func] += 1

    @staticmethod
    def _count_overflow(site, out):
        """Counts a float16 result past float16's range: inf here, or +-65504 on a chip
        that saturates instead (the run's own profile, or a target's)."""
        for o in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(o, torch.Tensor) and o.dtype == torch.float16 and o.device.type == "npu" and o.numel():
                # (the mode is off in here: not counted as the user's)
                hit = o.abs().ge(_HALF_MAX).any().to(torch.int32)
                site.f16_overflows = hit if site.f16_overflows is None else site.f16_overflows.add_(hit)

    def _forward_site(self):
        """The forward line of the autograd node whose backward runs now (as torch.profiler
        links them, by sequence number), or None. Asked only when an event of the backward
        pass needs a line: a lookup per op would cost the run more than the rest of the doctor."""
        node = torch._C._current_autograd_node()
        if node is None:
            return None
        site = self._seq_site.get(node._sequence_nr())
        if site is not None:
            site.backward_ops += 1
        return site

    def on_backward(self, frame):
        """backward() called from ``frame`` (None: it returned): its ops without a forward
        line are that line's."""
        if frame is None:
            self.backward_caller = None
            return
        frame, _ = user_frame(frame)
        self.backward_caller = self._site(site_frame(frame)[0]) if frame is not None else None

    def pure_host_us(self):
        """Per op name, its mean host time as measured around the op itself (without the
        dispatch mode's own cost): what a real host spends on an op that launches nothing."""
        total, calls = collections.Counter(self.op_ns), collections.Counter(self.op_calls)
        for func, n in self.host_op_calls.items():
            total[func._schema.name] += self.host_op_ns[func]
            calls[func._schema.name] += n
        return {op: total[op] / n / 1e3 for op, n in calls.items() if n}

    def _site_unknown(self):
        key = ("<unknown>", 0)
        if key not in self.sites:
            self.sites[key] = Site(*key)
        return self.sites[key]

    @staticmethod
    def _scan(args, kwargs):
        """(whether an npu tensor is among the arguments, whether a float64 one is, the
        16-bit floating dtype of one, if any)."""
        npu = f64 = False
        low = None
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                if a.device.type == "npu":
                    npu = True
                    f64 = f64 or a.dtype in _FLOAT64
                    if a.dtype in _LOW_PRECISION:
                        low = a.dtype
            elif isinstance(a, (list, tuple)):
                for t in a:
                    if isinstance(t, torch.Tensor) and t.device.type == "npu":
                        npu = True
                        f64 = f64 or t.dtype in _FLOAT64
                        if t.dtype in _LOW_PRECISION:
                            low = t.dtype
        return npu, f64, low

    @staticmethod
    def _makes_npu(func, kwargs):
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "npu"

    def _classify(self, func, name, args, kwargs, out, site, ns, direct, f64_in, caller=None, frame=None):
        first = args[0] if args else None
        # Host <-> device copies, and reads of device values on the host (syncs).
        # (aten::to, item, is_nonzero, contiguous: what inference_mode leaves undecomposed.)
        if name in _COPIES and isinstance(first, torch.Tensor):
            if isinstance(out, torch.Tensor) and out is not first:
                if first.device.type == "cpu" and out.device.type == "npu":
                    self._host_to_device(site, first, ns, frame=frame)
                elif first.device.type == "npu" and out.device.type == "cpu":
                    self._sync(site, ns, "copy", _nbytes(first), frame, caller)
        elif name == "aten::copy_" and len(args) > 1:
            dst, src = args[0], args[1]
            if dst.device.type == "npu" and src.device.type == "cpu":
                self._host_to_device(site, src, ns, frame=frame)
            elif dst.device.type == "cpu" and src.device.type == "npu":
                self._sync(site, ns, "copy", _nbytes(src), frame, caller)
            # (a copy into a strided slice is how buffers such as a KV cache are filled: not a trap)
        elif name == "aten::lift_fresh":  # torch.tensor(data, device="npu"): host data copied in
            self._host_to_device(site, None, ns, out, frame)
        elif name in _SCALAR_READS:
            self._sync(site, ns, "scalar", 0, frame, caller)
        elif name in _DATA_DEPENDENT or (name == "aten::index" and self._bool_index(args)):
            self._sync(site, ns, "shape", 0, frame, caller)
        elif (direct and name in _CLONES and isinstance(first, torch.Tensor) and first.layout == torch.strided
              and not first.is_contiguous()):
            self._strided(site, ns, write=False, nbytes=_nbytes(first), source=first)
        elif (direct and func._schema.is_mutable and isinstance(first, torch.Tensor) and first.device.type == "npu"
              and first.layout == torch.strided and not first.is_contiguous() and first.numel() > 1):
            self._strided(site, ns, write=True, nbytes=_nbytes(first))

        # float64: where it enters the device, and every op it costs (not PyTorch's own, inside
        # GradScaler.step: the user cannot change those).
        outs = out if isinstance(out, (list, tuple)) else (out,)
        f64_out = any(isinstance(o, torch.Tensor) and o.dtype in _FLOAT64 for o in outs)
        if (f64_in or f64_out) and not (caller is not None and on_users_behalf(caller)):
            site.f64_ops += 1
            site.f64_ns += ns
            if f64_out and (not f64_in or name == "aten::lift_fresh"):   # (torch.tensor(..., device=) lifts
                site.f64_created += 1                                        # an npu tensor made from the data)
        self._track(outs, args, kwargs, site)

    @staticmethod
    def _bool_index(args):
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())

    def _loop_hit(self, site, event):
        """Counts an event of a line in the iterations of the loop it runs in."""
        ctx = self._ctx
        if ctx is None:
            return
        key = (event, ctx.loop)
        hit = site.loop_hits.get(key)
        if hit is None:
            site.loop_hits[key] = [ctx.iteration, 1]
        elif hit[0] != ctx.iteration:
            hit[0] = ctx.iteration
            hit[1] += 1

    def _host_to_device(self, site, host, ns, device_tensor=None, frame=None):
        self._data_events += 1
        site.h2d += 1
        site.h2d_ns += ns
        if self._top is not None:
            self._top.work = True
        if site.h2d_last_step != self.step:
            site.h2d_last_step = self.step
            site.h2d_steps += 1
        self._loop_hit(site, "h2d")
        if host is not None:
            nbytes = _nbytes(host)
            site.h2d_bytes += nbytes
            key = _content_key(host)
            if self._host_made:
                self._fresh_host_copy(site, host, ns, nbytes, frame)
            site.h2d_mark = self._host_serial
        else:
            site.h2d_bytes += _nbytes(device_tensor)
            # Small constants are what gets rebuilt in loops; reading them back is cheap.
            small = device_tensor.layout == torch.strided and device_tensor.numel() <= 4096
            values = device_tensor.cpu() if small else None
            key = _content_key(values) if small else None
            if (small and values.numel() > 1 and frame is not None and not values.dtype.is_complex
                    and bool((values == values.reshape(-1)[0]).all())):
                # torch.tensor([t] * n, device=...): one value, repeated on the host, copied in.
                self._fresh(site, ns, _nbytes(device_tensor), (frame.f_code.co_filename, frame.f_lineno, "repeated"))
        if key is not None:
            if key in site.h2d_seen:
                site.h2d_repeats += 1
            elif len(site.h2d_seen) < 64:
                site.h2d_seen.add(key)

    def _sync(self, site, ns, kind, nbytes, frame=None, caller=None):
        if caller is not None and on_users_behalf(caller):
            return   # GradScaler.step's own .item() of found_inf
        self._data_events += 1
        self._waited_at = (site, time.perf_counter_ns())
        site.syncs += 1
        site.sync_ns += ns
        site.sync_kinds[kind] += 1
        site.d2h_bytes += nbytes
        if site.sync_last_step != self.step:
            site.sync_last_step = self.step
            site.sync_steps += 1
        if self._top is not None:
            self._top.work = True
        self._loop_hit(site, "sync")
        if frame is not None and is_library(frame.f_code.co_filename):
            site.library_syncs += 1
        if frame is not None:
            at = (frame.f_lasti, kind)
            form = site.sync_at.get(at)
            if form is None and len(site.sync_at) < 16:
                try:
                    form = site.sync_at[at] = sync_form(frame, kind)
                    if caller is not None and _in_distribution_checks(caller, frame):
                        form = site.sync_at[at] = ("validate", form[1], form[2])
                except Exception:  # noqa: BLE001  naming the expression must never cost the run
                    form = site.sync_at[at] = (kind, "", "")
            if form is not None:
                site.sync_forms[form] += 1

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
        self._loop_hit(site, "strided")

    def _track_one(self, o, args, kwargs, site):
        """_track of one new npu tensor."""
        if o._base is not None:   # a view (what _is_view() says, cheaper)
            return
        for a in args:
            if o is a:
                return
        for a in kwargs.values():
            if o is a:
                return
        self._live.append((weakref.ref(o), site, self.step))
        if len(self._live) > self._live_limit:
            self._prune_live()

    def _prune_live(self):
        self._live = [entry for entry in self._live if entry[0]() is not None]
        self._live_limit = max(_LIVE_MIN, 2 * len(self._live))

    def _track(self, outs, args, kwargs, site):
        """Remembers which line made each new npu tensor, to name what is kept alive
        (not the inputs an in-place or out= op returns)."""
        for o in outs:
            if (isinstance(o, torch.Tensor) and o.device.type == "npu" and not o._is_view()
                    and not any(o is a for a in args) and not any(o is a for a in kwargs.values())):
                self._live.append((weakref.ref(o), site, self.step))
                if len(self._live) > self._live_limit:
                    self._prune_live()

    # ---- host tensors made on the user's lines ----

    def _host_op(self, func, args, kwargs, factory):
        """A host op: remembers the user line that made a host tensor from nothing (torch.randn,
        torch.arange, ...), and carries that origin through host ops computed from it
        (``torch.randn(n) * 0.1``), so that its copy to the npu can name the line."""
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.device.type != "cpu":
            return out
        if factory == 1 or factory == 2 or factory == 3:
            frame, direct = user_frame(sys._getframe(2))
            if frame is None or not direct or threading.get_ident() != self._thread:
                return out   # made inside a library (a DataLoader's collate, an initialiser), not on a line
            self._host_serial += 1
            origin = (self._host_serial, frame.f_code, frame.f_lineno, func._schema.name,
                      out._version if factory == 2 else None)
        else:
            if func._schema.is_mutable:
                return out
            origin = None
            for a in args:
                if isinstance(a, torch.Tensor):
                    found = self._host_origin(a)
                    if found is not None and (origin is None or found[0] > origin[0]):
                        origin = found
            if origin is None:
                return out
        made = self._host_made
        key = id(out)
        ref = weakref.ref(out, lambda r, made=made, key=key: made.pop(key, None) if made.get(key, (None,))[0] is r
                          else None)
        made[key] = (ref, origin)
        return out

    def _host_origin(self, t):
        for x in (t, t._base):
            if x is None:
                continue
            entry = self._host_made.get(id(x))
            if entry is not None and entry[0]() is x:
                origin = entry[1]
                if origin[4] is not None and x._version != origin[4]:
                    return None   # a constant buffer filled with host data since: host data
                return origin
        return None

    def _fresh_host_copy(self, site, host, ns, nbytes, frame):
        origin = self._host_origin(host)
        if origin is None or frame is None:
            return
        serial, code, line, op, _ = origin
        # Made after this line's previous copy (new data each time), in the same function
        # (not a dataset's __getitem__ or a generator handing out batches).
        if serial <= site.h2d_mark or code is not frame.f_code:
            return
        self._fresh(site, ns, nbytes, (code.co_filename, line, op))

    def _fresh(self, site, ns, nbytes, origin):
        site.h2d_fresh += 1
        site.h2d_fresh_ns += ns
        site.h2d_fresh_bytes += nbytes
        site.h2d_origins[origin] += 1
        if site.h2d_fresh_last_step != self.step:
            site.h2d_fresh_last_step = self.step
            site.h2d_fresh_steps += 1
        self._loop_hit(site, "fresh")

    # ---- the loop finder ----

    def _rewalk(self, frame, line, direct, below=None):
        """The innermost user frame changed: updates the chain of live user frames."""
        if threading.get_ident() != self._thread:
            return   # another thread's op (none of its frames are on this chain)
        chain, index = self._chain, self._index
        new = []          # (user frame, the frame it called), innermost first
        known = -1
        f, callee = frame, below
        while f is not None:
            at = index.get(id(f))
            if at is not None and chain[at].frame is f:
                known = at   # this frame and all above it are on the chain already
                break
            code = f.f_code
            kind = _internal_code.get(code)
            if kind is None:
                name = code.co_filename
                kind = _internal_code[code] = (_is_internal(name), name.startswith(_PLUMBING))
            if not kind[0]:
                new.append((f, callee))
            callee = f
            f = f.f_back
        for gone in chain[known + 1:]:
            index.pop(id(gone.frame), None)
        del chain[known + 1:]
        if known >= 0:
            state = chain[known]
            now = line if state.frame is frame else state.frame.f_lineno
            lasti = state.frame.f_lasti
            # Another line; or the same one again: an earlier instruction, or a new call made by
            # the same instruction (`for ...: x = block(x)`, one line), not more work of the call
            # it made already (the layers a Sequential calls).
            called = callee is not None and callee is not state.below
            if now != state.line or lasti < state.lasti or (called and lasti == state.lasti):
                self._line_change(state, now)
            state.lasti = lasti
            if callee is not None:
                state.below = callee
        for f, callee in reversed(new):
            if chain:
                chain[-1].work = True    # a deeper frame launches work: work of this iteration
            index[id(f)] = len(chain)
            state = _FrameState(f, line if f is frame else f.f_lineno, len(chain))
            state.data_mark = self._data_events
            state.below = callee
            chain.append(state)
        top = chain[-1]
        if not direct:
            top.work = True
        self._top, self._top_frame = top, frame
        ctx = None
        for state in reversed(chain):
            if state.loop is not None:
                ctx = state
                break
        self._ctx = ctx

    def _line_change(self, state, line):
        """A frame launches work from another line. The same line again, after other lines and
        with work (a call, a copy, a sync) in between, starts a new iteration of a loop; direct
        ops only in between (a Python loop of small ops inside an iteration) do not."""
        if line in state.seen and state.work:
            self._boundary(state, line)
        else:
            state.seen.add(line)
        state.line = line

    def _boundary(self, state, line):
        code = state.frame.f_code
        loop = self.loops.get((code, line))
        if loop is None:
            loop = self.loops[(code, line)] = Loop(code, line, state.depth)
        loop.boundaries += 1
        if self._data_events != state.data_mark:   # the iteration copied data in or read results out
            loop.data = True
            state.data_mark = self._data_events
        if loop not in state.looped:
            state.looped += (loop,)
            loop.frames += 1
        self._iterations += 1
        state.loop, state.iteration = loop, self._iterations
        state.seen = {line}
        state.work = False
        ctx = self._ctx
        if ctx is None or ctx.depth <= state.depth:
            self._ctx = state
        # Without optimizer steps, the iterations of the script's hot loop are the steps.
        primary = self.primary_loop
        if primary is None:
            self.primary_loop = primary = loop
        elif loop is not primary and loop.rank > primary.rank:
            self.primary_loop = primary = loop
            if self.on_loop_switch is not None:   # the steps counted so far were another loop's
                self.on_loop_switch()
        if loop is primary and self.on_loop_step is not None:
            self.on_loop_step()

    def forget_frames(self):
        """Lets go of the frames the loop finder and the launch counters hold."""
        self._chain, self._index = [], {}
        self._top = self._top_frame = self._ctx = self._site_at = None
        self.release_frames()

    # ---- events from outside the dispatch mode ----

    def on_fallback(self, op, reason):
        site, current_args, current_f64, current_op, current_backward = self._now
        if site is None:  # an op the mode did not see (printing runs with modes off)
            caller = sys._getframe(1)
            if on_users_behalf(caller):
                return    # the reductions of printing a tensor: part of the print, found as a sync
            frame, _ = user_frame(caller)
            site = self._site(site_frame(frame)[0]) if frame is not None else self._site_unknown()
        elif reason == "dtype" and current_f64 and on_users_behalf(sys._getframe(1)):
            return        # GradScaler's float64 reciprocal of the scale
        if reason == "dtype" and current_f64:
            reason = "float64"
        if current_backward:   # at the line whose forward the backward pass is for
            site = self._forward_site() or site
        site.fallbacks[(op, reason)] += 1
        if current_backward:
            site.fallback_backward[op] += 1
        if current_op is not None:   # the op the user's line ran, which fell back inside
            parents = site.fallback_parents.setdefault(op, collections.Counter())
            schema = current_op._schema
            parents[schema.name + (f".{schema.overload_name}" if schema.overload_name else "")] += 1
        dtypes = site.fallback_dtypes.setdefault(op, set())
        for a in current_args:
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(t, torch.Tensor) and t.device.type == "npu":
                    dtypes.add(str(t.dtype).replace("torch.", ""))

    def on_host_sync(self, kind, frame, nbytes=0, ns=0):
        """A wait the dispatch mode cannot see: synchronize(), printing a tensor."""
        frame, _ = user_frame(frame)
        if frame is None:
            self._sync(self._site_unknown(), ns, kind, nbytes)
            return
        shown, via = site_frame(frame)
        if via is not None:   # inside an installed package: the user's line that called it
            site = self._site(shown)
            site.via[via] += 1
            self._sync(site, ns, kind, nbytes, frame)
            return
        line = frame.f_lineno
        if frame is self._top_frame:
            top = self._top
            lasti = frame.f_lasti
            if line != top.line or lasti < top.lasti:
                self._line_change(top, line)
            top.lasti = lasti
        else:
            self._rewalk(frame, line, True)
        self._sync(self._site(frame, line), ns, kind, nbytes, frame)

    def release_frames(self):
        for site in self.sites.values():
            site.call_frame = site.parent_frame = None

    def on_step(self):
        self.release_frames()
        # The nodes of steps before the last two have run their backward: forget them.
        self._step_seqs.append(self._next_seq)
        if len(self._step_seqs) == self._step_seqs.maxlen:
            oldest = self._step_seqs[0]
            self._seq_site = {s: v for s, v in self._seq_site.items() if s >= oldest}
        self.step += 1
        now = time.perf_counter() - self._start
        self.step_times.append(now)
        if torch.npu.is_initialized():
            stats = _memory_stats(torch.npu.current_device())   # one query, not one per key
            self.step_memory.append((self.step, now, stats["allocated_bytes.all.current"],
                                     stats["reserved_bytes.all.current"]))
        self._count_kept()

    def restart_steps(self):
        """Forgets the steps counted so far (iterations of a loop found before the first optimizer
        step, which then marks the iterations): what follows counts from step 0."""
        self.step = 0
        self.step_memory.clear()
        self.step_times.clear()
        for site in self.sites.values():
            site.steps_hit = site.h2d_steps = site.sync_steps = site.strided_steps = site.h2d_fresh_steps = 0
            site.last_step = site.h2d_last_step = site.sync_last_step = site.strided_last_step = -1
            site.h2d_fresh_last_step = -1
        self._live = [(ref, site, 0) for ref, site, _ in self._live if ref() is not None]

    def _count_kept(self):
        """Per line: in how many earlier steps did it make tensors that are still alive?"""
        old = self.step - 2   # this step's and the last one's tensors may be in use
        steps = collections.defaultdict(set)
        kept = collections.defaultdict(list)
        alive = []
        for entry in self._live:
            t = entry[0]()
            if t is None:
                continue
            alive.append(entry)
            made = entry[2]
            if made <= old and made > 0:
                steps[entry[1]].add(made)
                kept[entry[1]].append(t)
        self._live = alive
        self._live_limit = max(_LIVE_MIN, 2 * len(alive))
        for site, made in steps.items():
            if len(made) > site.kept_steps:
                site.kept_steps = len(made)
                site.kept_bytes = sum(_nbytes(t) for t in kept[site])
                site.kept_graph = any(t.requires_grad for t in kept[site])
                if site.kept_steps == KEPT_STEPS and site.holder is None:
                    site.holder = find_holder(kept[site], self._chain)


def trace_line(path, line, callback):
    """Calls ``callback()`` each time line ``line`` of the file ``path`` (a path, or the end of
    one) runs on this thread, until the returned function is called. Only the frames of the
    functions that hold the line are traced line by line (``sys.settrace``); the others see
    one call of the trace function when they start."""
    absolute = os.path.abspath(path)
    suffix = os.sep + os.path.normpath(path).lstrip(os.sep)
    wanted = {}   # code object -> whether it holds the line

    def holds(code):
        hit = wanted.get(code)
        if hit is None:
            name = code.co_filename
            hit = wanted[code] = ((name == absolute or name.endswith(suffix) or name == path)
                                  and any(n == line for _, _, n in code.co_lines()))
        return hit

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line:
            callback()
        return local

    def on_call(frame, event, arg):
        return local if holds(frame.f_code) else None

    previous = sys.gettrace()
    traced = []
    frame = sys._getframe(1)
    while frame is not None:   # the frames already running (the `with Doctor(...)` block's own)
        if holds(frame.f_code):
            frame.f_trace = local
            traced.append(frame)
        frame = frame.f_back
    sys.settrace(on_call)

    def undo():
        sys.settrace(previous)
        for f in traced:
            f.f_trace = None
        traced.clear()
    return undo


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


class FullPathMonitor(Monitor):
    """A Monitor without its per-op shortcuts: each op described anew, its site looked up
    again, every classification rule run. What the shortcuts must report the same as (the
    tests compare the two); slower, otherwise the same."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        info = _describe(func)
        _op_info[id(func)] = info[:2] + (_K_SPECIAL,) + info[3:]
        self._site_at = None
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            _op_info.pop(id(func), None)
