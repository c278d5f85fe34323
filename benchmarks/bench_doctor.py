"""What the doctor costs, as users run it: the training examples alone, and under
``python -m torch_npu.doctor`` (run as the default target chip, profiled window,
projection and report included), as whole processes; and a Python loop of tiny
ops (the launch-bound trap, where the doctor's per-op cost shows most), in
process, next to the floor of any Python dispatch mode (one that only calls the
op: what the doctor's design costs before it looks at anything). Ratios of medians
of runs interleaved so that the machine's noise hits each alike. Targets: the
doctor at most 1.3x of the script alone on the training examples, 2x on the loop
of tiny ops.

    python benchmarks/bench_doctor.py [--quick] [--tiny-only]
"""
import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = {   # (script, arguments): a minute or less of training on the npu each
    "train_lm.py": ["--device", "npu", "--steps", "150", "--log-every", "150"],
    "cnn_digits.py": ["--device", "npu", "--epochs", "2"],
}


def timed(cmd):
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def examples(repeats, quick):
    print("The doctor on the training examples (whole processes, median of "
          f"{repeats} interleaved runs; the doctor runs the script as the default target, ascend910b2)")
    worst = 0.0
    for script, args in EXAMPLES.items():
        if quick:
            args = [a if a not in ("150", "2") else {"150": "60", "2": "1"}[a] for a in args]
        path = os.path.join("examples", script)
        plain_cmd = [sys.executable, path, *args]
        doctor_cmd = [sys.executable, "-m", "torch_npu.doctor", "--no-progress", path, *args]
        plain, doctor = [], []
        for _ in range(repeats):
            plain.append(timed(plain_cmd))
            doctor.append(timed(doctor_cmd))
        ratio = statistics.median(doctor) / statistics.median(plain)
        worst = max(worst, ratio)
        print(f"  {script:<14} alone {statistics.median(plain):6.2f} s   doctor {statistics.median(doctor):6.2f} s   "
              f"{ratio:.2f}x")
    print(f"  worst: {worst:.2f}x (target <= 1.3x)")


def tiny_ops(loops, repeats):
    import torch
    import torch_npu  # noqa: F401
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch_npu.doctor import Doctor

    class Bare(TorchDispatchMode):
        """The floor of a Python dispatch mode: it calls the op, nothing else."""

        @classmethod
        def _should_skip_dynamo(cls):
            return False   # (the doctor's mode leaves out torch's wrapper too)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func._op(*args, **(kwargs or {}))

    def run(context):
        x = torch.zeros(16, device="npu")
        with context():
            start = time.perf_counter()
            for _ in range(loops):
                for _ in range(50):
                    x = x + 1.0
                x = x * 0.5
            torch.npu.synchronize()
            return time.perf_counter() - start

    modes = {"plain": contextlib.nullcontext, "bare mode": Bare, "doctor": lambda: Doctor(profile=False)}
    run(contextlib.nullcontext)
    times = {name: [] for name in modes}
    for _ in range(repeats):
        for name, context in modes.items():
            times[name].append(run(context))
    plain, bare, doctor = (statistics.median(times[n]) for n in ("plain", "bare mode", "doctor"))
    print(f"A loop of tiny ops ({loops} x 51 adds and muls of 16 floats): plain {plain * 1e3:.1f} ms, "
          f"doctor {doctor * 1e3:.1f} ms ({doctor / plain:.2f}x, target <= 2x); a bare Python dispatch mode "
          f"{bare * 1e3:.1f} ms ({bare / plain:.2f}x: the floor of the design)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--tiny-only", action="store_true", help="only the loop of tiny ops")
    args, _ = parser.parse_known_args(argv)
    repeats = 3 if args.quick else 5
    if not args.tiny_only:
        examples(repeats, args.quick)
    tiny_ops(20 if args.quick else 60, repeats)


if __name__ == "__main__":
    main()
