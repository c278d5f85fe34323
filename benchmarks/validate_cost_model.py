"""The cost model against published measurements of real Ascend chips.

Each row is a workload built here from the published setup (the same op, shapes,
dtype, batch and timing loop; RWKV-7 from the paper, benchmarks/rwkv7.py), run on
the emulated npu under the profiler and projected onto the chip's profile with
the model the doctor and torch_npu.profiler use (profiler/_projection.py). A row
either calibrates one figure of the profiles (the figure is set so that the model
reproduces that measurement; the row then shows the calibrated value) or
validates: its measurement was used for no figure. The sources are
profiles/sources.toml; docs/cost_model.md holds the table this prints.

    python benchmarks/validate_cost_model.py            # every row (about 10 minutes on 2 cores)
    python benchmarks/validate_cost_model.py --quick    # the small rows only
    python benchmarks/validate_cost_model.py --markdown docs/cost_model.md   # rewrite the doc's table

Machine noise enters only through the Python time measured between ops (the
rows launched from Python); rows whose workload the publication launched from
C++ leave it out, as the real step had none.
"""
import argparse
import dataclasses
import os
import re
import sys
import time
from typing import Callable, Optional

os.environ.setdefault("NPU_EMU_PROFILE", "ascend910b3")   # every op these workloads use is native on the 910B3

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_npu  # noqa: E402,F401
from torch_npu._emu import profiles as _profiles  # noqa: E402
from torch_npu.profiler import ProfilerActivity, profile  # noqa: E402
from torch_npu.profiler import _analyse, _projection  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rwkv7 import RWKV7, RWKV7_0_1B, RWKV7_1_5B  # noqa: E402

DEV = "npu"


@dataclasses.dataclass
class Row:
    name: str                 # what was measured
    chip: str                 # the profile projected onto
    source: str               # a key of profiles/sources.toml
    published: float          # the published figure, in `unit`
    unit: str                 # "us/call", "ms/step", "TFLOPS", "ms"
    workload: Callable        # () -> (profile, calls): the window and how many calls it holds
    python: bool = True       # the publication launched the ops from Python
    calibrates: Optional[str] = None   # the profile figure this row calibrates, None: a validation row
    big: bool = False         # minutes of CPU work (left out by --quick)
    flops: float = 0.0        # per call, for TFLOPS rows
    device_only: bool = False  # the publication's host kept up: the figure is the device's time


def _profiled(body, warmup=1):
    for _ in range(warmup):
        body()
    torch.npu.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as prof:
        body()
        torch.npu.synchronize()
    return prof


def back_to_back(op, calls):
    """``calls`` calls of ``op`` back to back, then one synchronize (the published loops)."""
    def workload():
        def body():
            for _ in range(calls):
                op()
        return _profiled(body), calls
    return workload


def single_with_sync(op):
    """synchronize, the op, synchronize (the published single-op timings)."""
    def workload():
        return _profiled(op), 1
    return workload


def rnd(*shape, dtype=torch.float16):
    return torch.randn(*shape, device=DEV).to(dtype)


def linear(batch, width):
    x, w = rnd(batch, width), rnd(width, width)
    return lambda: F.linear(x, w)


def mm(n, dtype):
    a, b = rnd(n, n, dtype=dtype), rnd(n, n, dtype=dtype)
    return lambda: torch.mm(a, b)


def rwkv_eager(cfg, batch):
    def workload():
        model = RWKV7(cfg)
        tokens = torch.zeros(batch, dtype=torch.long, device=DEV)
        state = model.new_state(batch)
        return _profiled(lambda: model.step(tokens, state)), 1
    return workload


def rwkv_graph(cfg, batch):
    def workload():
        model = RWKV7(cfg)
        tokens = torch.zeros(batch, dtype=torch.long, device=DEV)
        state = model.new_state(batch)
        graph = torch.npu.NPUGraph()
        with torch.npu.graph(graph):
            model.step(tokens, state)
        return _profiled(graph.replay), 1
    return workload


def raw_launch_and_sync():
    """One tiny element-wise kernel and a stream synchronize (ascend-rs launches it
    through ACL: no adapter dispatch; projected with the launch's dispatch left out)."""
    x = rnd(4096)
    return single_with_sync(lambda: torch.relu(x))


def round_trip():
    """z = (x.npu() + y.npu()).cpu() of 128x128 float32 (pypto issue 1919)."""
    x, y = torch.randn(128, 128), torch.randn(128, 128)

    def workload():
        def body():
            for _ in range(10):
                (x.npu() + y.npu()).cpu()
        return _profiled(body), 10
    return workload


def llama_op(op):
    return single_with_sync(op)


def _rows(quick):
    L = 2048            # candle's Llama-7B shapes: batch 1, sequence 2048, hidden 4096, MLP 11008, 32 heads of 128
    rows = [
        # ---- calibration ----
        Row("F.linear, batch 1, 768x768 fp16, 500 calls back to back", "ascend910b3", "rwkv7-ascend-npu", 23.6,
            "us/call", back_to_back(linear(1, 768), 500), calibrates="host_dispatch_us"),
        Row("RWKV-7 0.1B decode step, batch 1, eager (device-bound: the graph replay gains nothing)", "ascend910b2",
            "rwkv7-ascend-910b2c", 1e3 / 323, "ms/step", rwkv_eager(RWKV7_0_1B, 1), python=False,
            calibrates="kernel_overhead_us", device_only=True),
        Row("RWKV-7 0.1B decode step, batch 1, NPUGraph replay", "ascend910b3", "rwkv7-ascend-npu", 2.8, "ms/step",
            rwkv_graph(RWKV7_0_1B, 1), python=False, calibrates="graph_kernel_overhead_us"),
        Row("tiny element-wise kernel launched through ACL + aclrtSynchronizeStream (19-31 us)", "ascend910b3",
            "ascend-rs-f", 25.0, "us", raw_launch_and_sync(), python=False, calibrates="sync_us"),
        Row("torch.mm 4096x4096 float32", "ascend910b2", "torch-mm-910b2", 84.53, "TFLOPS",
            back_to_back(mm(4096, torch.float32), 3), calibrates="cube_fp32_tflops", big=True, flops=2 * 4096 ** 3),
        # ---- validation ----
        Row("F.linear, batch 1, 2048x2048 fp16, 500 calls back to back", "ascend910b3", "rwkv7-ascend-npu", 23.9,
            "us/call", back_to_back(linear(1, 2048), 500)),
        Row("F.linear, batch 128, 768x768 fp16, 500 calls back to back", "ascend910b3", "rwkv7-ascend-npu", 23.8,
            "us/call", back_to_back(linear(128, 768), 500)),
        Row("torch.add 64x64 float32, 100 calls back to back (host time before the synchronize)", "ascend910b3",
            "candle-npu", 22.0, "us/call (host)", back_to_back(lambda: torch.add(_A64, _A64), 100)),
        Row("torch.add 64x64 float32, one call between two synchronizes", "ascend910b3", "candle-npu", 57.0, "us",
            single_with_sync(lambda: torch.add(_A64, _A64))),
        Row("z = (x.npu() + y.npu()).cpu(), 128x128 float32 (an A3; profile of the 9391 bin)", "ascend910_9391",
            "pypto-1919", 130.0, "us/call", round_trip()),
        Row("torch.mm 1024x1024 fp16, 30 calls back to back", "ascend910b2", "torch-mm-910b2", 98.08, "TFLOPS",
            back_to_back(mm(1024, torch.float16), 30), flops=2 * 1024 ** 3),
        Row("torch.mm 2048x2048 fp16, 30 calls back to back", "ascend910b2", "torch-mm-910b2", 251.01, "TFLOPS",
            back_to_back(mm(2048, torch.float16), 30), flops=2 * 2048 ** 3, big=True),
        Row("torch.mm 4096x4096 fp16, 3 calls back to back", "ascend910b2", "torch-mm-910b2", 314.52, "TFLOPS",
            back_to_back(mm(4096, torch.float16), 3), flops=2 * 4096 ** 3, big=True),
        Row("torch.mm 2048x2048 float32, 10 calls back to back", "ascend910b2", "torch-mm-910b2", 76.92, "TFLOPS",
            back_to_back(mm(2048, torch.float32), 10), flops=2 * 2048 ** 3, big=True),
        Row("matmul [1,2048,4096] x [4096,4096] fp16 (Llama-7B q projection)", "ascend910b3", "candle-npu", 314.2, "us",
            llama_op(_lazy(lambda: (rnd(1, L, 4096), rnd(4096, 4096)), torch.matmul)), big=True),
        Row("matmul [1,2048,4096] x [4096,11008] fp16 (Llama-7B MLP up)", "ascend910b3", "candle-npu", 778.1, "us",
            llama_op(_lazy(lambda: (rnd(1, L, 4096), rnd(4096, 11008)), torch.matmul)), big=True),
        Row("bmm [32,2048,128] x [32,128,2048] fp16 (attention scores)", "ascend910b3", "candle-npu", 273.7, "us",
            llama_op(_lazy(lambda: (rnd(32, L, 128), rnd(32, 128, L)), torch.bmm)), big=True),
        Row("matmul [1,2048,4096] x [4096,4096] float32", "ascend910b3", "candle-npu", 1062.7, "us",
            llama_op(_lazy(lambda: (rnd(1, L, 4096, dtype=torch.float32), rnd(4096, 4096, dtype=torch.float32)),
                           torch.matmul)), big=True),
        Row("softmax [32,2048,2048] fp16", "ascend910b3", "candle-npu", 936.5, "us",
            llama_op(_lazy(lambda: (rnd(32, L, L),), lambda x: torch.softmax(x, -1))), big=True),
        Row("silu [1,2048,11008] fp16", "ascend910b3", "candle-npu", 109.8, "us",
            llama_op(_lazy(lambda: (rnd(1, L, 11008),), F.silu))),
        Row("mul [1,2048,11008] x2 float32 (270 MB: past the L2)", "ascend910b3", "candle-npu", 288.5, "us",
            llama_op(_lazy(lambda: (rnd(1, L, 11008, dtype=torch.float32), rnd(1, L, 11008, dtype=torch.float32)),
                           torch.mul))),
        Row("add [1,2048,4096] x2 fp16", "ascend910b3", "candle-npu", 69.2, "us",
            llama_op(_lazy(lambda: (rnd(1, L, 4096), rnd(1, L, 4096)), torch.add))),
        Row("RWKV-7 0.1B decode step, batch 8, NPUGraph replay", "ascend910b3", "rwkv7-ascend-npu", 4.1, "ms/step",
            rwkv_graph(RWKV7_0_1B, 8), python=False),
        Row("RWKV-7 0.1B decode step, batch 64, NPUGraph replay", "ascend910b3", "rwkv7-ascend-npu", 6.7, "ms/step",
            rwkv_graph(RWKV7_0_1B, 64), python=False),
        Row("RWKV-7 0.1B decode step, batch 1, NPUGraph replay (a 910B2C)", "ascend910b2", "rwkv7-ascend-910b2c",
            1e3 / 312, "ms/step", rwkv_graph(RWKV7_0_1B, 1), python=False),
        Row("RWKV-7 0.1B decode step, batch 1, eager", "ascend910b3", "rwkv7-ascend-npu", 16.7, "ms/step",
            rwkv_eager(RWKV7_0_1B, 1), python=False),
        Row("RWKV-7 0.1B decode step, batch 64, eager", "ascend910b3", "rwkv7-ascend-npu", 16.6, "ms/step",
            rwkv_eager(RWKV7_0_1B, 64), python=False),
        Row("RWKV-7 1.5B decode step, batch 1, eager", "ascend910b3", "rwkv7-ascend-npu", 35.3, "ms/step",
            rwkv_eager(RWKV7_1_5B, 1), python=False, big=True),
        Row("RWKV-7 1.5B decode step, batch 1, NPUGraph replay", "ascend910b3", "rwkv7-ascend-npu", 8.9, "ms/step",
            rwkv_graph(RWKV7_1_5B, 1), python=False, big=True),
        Row("RWKV-7 1.5B decode step, batch 64, NPUGraph replay", "ascend910b3", "rwkv7-ascend-npu", 23.6, "ms/step",
            rwkv_graph(RWKV7_1_5B, 64), python=False, big=True),
    ]
    return [r for r in rows if not (quick and r.big)]


class _lazy:
    """An op on inputs made when the row runs (not when the table is built)."""

    def __init__(self, make, fn):
        self.make, self.fn, self.inputs = make, fn, None

    def __call__(self):
        if self.inputs is None:
            self.inputs = self.make()
        return self.fn(*self.inputs)


_A64 = None


def _projection_of(prof, chip, python):
    autograd_prof = prof.profiler
    results = autograd_prof.kineto_results
    found = _analyse.projections(prof, results)
    return _projection.project(results, found, _profiles.load(chip), python=python)


def _figure(row, p, calls):
    """The row's figure from the projection ``p`` of its window of ``calls`` calls."""
    if row.unit == "TFLOPS":
        return row.flops / (p.step_us / calls * 1e-6) / 1e12
    if row.unit == "ms/step":
        # steps back to back with no wait inside: one step per the busier of host and device
        return (p.device_us if row.device_only else max(p.host_us, p.device_us)) / calls / 1e3
    if row.unit == "us/call (host)":
        return p.host_us / calls
    if row.name.startswith("tiny element-wise"):
        return (p.step_us - p.dispatch_us) / calls     # raw ACL: no adapter dispatch
    return p.step_us / calls


def _calibrated(row, p, calls):
    """The value of ``row.calibrates`` that makes the model reproduce the published figure."""
    if row.calibrates == "host_dispatch_us":
        rest = p.step_us - p.dispatch_us
        return (row.published * calls - rest) / p.launches
    if row.calibrates in ("kernel_overhead_us", "graph_kernel_overhead_us"):   # device-bound steps
        roofline = p.device_us - p.overhead_us
        return (row.published * 1e3 * calls - roofline) / p.kernels
    if row.calibrates == "sync_us":
        return row.published - p.device_us / calls
    if row.calibrates == "cube_fp32_tflops":
        return row.published
    raise ValueError(row.calibrates)


def run(quick=False):
    global _A64
    _A64 = torch.randn(64, 64, device=DEV)
    out = []
    for row in _rows(quick):
        start = time.perf_counter()
        prof, calls = row.workload()
        p = _projection_of(prof, row.chip, row.python)
        projected = _figure(row, p, calls)
        result = {"row": row, "projected": projected, "error": projected / row.published - 1,
                  "seconds": time.perf_counter() - start, "projection": p}
        if row.calibrates:
            figure = _profiles.load(row.chip).cost_figures[row.calibrates]
            result["calibrated"] = _calibrated(row, p, calls)
            result["in_profile"] = figure.value
        out.append(result)
        print(_line(result), flush=True)
    return out


def _fmt(value, unit):
    return f"{value:,.1f} {unit}" if value >= 10 else f"{value:.2f} {unit}"


def _line(r):
    row = r["row"]
    text = (f"{row.name} [{row.chip}]: published {_fmt(row.published, row.unit)}, projected "
            f"{_fmt(r['projected'], row.unit)} ({100 * r['error']:+.0f}%)")
    if row.calibrates:
        text += f"; calibrates {row.calibrates} = {r['calibrated']:.2f} (profile: {r['in_profile']:g})"
    return text + f"  [{r['seconds']:.0f} s]"


def markdown(results):
    sources = _profiles.sources()
    lines = ["| role | measurement (chip) | published | projected | error | source |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        row = r["row"]
        role = f"calibrates `{row.calibrates}` ({r['calibrated']:.1f})" if row.calibrates else "validation"
        device = sources[row.source].get("chip", "")
        lines.append(f"| {role} | {row.name} ({_profiles.load(row.chip).device_name}; published on {device}) | "
                     f"{_fmt(row.published, row.unit)} | {_fmt(r['projected'], row.unit)} | "
                     f"{100 * r['error']:+.0f}% | [{row.source}]({sources[row.source]['url']}) |")
    validation = [r for r in results if not r["row"].calibrates]
    within = sum(abs(r["error"]) <= 0.30 for r in validation)
    lines += ["", f"Validation rows within 30% of the published figure: {within} of {len(validation)}."]
    return "\n".join(lines)


BEGIN, END = "<!-- validation table: benchmarks/validate_cost_model.py -->", "<!-- end of the validation table -->"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small rows only")
    parser.add_argument("--markdown", metavar="FILE", help="rewrite the validation table of FILE")
    args = parser.parse_args(argv)
    results = run(args.quick)
    table = markdown(results)
    print(f"\n{table}")
    if args.markdown:
        with open(args.markdown) as f:
            text = f.read()
        if BEGIN not in text or END not in text:
            raise SystemExit(f"{args.markdown}: no {BEGIN} ... {END} markers")
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), BEGIN + "\n" + table + "\n" + END, text, flags=re.S)
        with open(args.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
