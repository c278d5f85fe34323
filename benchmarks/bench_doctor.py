"""What the doctor costs: examples/train_lm.py on the npu, run plainly and under
``torch_npu.doctor.Doctor`` (as ``python -m torch_npu.doctor`` runs it: profiled
window included), and with ``--compare``; and a Python loop of tiny ops (the
launch-bound trap, where the doctor's per-op cost shows most). Ratios of wall times
in one run, interleaved so the machine's noise hits each alike; target: the doctor
at most 1.5x of a plain run of the training example (``--compare`` is slower by
design: every op runs twice).

    python benchmarks/bench_doctor.py [--quick]
"""
import argparse
import contextlib
import io
import os
import runpy
import time

import torch

import torch_npu
from torch_npu.doctor import Doctor

HERE = os.path.dirname(os.path.abspath(__file__))
train_lm = runpy.run_path(os.path.join(HERE, "..", "examples", "train_lm.py"))["main"]


def wall(steps, context):
    with contextlib.redirect_stdout(io.StringIO()), context():
        start = time.perf_counter()
        train_lm(["--device", "npu", "--steps", str(steps), "--log-every", str(steps)])
        torch.npu.synchronize()
        return time.perf_counter() - start


def tiny_ops(iterations, context):
    x = torch.zeros(16, device="npu")
    with context():
        start = time.perf_counter()
        for _ in range(iterations):
            for _ in range(50):
                x = x + 1.0
            x = x * 0.5
        torch.npu.synchronize()
        return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    args, _ = parser.parse_known_args(argv)
    steps, repeats = (40, 2) if args.quick else (150, 3)
    modes = {"plain": contextlib.nullcontext, "doctor": Doctor,
             "doctor --compare": lambda: Doctor(compare=True, profile=False)}
    wall(5, contextlib.nullcontext)  # warm up
    best = {name: float("inf") for name in modes}
    for _ in range(repeats):
        for name, context in modes.items():
            best[name] = min(best[name], wall(steps, context))
    print(f"Doctor overhead: examples/train_lm.py, {steps} training steps on the npu")
    print(f"  plain run          {best['plain']:7.2f} s")
    print(f"  doctor             {best['doctor']:7.2f} s  ({best['doctor'] / best['plain']:.2f}x; target <= 1.5x)")
    print(f"  doctor --compare   {best['doctor --compare']:7.2f} s  "
          f"({best['doctor --compare'] / best['plain']:.2f}x; every op also runs on the cpu)")
    loops = 20 if args.quick else 60
    tiny = {"plain": contextlib.nullcontext, "doctor": lambda: Doctor(profile=False)}
    tiny_ops(2, contextlib.nullcontext)
    fastest = {name: float("inf") for name in tiny}
    for _ in range(repeats):
        for name, context in tiny.items():
            fastest[name] = min(fastest[name], tiny_ops(loops, context))
    print(f"A loop of tiny ops ({loops} x 51 adds and muls of 16 floats): plain {fastest['plain'] * 1e3:.1f} ms, "
          f"doctor {fastest['doctor'] * 1e3:.1f} ms ({fastest['doctor'] / fastest['plain']:.2f}x)")


if __name__ == "__main__":
    main()
