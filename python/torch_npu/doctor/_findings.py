"""The rules: what in the counters of a run is worth fixing, where, and how.

Each rule reads the per-line counters of ``_monitor.Monitor`` and turns the lines
that cross its threshold into a ``Finding``. The thresholds are chosen so that a
clean training script reports nothing: a batch copied in once per step, a loss
read with ``.item()`` every few steps, a model whose ops come from inside
``nn.Module``s are all normal. What is flagged is what repeats in a loop where it
should not.
"""
import linecache
import os
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Tuple

# A line is "in the loop" when it acts in at least this share of the steps.
_LOOP_SHARE = 0.5
_MIN_STEPS = 4            # fewer optimizer steps than this: judge by totals instead
_MIN_LOOP_CALLS = 10      # ... at least this many times on one line
_TINY_OP_NS = 50_000      # launch-bound: ops shorter than this on average,
_TINY_OPS_PER_STEP = 32   # ... at least this many from one line per step,
_TINY_OPS_TOTAL = 512     # ... or in all when there are no steps,
_TINY_OPS_PER_CALL = 32   # ... and this many in one execution of the function (a loop, not layers)
_TINY_COPIES_PER_STEP = 64   # host-to-device: this many copies per step from one line,
_TINY_COPY_BYTES = 4096      # ... of at most this many bytes on average (element by element)
_STRIDED_SHARE = 0.01     # strided copies worth a finding: this share of the npu op time
_KEPT_STEPS = 3           # a line whose tensors from this many earlier steps are alive keeps them
_GROWTH_SHARE = 0.75      # memory grows: in this share of the steps after the first

KINDS = ("cpu_fallback", "host_to_device_copy", "hidden_sync", "launch_bound", "strided_copy", "float64",
         "memory_growth", "wrong_result")


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


def _finding(kind, title, site, count, seconds, nbytes, remedy, others=(), **details):
    real = site is not None and site.file != "<unknown>"
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
    from .. import _profiles
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
        out.append(_finding("cpu_fallback", f"{op} ran on the CPU ({label}), {count} times", hits[0][1], count,
                            seconds, nbytes, remedy, [s for _, s in hits[1:]], op=op, reason=reason))
    return out


def _copy_findings(run):
    out = []
    for site in run.sites:
        if not site.h2d:
            continue
        # The same few host tensors copied again and again (a constant rebuilt in the loop),
        constant = (site.h2d_repeats >= 3 and len(site.h2d_seen) <= 4
                    and _in_loop(run.steps, site.h2d_steps, site.h2d))
        # or many tiny copies per step (a tensor filled element by element from the host).
        per_step = site.h2d / site.h2d_steps
        tiny = per_step >= _TINY_COPIES_PER_STEP and site.h2d_bytes / site.h2d <= _TINY_COPY_BYTES
        if not (constant or tiny):
            continue
        if constant:
            what = f"the same host data copied to the npu {site.h2d} times"
            made_here = "torch.tensor" in _code(site) or "device=" in _code(site)
            remedy = ("build the tensor once, before the loop, and reuse it" if made_here else
                      "create the tensor on the npu once, before the loop (or with device='npu'), and reuse it")
        else:
            what = f"{site.h2d} tiny host-to-npu copies ({per_step:.0f} per step)"
            remedy = ("gather the values on the host and copy them in one tensor (torch.stack/cat, then one "
                      ".to('npu', non_blocking=True) from pinned memory), or compute them on the npu")
        out.append(_finding("host_to_device_copy", what, site, site.h2d, site.h2d_ns / 1e9, site.h2d_bytes, remedy,
                            repeats=site.h2d_repeats))
    return out


_SYNC_LABELS = (  # (text on the line, what the user wrote)
    (".item()", ".item()"), (".tolist()", ".tolist()"), (".cpu()", ".cpu()"), (".numpy()", ".numpy()"),
    ("synchronize(", "synchronize()"), ("print(", "print of an npu tensor"),
)


def _sync_label(site, code):
    for text, label in _SYNC_LABELS:
        if text in code:
            return label
    kind = site.sync_kinds.most_common(1)[0][0]
    return {"copy": "a copy to the host", "scalar": "a Python number or bool() read from an npu tensor",
            "shape": "an op whose output shape depends on the data (nonzero, masked_select, boolean index)",
            "print": "printing an npu tensor", "synchronize": "synchronize()"}[kind]


def _sync_findings(run):
    out = []
    for site in run.sites:
        if not site.syncs or not _in_loop(run.steps, site.sync_steps, site.syncs):
            continue
        label = _sync_label(site, _code(site))
        remedy = ("keep the value on the npu and read it rarely: accumulate on the device (e.g. total += "
                  "loss.detach()) and call .item() every N steps or once at the end; "
                  "each read waits for all queued npu work")
        if "synchronize" in label:
            remedy = ("remove synchronize() from the loop: the stream keeps the order of npu work; "
                      "synchronize only to time a region or before reading results on the host")
        elif "depends on the data" in label:
            remedy = ("use shape-static ops: torch.where(mask, x, 0) or masked_fill instead of boolean indexing, "
                      "nonzero_static with a known size")
        out.append(_finding("hidden_sync", f"{label} waits for the npu, {site.syncs} times", site, site.syncs,
                            site.sync_ns / 1e9, site.d2h_bytes, remedy, kinds=dict(site.sync_kinds)))
    return out


def _launch_findings(run):
    out = []
    for site in run.sites:
        if site.library or not site.direct_ops or site.direct_ns / site.direct_ops > _TINY_OP_NS:
            continue
        if site.most_ops_per_call < _TINY_OPS_PER_CALL:
            continue
        if run.steps >= _MIN_STEPS:
            many = site.direct_ops >= _TINY_OPS_PER_STEP * run.steps
        else:
            many = site.direct_ops >= _TINY_OPS_TOTAL
        if not many:
            continue
        per = f" ({site.direct_ops / run.steps:.0f} per step)" if run.steps else ""
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
        if site.library or not n or not _in_loop(run.steps, site.strided_steps, n):
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
    first = made[0] if made else max(used, key=lambda s: s.f64_ops)
    count = sum(s.f64_ops for s in used)
    seconds = sum(s.f64_ns for s in used) / 1e9
    fallbacks = sum(n for s in run.sites for (_, reason), n in s.fallbacks.items() if reason == "float64")
    title = f"float64 tensors on the npu: {count} ops" + (f", {fallbacks} of them on the CPU" if fallbacks else "")
    return [_finding("float64", title, first, count, seconds, 0,
                     "most float64 ops have no npu kernel and run on the CPU (and NPUs compute float64 slowly "
                     "or not at all): use float32 (torch.float32, .float()); numpy arrays are float64 by "
                     "default, so convert them with torch.from_numpy(a).float() before .to('npu')",
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
    keepers = sorted((s for s in run.sites if s.kept_steps >= _KEPT_STEPS), key=lambda s: -s.kept_steps)
    per_step = growth / (len(allocated) - 1)
    site = keepers[0] if keepers else None
    title = f"npu memory grows every step: +{per_step / 1024:.1f} KiB per step over {len(allocated)} steps"
    remedy = ("tensors made here in every step stay alive: store numbers, not tensors (loss.item() at the end, "
              "or .detach() and keep only what you need), and accumulate with `total += loss.detach()`, "
              "since `total += loss` keeps every step's autograd graph")
    if site is None:
        return [Finding("memory_growth", title, len(allocated), 0.0, growth, None, None, "", remedy)]
    return [_finding("memory_growth", title, site, len(allocated), 0.0, growth, remedy, keepers[1:6],
                     per_step_bytes=per_step)]


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


_RULES = (_fallback_findings, _copy_findings, _sync_findings, _launch_findings, _strided_findings,
          _float64_findings, _memory_findings, _compare_findings)


def diagnose(run):
    """All findings of a finished run, the costliest first (wrong results always first)."""
    findings = [f for rule in _RULES for f in rule(run)]
    findings.sort(key=lambda f: (f.kind != "wrong_result", -f.seconds, -f.bytes, f.kind))
    return findings
