"""The rules: what in the counters of a run is worth fixing, where, and how.

Each rule reads the per-line counters of ``_monitor.Monitor`` and turns the lines
that cross its threshold into a ``Finding``. The thresholds are chosen so that a
clean training script reports nothing: a batch copied in once per step, a loss
read with ``.item()`` every few steps, a model whose ops come from inside
``nn.Module``s are all normal. What is flagged is what repeats in a loop where it
should not: in at least half of the steps, or of the iterations of the loop the
line runs in (a validation loop inside a training script runs in few optimizer
steps, but in every one of its own iterations).

Findings that cost less than ``_MINOR_SHARE`` of the run's npu op time, or less than
``_MINOR_SECONDS``, are kept but marked ``minor`` and listed after the others (not
float64, memory growth and wrong results, whose cost is not time). A host read, a copy
or a fallback costs a chip more than the emulator's host time shows (the queue drains,
then the launches restart): each counts at least ``_EVENT_SECONDS`` of its kind.
"""
import collections
import linecache
import os
import re
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Tuple

from ._monitor import KEPT_STEPS

# A line is "in the loop" when it acts in at least this share of the steps.
_LOOP_SHARE = 0.5
_MIN_STEPS = 4            # fewer optimizer steps than this: judge by totals instead
_MIN_LOOP_CALLS = 10      # ... at least this many times on one line
_TINY_OPS_PER_STEP = 32   # launch-bound: tiny ops (_monitor._TINY_ELEMENTS), this many from one line per step,
_TINY_OPS_TOTAL = 512     # ... or in all when there are no steps,
_TINY_OPS_PER_CALL = 32   # ... and this many in one execution of the function (a loop, not layers)
_TINY_COPIES_PER_STEP = 64   # host-to-device: this many copies per step from one line,
_TINY_COPY_BYTES = 4096      # ... of at most this many bytes on average (element by element)
_STRIDED_SHARE = 0.01     # strided copies worth a finding: this share of the npu op time
_KEPT_STEPS = KEPT_STEPS  # a line whose tensors from this many earlier steps are alive keeps them
_GROWTH_SHARE = 0.75      # memory grows: in this share of the steps after the first
_RECOMPILES = 2           # a function torch.compile compiled again this many times: a finding
_FRESH_COPIES = 3         # host tensors made by torch.randn & co. and copied in: at least this many, in the loop
_MINOR_SHARE = 0.01       # a finding costing less than this share of the npu op time is minor,
_MINOR_SECONDS = 1e-4     # ... or less than this in all
# Their cost is not time (or not time of this kind): never minor.
UNFLOORED = ("float64", "memory_growth", "wrong_result", "float16_overflow", "unsupported_dtype", "compile")
# The least each event costs on a chip, for the floor: a launch (24.5 us on an Ascend 910,
# profiles/ascend910b3.toml), and for a wait for the npu two (the queue drains, then refills).
_EVENT_SECONDS = {"hidden_sync": 49e-6, "cpu_fallback": 49e-6, "host_to_device_copy": 24.5e-6,
                  "launch_bound": 24.5e-6, "strided_copy": 24.5e-6}

KINDS = ("cpu_fallback", "host_to_device_copy", "hidden_sync", "launch_bound", "strided_copy", "float64",
         "memory_growth", "wrong_result", "compile", "float16_overflow", "unsupported_dtype")


@dataclass
class Finding:
    kind: str                 # one of KINDS
    title: str                # one line: what happens
    count: int                # how many times (ops, copies, syncs, steps)
    seconds: float            # host time it cost on the npu
    bytes: int                # bytes it moved or kept
    file: Optional[str]       # the user's source line responsible
    line: Optional[int]
    code: str                 # the text of that line
    remedy: str               # what to change
    other_locations: List[Tuple[str, int]] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    minor: bool = False       # costs under _MINOR_SHARE of the npu time (or _MINOR_SECONDS): listed apart
    projected_s: Optional[float] = None   # its cost on the target chip (doctor/_target.py); None: no target

    @property
    def where(self):
        """file:line, relative to the working directory when under it."""
        return f"{shown_path(self.file)}:{self.line}" if self.file else "(no user source line)"

    def as_dict(self):
        d = asdict(self)
        d["other_locations"] = [{"file": f, "line": n} for f, n in self.other_locations]
        return d


def shown_path(path):
    here = os.getcwd() + os.sep
    return path[len(here):] if path.startswith(here) else path


def _code(site):
    return linecache.getline(site.file, site.line).strip() if site.file and site.line else ""


def _in_loop(steps, active_steps, calls):
    """Does something that happened ``calls`` times on a line, in ``active_steps`` of
    the ``steps`` steps, repeat in the training loop?"""
    if steps >= _MIN_STEPS:
        return active_steps >= _LOOP_SHARE * steps
    return calls >= _MIN_LOOP_CALLS


def _in_own_loop(site, event):
    """Does the line's ``event`` ("sync", "h2d", "fresh", "strided") happen in at least half of
    the iterations of a loop it runs in (found by the monitor: a validation or generation loop,
    whatever the optimizer does)?"""
    for (what, loop), (_, hits) in site.loop_hits.items():
        if what == event and loop.iterations >= _MIN_STEPS and hits >= _LOOP_SHARE * loop.iterations:
            return True
    return False


def _looping(run, site, event, active_steps, calls):
    return _in_loop(run.steps, active_steps, calls) or _in_own_loop(site, event)


def _finding(kind, title, site, count, seconds, nbytes, remedy, others=(), **details):
    real = site is not None and site.file != "<unknown>"
    if real and site.via:   # the op ran inside an installed package this line called
        (file, line), _ = site.via.most_common(1)[0]
        details.setdefault("inside", {"file": file, "line": line})
    return Finding(kind, title, count, seconds, nbytes, site.file if real else None, site.line if real else None,
                   _code(site) if real else "", remedy,
                   [(s.file, s.line) for s in others if s.file != "<unknown>"], details)


# ---- the rules -----------------------------------------------------------------

_FALLBACK_REMEDY = {
    "no_kernel": ("the npu has no kernel for {op}: each call copies its inputs to the host and the results back. "
                  "Use ops the npu implements (torch_npu._ops_registry.list_ops('npu')), or register an npu kernel "
                  "with torch_npu.register_npu_op / torch.library."),
    "dtype": ("the npu kernel of {op} does not take these dtypes ({dtypes}), so it ran on the CPU: cast the inputs "
              "to a dtype it supports (float32, bfloat16, float16)."),
    "policy": ("{op} is forced to the CPU by a fallback policy (NPUFallbackMode.set_op_fallback or "
               "NPU_FALLBACK_OPS): remove the policy to run its npu kernel."),
    "kernel_error": ("the npu kernel of {op} raised and the op was retried on the CPU (NPU_FALLBACK_ON_ERROR=1): "
                     "run with NPU_FALLBACK_ON_ERROR=0 to see the kernel's error, and fix the inputs it refuses."),
}


def _no_kernel_on_chip(op):
    """Under a chip profile, for an op the chip lacks: the remedy, naming the chips that have it.
    None for an op in the chip's list (the emulator lacks its kernel, not the chip)."""
    from .._emu import profiles as _profiles
    chip = _profiles.active()
    name = op[len("aten::"):] if op.startswith("aten::") else op
    if not chip.is_chip or chip.native_ops is None or name in chip.native_ops:
        return None
    elsewhere = [p for p in _profiles.names() if p not in (_profiles.GENERIC, chip.name)
                 and name in (_profiles.load(p).native_ops or ())]
    return (f"{chip.device_name} (device profile '{chip.name}') has no native kernel for {op}, as the real chip "
            f"has none: each call copies its inputs to the host and the results back, there too. "
            + (f"It runs natively on {', '.join(elsewhere)}. " if elsewhere else "No Ascend chip profile runs it "
               "natively. ")
            + "Use ops the chip implements (torch_npu._ops_registry.list_ops('npu')), or register an npu kernel "
              "with torch_npu.register_npu_op / torch.library.")


def _fallback_findings(run):
    by_op = {}
    for site in run.sites:
        for (op, reason), n in site.fallbacks.items():
            if reason != "float64":
                by_op.setdefault((op, reason), []).append((n, site))
    out = []
    for (op, reason), hits in by_op.items():
        hits.sort(key=lambda h: -h[0])
        count = sum(n for n, _ in hits)
        stats = run.fallback_stats.get(op.split(".")[0])
        seconds = stats.seconds if stats else 0.0
        nbytes = stats.bytes_copied if stats else 0
        dtypes = ", ".join(sorted({d for _, s in hits for d in s.fallback_dtypes.get(op, ())})) or "?"
        remedy = (reason == "no_kernel" and _no_kernel_on_chip(op)) or _FALLBACK_REMEDY[reason].format(
            op=op, dtypes=dtypes)
        label = {"no_kernel": "no npu kernel", "dtype": "dtype not supported", "policy": "forced by a policy",
                 "kernel_error": "npu kernel raised"}[reason]
        # Where it came from: the backward pass of this line, or an op of the line that reaches it
        # (a decomposition on the chip, a composite).
        backward = sum(s.fallback_backward.get(op, 0) for _, s in hits)
        parents = collections.Counter()
        for _, s in hits:
            parents.update(s.fallback_parents.get(op, {}))
        parent = next((p for p, _ in parents.most_common() if p != op), None)
        how = ("in the backward pass of this line" if backward == count else
               "in this line's forward and backward pass" if backward else
               f"inside {parent}" if parent is not None else "")
        title = f"{op} ran on the CPU ({label}{', ' + how if how else ''}), {count} times"
        out.append(_finding("cpu_fallback", title, hits[0][1], count, seconds, nbytes, remedy,
                            [s for _, s in hits[1:]], op=op, reason=reason, backward_calls=backward,
                            within_op=parent))
    return out


_FACTORY_NAMES = {"aten::randn": "torch.randn", "aten::rand": "torch.rand", "aten::randint": "torch.randint",
                  "aten::randperm": "torch.randperm", "aten::normal": "torch.normal", "aten::arange": "torch.arange",
                  "aten::linspace": "torch.linspace", "aten::logspace": "torch.logspace", "aten::eye": "torch.eye",
                  "aten::bernoulli": "torch.bernoulli", "aten::multinomial": "torch.multinomial",
                  "aten::poisson": "torch.poisson", "aten::zeros": "torch.zeros", "aten::ones": "torch.ones",
                  "aten::full": "torch.full", "aten::empty": "torch.empty"}


def _factory_remedy(op):
    """How to make on the npu what ``op`` made on the host."""
    if op == "repeated":
        return "make it on the npu from the value: torch.full((n,), value, device=...), no list and no copy"
    name = op.split("::")[-1]
    if name.endswith("_like"):
        return (f"make it on the npu from the npu tensor: torch.{name}(x_npu) (or torch.{name}(x, "
                f"device=...)) instead of torch.{name} of a host tensor and a copy")
    if name.endswith("_") and not name.startswith("_"):   # a fill of a host tensor (uniform_, normal_)
        return f"fill a tensor made on the npu (torch.empty(..., device=...).{name}(...)) instead of a host one"
    call = _FACTORY_NAMES.get(op, f"torch.{name}")
    return f"make it on the npu: {call}(..., device=x.device) (or device='npu'), no host tensor and no copy"


def _copy_findings(run):
    out = []
    for site in run.sites:
        if not site.h2d:
            continue
        # The same few host tensors copied again and again (a constant rebuilt in the loop),
        constant = (site.h2d_repeats >= 3 and len(site.h2d_seen) <= 4
                    and _looping(run, site, "h2d", site.h2d_steps, site.h2d))
        # new host data made by torch.randn & co. in the same function, then copied in (the npu
        # could have made it),
        fresh = (site.h2d_fresh >= _FRESH_COPIES and site.h2d_fresh * 2 >= site.h2d
                 and _looping(run, site, "fresh", site.h2d_fresh_steps, site.h2d_fresh))
        # or many tiny copies per step (a tensor filled element by element from the host).
        per_step = site.h2d / max(1, site.h2d_steps)
        tiny = per_step >= _TINY_COPIES_PER_STEP and site.h2d_bytes / site.h2d <= _TINY_COPY_BYTES
        if not (constant or fresh or tiny):
            continue
        details = {"repeats": site.h2d_repeats}
        if constant:
            what = f"the same host data copied to the npu {site.h2d} times"
            made_here = "torch.tensor" in _code(site) or "device=" in _code(site)
            remedy = ("build the tensor once, before the loop, and reuse it" if made_here else
                      "create the tensor on the npu once, before the loop (or with device='npu'), and reuse it")
        elif fresh:
            (file, line, op), _ = site.h2d_origins.most_common(1)[0]
            call = _FACTORY_NAMES.get(op, op.replace("aten::", "torch."))
            made = "on this line" if (file, line) == (site.file, site.line) else f"at line {line}"
            what = (f"a host tensor made by {call} {made} copied to the npu in every iteration, "
                    f"{site.h2d_fresh} times")
            if op == "repeated":
                what = (f"one value repeated into a host tensor and copied to the npu in every iteration, "
                        f"{site.h2d_fresh} times")
            remedy = (f"the tensor is made on the host ({shown_path(file)}:{line}) and copied in each time: "
                      + _factory_remedy(op))
            details.update(made_at={"file": file, "line": line, "op": op}, fresh_copies=site.h2d_fresh)
        else:
            what = f"{site.h2d} tiny host-to-npu copies ({per_step:.0f} per step)"
            remedy = ("gather the values on the host and copy them in one tensor (torch.stack/cat, then one "
                      ".to('npu', non_blocking=True) from pinned memory), or compute them on the npu")
        out.append(_finding("host_to_device_copy", what, site, site.h2d, site.h2d_ns / 1e9, site.h2d_bytes, remedy,
                            **details))
    return out


# Per form of host read (_monitor.sync_form): the title (with {expr}, {stmt}, {n}) and the remedy.
_ITEM_REMEDY = ("keep the value on the npu and read it rarely: accumulate on the device (e.g. total += "
                "loss.detach()) and call .item() every N steps or once at the end; "
                "each read waits for all queued npu work")
_SYNC_FORMS = {
    "item": ("`{expr}` waits for the npu, {n} times", _ITEM_REMEDY),
    "call": ("`{expr}` reads an npu value on the host and waits for the npu, {n} times",
             "call it every N steps, or keep the value on the npu; each read of an npu value on the host "
             "waits for all queued npu work"),
    "convert": ("`{expr}` turns an npu tensor into a Python number and waits for the npu, {n} times",
                "keep the values on the npu (collect them with torch.stack/torch.cat) and convert once, after the "
                "loop; each int()/float() of an npu tensor waits for all queued npu work"),
    "tolist": ("`{expr}` waits for the npu, {n} times",
               "collect the values on the npu (keep the tensors, torch.stack/torch.cat them) and call .tolist() "
               "once, after the loop; each .tolist() copies to the host and waits for all queued npu work"),
    "to_host": ("`{expr}` copies to the host and waits for the npu, {n} times",
                "keep the results on the npu and move them once: append the npu tensors to a list, torch.cat them "
                "after the loop and call .cpu() once (or compute the metric on the npu); each .cpu()/.numpy() "
                "waits for all queued npu work"),
    "branch": ("`{stmt}` branches on an npu tensor: bool() reads it on the host and waits for the npu, {n} times",
               "decide on the npu instead of in Python: compute both outcomes and select with torch.where (or "
               "clamp, masked_fill, torch.nan_to_num), or test the condition every N steps; an `if` on an npu "
               "tensor waits for all queued npu work"),
    "stop": ("`{stmt}` checks on the host whether to stop after every iteration, waiting for the npu {n} times",
             "keep the stopping state on the npu (finished |= next_token == eos_id; next_token = "
             "torch.where(finished, pad_id, next_token)) and test finished.all() only every N iterations, or run a "
             "fixed number of iterations; each check waits for all queued npu work"),
    "index": ("`{expr}` uses a 0-dim npu tensor as a Python index or slice bound, waiting for the npu {n} times",
              "index on the npu (torch.index_select, torch.gather, a mask with torch.where), or keep the index as a "
              "Python int; turning an npu tensor into an index waits for all queued npu work"),
    "print": ("printing an npu tensor (`{expr}`) waits for the npu, {n} times",
              "print every N steps (or only at the end), and print numbers gathered on the npu; printing an npu "
              "tensor copies it to the host and waits for all queued npu work"),
    "shape": ("`{expr}`: an op whose output shape depends on the data (nonzero, masked_select, boolean index) "
              "waits for the npu, {n} times",
              "use shape-static ops: torch.where(mask, x, 0) or masked_fill instead of boolean indexing, "
              "nonzero_static with a known size"),
    "validate": ("`{expr}`: torch.distributions checks its arguments' values on the host, waiting for the npu "
                 "{n} times",
                 "pass validate_args=False to the distribution (or call "
                 "torch.distributions.Distribution.set_default_validate_args(False) once, after debugging): each "
                 "check reads the parameters on the host and waits for all queued npu work"),
    "synchronize": ("`{expr}` waits for the npu, {n} times",
                    "remove synchronize() from the loop: the stream keeps the order of npu work; "
                    "synchronize only to time a region or before reading results on the host"),
}
_KIND_FORMS = {"copy": "to_host", "scalar": "item", "shape": "shape", "print": "print", "synchronize": "synchronize"}


def _sync_form(site, code):
    """(form, expression, statement) of the line's commonest host read."""
    if site.sync_forms:
        return site.sync_forms.most_common(1)[0][0]
    kind = site.sync_kinds.most_common(1)[0][0]
    return _KIND_FORMS[kind], code, code


def _sync_findings(run):
    out = []
    for site in run.sites:
        if not site.syncs or not _looping(run, site, "sync", site.sync_steps, site.syncs):
            continue
        code = _code(site)
        form, expr, stmt = _sync_form(site, code)
        title, remedy = _SYNC_FORMS.get(form, _SYNC_FORMS["call"])
        if site.library_syncs * 2 > site.syncs:
            remedy = ("the installed package this line calls reads npu values on the host inside the call, waiting "
                      "for all queued npu work each time: call it less often with more work per call (one call for "
                      "a batch, not one per sample), or look for an option of the package that keeps the values on "
                      "the device")
        if len(expr) > 60:
            expr = expr[:57] + "..."
        if len(stmt) > 60:
            stmt = stmt[:57] + "..."
        out.append(_finding("hidden_sync", title.format(expr=expr or code, stmt=stmt or code, n=site.syncs), site,
                            site.syncs, site.sync_ns / 1e9, site.d2h_bytes, remedy, kinds=dict(site.sync_kinds),
                            host_gap_s=site.sync_gap_ns / 1e9,
                            form=form, expression=expr))
    return out


def _launch_findings(run):
    out = []
    for site in run.sites:
        # Tiny by their size (a chip runs them in a few us, less than their launch), not by the
        # time they took here: the machine's load must not change the verdict.
        if site.library or site.direct_small * 2 < site.direct_ops or not site.direct_small:
            continue
        if site.most_ops_per_call < _TINY_OPS_PER_CALL:
            continue
        # Per step; without steps, per iteration of the loop the line runs in (found by the monitor).
        loop = None
        if run.steps < _MIN_STEPS and site.loop is not None and site.loop.iterations >= _MIN_STEPS:
            loop = site.loop
        iterations = loop.iterations if loop is not None else run.steps
        if iterations >= _MIN_STEPS:
            many = site.direct_ops >= _TINY_OPS_PER_STEP * iterations
        else:
            many = site.direct_ops >= _TINY_OPS_TOTAL
        if not many:
            continue
        unit = "iteration" if loop is not None else "step"
        per = f" ({site.direct_ops / iterations:.0f} per {unit})" if iterations else ""
        mean_us = site.direct_ns / site.direct_ops / 1e3
        out.append(_finding(
            "launch_bound", f"{site.direct_ops} tiny kernels{per} launched from this line, {mean_us:.0f} us each",
            site, site.direct_ops, site.direct_ns / 1e9, 0,
            "each launch costs more than its work: vectorise the Python loop into whole-tensor ops "
            "(one op over a stacked tensor), or torch.compile the function to fuse them",
            ops=dict(site.op_names.most_common(5))))
    return out


def _strided_findings(run):
    out = []
    for site in run.sites:
        n = site.strided_copies + site.strided_writes
        if site.library or not n or not _looping(run, site, "strided", site.strided_steps, n):
            continue
        # A copy of a fresh view (attention's transpose + reshape) is the price of the layout;
        # copying the same unchanged data again, or writing in place through a strided view, is not.
        if site.strided_writes >= site.strided_copies:
            worth = site.strided_ns >= _STRIDED_SHARE * run.op_ns
        else:
            worth = site.strided_repeats >= 3
        if not worth:
            continue
        if site.strided_writes >= site.strided_copies:
            title = f"{site.strided_writes} in-place writes into non-contiguous views"
            remedy = ("an in-place op on a strided view runs element by element (or through a copy): write into "
                      "a contiguous tensor, or build the result out of place (torch.where, cat) and assign once")
        else:
            title = (f"{site.strided_copies} copies of non-contiguous views, {site.strided_repeats} of them of "
                     f"data unchanged since the last copy")
            remedy = ("the same view (transpose, permute, slicing with a step) of unchanged data is copied to a "
                      "contiguous layout again and again: make the contiguous copy once, outside the loop, and "
                      "reuse it")
        out.append(_finding("strided_copy", title, site, n, site.strided_ns / 1e9, site.strided_bytes, remedy,
                            copies=site.strided_copies, writes=site.strided_writes))
    return out


def _float64_findings(run):
    made = [s for s in run.sites if s.f64_created]
    used = [s for s in run.sites if s.f64_ops]
    if not made and not used:
        return []
    made.sort(key=lambda s: -s.f64_ops)
    # A line of the user's (not the backward pass's ops, which have none) where float64 enters.
    first = made[0] if made else max(used, key=lambda s: (s.file != "<unknown>", s.f64_ops))
    count = sum(s.f64_ops for s in used)
    seconds = sum(s.f64_ns for s in used) / 1e9
    fallbacks = sum(n for s in run.sites for (_, reason), n in s.fallbacks.items() if reason == "float64")
    title = f"float64 tensors on the npu: {count} ops" + (f", {fallbacks} of them on the CPU" if fallbacks else "")
    code = _code(first)
    remedy = ("most float64 ops have no npu kernel and run on the CPU (and NPUs compute float64 slowly "
              "or not at all): use float32 (torch.float32, .float())")
    if re.search(r"float64|\.double\(\)|torch\.double", code):
        remedy += "; this line asks for float64 (dtype=torch.float64, .double()): ask for torch.float32"
    elif re.search(r"numpy|np\.|from_numpy", code) or not re.search(r"torch\.tensor", code):
        remedy += ("; numpy arrays are float64 by default, so convert them with torch.from_numpy(a).float() "
                   "before .to('npu')")
    else:
        remedy += "; Python floats become float64 only when asked: give dtype=torch.float32"
    return [_finding("float64", title, first, count, seconds, 0, remedy,
                     made[1:] + [s for s in used if s not in made and s is not first][:5], fallbacks=fallbacks)]


def _memory_findings(run):
    memory = run.step_memory
    if len(memory) < _MIN_STEPS + 2:
        return []
    allocated = [m[2] for m in memory[1:]]   # after the first step: optimizer state exists
    rises = sum(b > a for a, b in zip(allocated, allocated[1:]))
    growth = allocated[-1] - allocated[0]
    if growth <= 0 or rises < _GROWTH_SHARE * (len(allocated) - 1):
        return []
    keepers = [s for s in run.sites if s.kept_steps >= _KEPT_STEPS]
    if getattr(run, "clock", None) == "loop" and not any(s.kept_graph for s in keepers):
        # Without an optimizer, results collected on the npu for one torch.cat after the loop
        # (predictions, generated tokens) grow by design; autograd graphs kept alive do not.
        return []
    per_step = growth / (len(allocated) - 1)
    title = f"npu memory grows every step: +{per_step / 1024:.1f} KiB per step over {len(allocated)} steps"
    remedy = ("tensors made here in every step stay alive: store numbers, not tensors (loss.item() at the end, "
              "or .detach() and keep only what you need), and accumulate with `total += loss.detach()`, "
              "since `total += loss` keeps every step's autograd graph")
    if not keepers:
        return [Finding("memory_growth", title, len(allocated), 0.0, growth, None, None, "", remedy)]
    # The line whose tensors of the most steps, and the most bytes, stay alive ...
    keepers.sort(key=lambda s: (-s.kept_steps, -s.kept_bytes))
    main = keepers[0]
    graph = main.kept_graph
    details = {"per_step_bytes": per_step, "made_at": {"file": main.file, "line": main.line},
               "kept_bytes": main.kept_bytes, "autograd_graphs": graph}
    others = [s for s in keepers if s is not main][:5]
    if main.holder is not None:
        # ... and the line that puts them into a container, which is the one to change.
        file, line, name = main.holder
        what = "tensors with their autograd graphs" if graph else "npu tensors"
        title = (f"npu memory grows every step: `{name}` keeps {what} of every step, "
                 f"+{per_step / 1024:.1f} KiB per step over {len(allocated)} steps")
        made = "on this line" if (file, line) == (main.file, main.line) else f"at {shown_path(main.file)}:{main.line}"
        remedy = (f"`{name}` holds on to {what} made {made} in every step: "
                  + ("append `.detach()`ed tensors (or `.item()` numbers, read once at the end), or run the loop "
                     "under torch.no_grad() if no gradient is needed: each kept result keeps its whole autograd "
                     "graph (the activations of the step) alive" if graph else
                     "keep only what you need (numbers, or a running total on the npu), or move the results to the "
                     "host once at the end"))
        details.update(holder={"file": file, "line": line, "name": name})
        return [Finding("memory_growth", title, len(allocated), 0.0, growth, file, line,
                        linecache.getline(file, line).strip(), remedy,
                        [(s.file, s.line) for s in [main] + others if s.file != "<unknown>"], details)]
    # No container: held by a variable's autograd graph (x = x - f(x), total += loss). The line
    # of the loop's own body is the one to change, not the model's line inside it.
    site, called = main, None
    if not _in_loop_body(run, main):
        body = [s for s in keepers if s.kept_steps == main.kept_steps and _in_loop_body(run, s)]
        if body:
            site = body[0]
        else:   # the loop's line that calls the code making them (pred = model(x, t))
            loop = getattr(run, "loop", None) or main.loop
            called = next(((f, n) for f, n in reversed(main.callers)
                           if loop is not None and f == loop.file and n in _lines_of(loop.code)), None)
    if graph:
        remedy = ("tensors made here in every step stay alive through an autograd graph that keeps growing "
                  "(x = x - f(x) outside torch.no_grad(), or `total += loss`): run the loop under torch.no_grad() "
                  "(or torch.inference_mode()) when no gradient is needed, detach what is carried to the next step "
                  "(x = x.detach()), and accumulate with `total += loss.detach()`")
    if graph:
        title = (f"npu memory grows every step: the autograd graphs of earlier steps stay alive, "
                 f"+{per_step / 1024:.1f} KiB per step over {len(allocated)} steps")
    if called is not None:
        file, line = called
        return [Finding("memory_growth", title, len(allocated), 0.0, growth, file, line,
                        linecache.getline(file, line).strip(), remedy,
                        [(s.file, s.line) for s in keepers[:5] if s.file != "<unknown>"], details)]
    return [_finding("memory_growth", title, site, len(allocated), 0.0, growth, remedy,
                     [s for s in keepers if s is not site][:5], **details)]


def _in_loop_body(run, site):
    """Is the line in the body of the loop whose iterations are the steps (not in a function it calls)?"""
    loop = getattr(run, "loop", None) or site.loop
    if loop is None:
        return False
    return site.file == loop.file and site.line in _lines_of(loop.code)


_code_lines = {}


def _lines_of(code):
    lines = _code_lines.get(code)
    if lines is None:
        lines = _code_lines[code] = frozenset(n for _, _, n in code.co_lines() if n is not None)
    return lines


def _compare_findings(run):
    out = []
    for m in run.mismatches:
        out.append(_finding("wrong_result", f"{m.op} differs from the CPU: max |npu - cpu| = {m.max_abs_diff:.3g} "
                            f"({m.dtype}), {m.bad_calls} of {m.calls} calls", m.site, m.bad_calls, 0.0, 0,
                            f"the npu kernel of {m.op} computes a wrong result; first bad call: "
                            f"{m.op}({', '.join(m.inputs)}). Report it to the kernel's owner, or force the op to "
                            f"the CPU meanwhile: NPUFallbackMode.set_op_fallback('{m.op}', 'cpu')",
                            op=m.op, inputs=m.inputs, max_abs_diff=m.max_abs_diff))
    return out


def _compile_findings(run):
    """torch.compile's graph breaks (one finding per line that breaks a compiled function,
    from the code dynamo compiled after it) and repeated recompilations (from its guard
    failures). Their cost is the compilation time they took."""
    compiled = getattr(run, "compile", None)
    if not compiled:
        return []
    out = []
    reasons = compiled.get("graph_breaks") or {}
    reason = max(reasons, key=reasons.get) if len(reasons) == 1 else None
    breaks = {}
    for c in compiled.get("compiles", ()):
        if c["after_break"]:
            breaks.setdefault((c["file"], c["line"], c["function"]), []).append(c["seconds"])
    for (file, line, fn), seconds in breaks.items():
        code = linecache.getline(file, line).strip()
        branch = code.startswith(("if ", "elif ", "while ")) or " if " in code
        title = (f"torch.compile'd `{fn}` breaks its graph at this line: what follows runs as another graph, "
                 f"with Python in between" + (f" ({reason})" if reason else ""))
        remedy = ("a branch on a tensor's value cannot stay in the graph: write it with torch.where (both sides "
                  "computed, one kept) or torch.cond, or move the test out of the compiled function" if branch else
                  "move what dynamo cannot trace (print, .item(), .tolist(), numpy, unsupported calls) out of the "
                  "compiled function; torch._dynamo.explain(fn)(*args) names each break, and "
                  "torch.compile(fullgraph=True) turns them into errors")
        out.append(Finding("compile", title, len(seconds), sum(seconds), 0, file, line, code, remedy,
                           details={"what": "graph_break", "function": fn, "reason": reason}))
    again = {}   # per function: its recompilations (compile ids "frame/attempt" with an attempt past 0)
    for c in compiled.get("compiles", ()):
        if c["compile_id"] and not c["compile_id"].endswith("/0"):
            again.setdefault((c["file"], c["line"], c["function"]), []).append(c["seconds"])
    for r in compiled.get("recompiles", ()):
        seconds = again.get((r["file"], r["line"], r["function"]), [])
        n = len(seconds)
        if n < _RECOMPILES:
            continue
        first = r["reasons"][0].strip().splitlines()[0]
        shapes = "size mismatch" in first or "stride mismatch" in first
        which = re.search(r"tensor '([^']+)' size mismatch at index (\d+)", first)
        mark = f"torch._dynamo.mark_dynamic({which.group(1)}, {which.group(2)})" if which else \
            "torch._dynamo.mark_dynamic(x, dim)"
        remedy = (f"the inputs' shapes change from call to call: mark the changing dimension dynamic before the "
                  f"call ({mark}) or compile with dynamic=True (not dynamic=False), or pad the inputs to a few "
                  f"fixed sizes" if shapes else
                  "a guard of the compiled code fails on every new call: keep what it checks (Python numbers passed "
                  "in, module attributes, requires_grad, dtypes, training mode) the same from call to call, or pass "
                  "changing numbers as tensors")
        out.append(Finding("compile", f"torch.compile compiled `{r['function']}` again {n} times: {first}", n,
                           sum(seconds), 0, r["file"], r["line"], linecache.getline(r["file"], r["line"]).strip(), remedy,
                           details={"what": "recompile", "function": r["function"], "reasons": r["reasons"][:8]}))
    return out


_SNAPSHOT_HINT = ("; to see every live block and the stack that allocated it, record the allocator's history "
                  "(torch.npu.memory._record_memory_history() before the loop, "
                  "torch.npu.memory._dump_snapshot('npu_memory.pickle') after it) and render it with "
                  "`python -m torch.cuda._memory_viz trace_plot npu_memory.pickle -o memory.html` "
                  "(or drop it on pytorch.org/memory_viz)")


def _memory_findings_with_snapshot(run):
    found = _memory_findings(run)
    for f in found:
        f.remedy += _SNAPSHOT_HINT
    return found


def overflow_sites(run):
    """(file, line, calls) of float16 results past float16's range, most first."""
    found = []
    for s in run.sites:
        if s.f16_overflows is not None:
            n = int(s.f16_overflows.item())
            if n:
                found.append((s.file, s.line, n))
    return sorted(found, key=lambda x: -x[2])


def _overflow_findings(run):
    """float16 results past its range on a target that saturates them to +-65504 instead of
    giving inf (910A, 310P): on the chip they are wrong finite numbers, silently."""
    chip = getattr(run, "saturating_chip", None)
    if chip is None:
        return []
    sites = {(s.file, s.line): s for s in run.sites}
    found = overflow_sites(run)
    if not found:
        return []
    (file, line, n), others = found[0], found[1:]
    total = sum(k for *_, k in found)
    site = sites[(file, line)]
    return [_finding("float16_overflow", f"float16 results past +-65504 in {total} op calls: {chip} saturates them "
                     f"to +-65504 instead of giving inf", site, total, 0.0, 0,
                     f"on {chip} an overflowing float16 result becomes a wrong finite number, silently (GradScaler "
                     f"sees the chip's overflow flag, other code does not): scale the values down (GradScaler for "
                     f"gradients, a smaller init or a clamp for activations) or compute that part in float32",
                     [sites[(f, l)] for f, l, _ in others], calls={f"{f}:{l}": k for f, l, k in found})]


def _refusal_findings(run):
    """The script stopped on an error the target chip raises where another device would not
    (bfloat16 on a chip without bfloat16 units): at the user's line that raised it."""
    refusal = getattr(run, "refusal", None)
    if refusal is None:
        return []
    file, line, message = refusal
    chip = getattr(run, "target_name", None) or "the chip"
    code = linecache.getline(file, line).strip() if file else ""
    return [Finding("unsupported_dtype", f"{chip} refuses bfloat16: the script stops here", 1, 0.0, 0, file,
                    line, code, f"{chip} has no bfloat16 units: use float16 (torch.autocast('npu', "
                    f"dtype=torch.float16), .half()) or float32 where this line makes or converts to bfloat16; "
                    f"torch.npu.is_bf16_supported() tells at run time", details={"error": message})]


_RULES = (_fallback_findings, _copy_findings, _sync_findings, _launch_findings, _strided_findings,
          _float64_findings, _memory_findings_with_snapshot, _compare_findings, _compile_findings,
          _overflow_findings, _refusal_findings)


def diagnose(run):
    """All findings of a finished run, the costliest first (wrong results always first),
    the minor ones (see _MINOR_SHARE) after the others."""
    findings = [f for rule in _RULES for f in rule(run)]
    floor = emulated_floor(run)
    for f in findings:
        f.minor = f.kind not in UNFLOORED and emulated_cost(f) < floor
    findings.sort(key=rank_key)
    return findings


def emulated_floor(run):
    """The cost under which a finding is minor in this run, seconds."""
    return max(_MINOR_SHARE * run.op_ns / 1e9, _MINOR_SECONDS)


def emulated_cost(finding):
    """What a finding cost in this run, with the least each of its events costs a chip."""
    return max(finding.seconds, finding.count * _EVENT_SECONDS.get(finding.kind, 0.0))


def rank_key(f):
    """Major before minor, wrong results first, then by projected cost on the target chip
    when there is one, then by the time and bytes measured here."""
    return (f.minor, f.kind != "wrong_result", -(f.projected_s or 0.0), -f.seconds, -f.bytes, f.kind)
