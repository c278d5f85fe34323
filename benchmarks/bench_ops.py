"""Op performance of the npu against the cpu, measured in the same run.

* launch overhead: host time per call of ~10 representative ops on tiny tensors;
* throughput: the same ops on large tensors (out-of-place, and with out= where it
  exists so the allocator does not hide the kernel);
* a training step of a transformer block.

Each figure is the best of several interleaved repeats (these machines are noisy);
the ratio is npu time / cpu time (below 1: the npu is faster).
Targets (issue 3): large-tensor throughput >= 0.9x of cpu, i.e. time ratio <= 1.11;
small-op host overhead <= 2x of cpu (issue 45: <= 1.3x each, median <= 1.15x).

``--tiny`` runs the tiny table alone, the way its ratios are reported: per op, cpu
and npu timed alternately in each repeat, and the median of the repeats' ratios
(a loaded machine's noise then hits both sides of a ratio alike).

    python benchmarks/bench_ops.py [--quick] [--tiny] [--json results.json]
"""
import argparse
import copy
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_npu  # noqa: F401


def sync(device):
    if device == "npu":
        torch.npu.synchronize()


def time_call(fn, device, iters, repeats):
    """Best-of-repeats seconds per call (host time, with the device drained at the end)."""
    best = float("inf")
    fn()
    sync(device)
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        best = min(best, (time.perf_counter() - start) / iters)
    return best


def op_cases(n, side):
    """name -> (make inputs on cpu, function); n elements for pointwise ops, side for matrices."""
    return {
        "add": (lambda: (torch.randn(n), torch.randn(n)), lambda a, b: a + b),
        "mul_": (lambda: (torch.randn(n), torch.randn(n)), lambda a, b: a.mul_(1.0)),
        "exp": (lambda: (torch.randn(n),), lambda a: torch.exp(a)),
        "gelu": (lambda: (torch.randn(n),), lambda a: F.gelu(a)),
        "sum": (lambda: (torch.randn(n),), lambda a: a.sum()),
        "softmax": (lambda: (torch.randn(max(n // 256, 1), 256),), lambda a: torch.softmax(a, dim=-1)),
        "layer_norm": (lambda: (torch.randn(max(n // 256, 1), 256),), lambda a: F.layer_norm(a, (256,))),
        "mm": (lambda: (torch.randn(side, side), torch.randn(side, side)), lambda a, b: a @ b),
        "index_select": (lambda: (torch.randn(max(n // 64, 1), 64), torch.randint(0, max(n // 64, 1), (max(n // 64, 1),))),
                         lambda a, i: a.index_select(0, i)),
        "cat": (lambda: (torch.randn(n // 2 or 1), torch.randn(n // 2 or 1)), lambda a, b: torch.cat([a, b])),
    }


OUT_VARIANTS = {
    "add": lambda a, b, out: torch.add(a, b, out=out),
    "exp": lambda a, out: torch.exp(a, out=out),
    "mm": lambda a, b, out: torch.mm(a, b, out=out),
}


def bench_ops(n, side, iters, repeats):
    rows = []
    for name, (make, fn) in op_cases(n, side).items():
        inputs = make()
        times = {}
        for device in ("cpu", "npu"):
            args = [t.to(device) for t in inputs]
            times[device] = time_call(lambda: fn(*args), device, iters, repeats)
        rows.append((name, times["cpu"], times["npu"]))
        if name in OUT_VARIANTS and n > 4096:
            for device in ("cpu", "npu"):
                args = [t.to(device) for t in inputs]
                out = fn(*args)
                times[device] = time_call(lambda: OUT_VARIANTS[name](*args, out=out), device, iters, repeats)
            rows.append((name + "(out=)", times["cpu"], times["npu"]))
    return rows


class Block(nn.Module):
    def __init__(self, width=256, heads=4):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True)
        self.head = nn.Linear(width, width)

    def forward(self, x):
        return self.head(self.layer(x))


def bench_training(repeats, steps):
    torch.manual_seed(0)
    model = Block()
    x, y = torch.randn(8, 64, 256), torch.randn(8, 64, 256)
    times = {}
    for device in ("cpu", "npu"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        xd, yd = x.to(device), y.to(device)

        def step():
            opt.zero_grad()
            F.mse_loss(m(xd), yd).backward()
            opt.step()

        times[device] = time_call(step, device, steps, repeats)
    return times["cpu"], times["npu"]


def tiny_ratios(iters, repeats):
    """op -> (median cpu s, median npu s, median of the per-repeat npu/cpu ratios), interleaved."""
    rows = {}
    for name, (make, fn) in op_cases(16, 4).items():
        inputs = make()
        args = {device: [t.to(device) for t in inputs] for device in ("cpu", "npu")}
        times = {"cpu": [], "npu": []}
        for device in ("cpu", "npu"):
            time_call(lambda: fn(*args[device]), device, iters, 1)   # warm up
        for _ in range(repeats):
            for device in ("cpu", "npu"):
                times[device].append(time_call(lambda: fn(*args[device]), device, iters, 1))
        ratios = [n / c for c, n in zip(times["cpu"], times["npu"])]
        rows[name] = (statistics.median(times["cpu"]), statistics.median(times["npu"]), statistics.median(ratios))
    return rows


def print_rows(title, rows):
    print(f"\n{title}")
    print(f"  {'op':<20} {'cpu':>12} {'npu':>12} {'npu/cpu':>8}")
    for name, cpu, npu in rows:
        print(f"  {name:<20} {cpu * 1e6:>10.2f}us {npu * 1e6:>10.2f}us {npu / cpu:>8.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--tiny", action="store_true", help="only the tiny-op table, cpu and npu interleaved")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 7
    if args.tiny:
        rows = tiny_ratios(iters=300 if args.quick else 2000, repeats=repeats * 3)
        print(f"Host time per call, tiny tensors: median of {repeats * 3} interleaved repeats")
        print(f"  {'op':<14} {'cpu':>9} {'npu':>9} {'npu/cpu':>8}")
        for name, (cpu, npu, ratio) in rows.items():
            print(f"  {name:<14} {cpu * 1e6:>7.2f}us {npu * 1e6:>7.2f}us {ratio:>8.2f}")
        median = statistics.median(r for _, _, r in rows.values())
        print(f"  median npu/cpu {median:.2f} (target: each <= 1.3, median <= 1.15)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({name: {"cpu_s": c, "npu_s": n, "ratio": r} for name, (c, n, r) in rows.items()}, f, indent=2)
        return rows
    small = bench_ops(n=16, side=4, iters=300 if args.quick else 1000, repeats=repeats)
    large = bench_ops(n=1 << 24, side=1024, iters=2 if args.quick else 5, repeats=repeats)
    cpu_step, npu_step = bench_training(repeats=3 if args.quick else 5, steps=3)
    print_rows("Launch overhead: host time per call, tiny tensors (target npu/cpu <= 2)", small)
    print_rows("Throughput: 16M-element tensors, 1024x1024 mm (target npu/cpu <= 1.11)", large)
    print(f"\nTraining step, transformer block (256 wide, batch 8x64): cpu {cpu_step * 1e3:.1f} ms, "
          f"npu {npu_step * 1e3:.1f} ms, npu/cpu {npu_step / cpu_step:.2f}")
    results = {
        "small": {name: {"cpu_s": c, "npu_s": n, "ratio": n / c} for name, c, n in small},
        "large": {name: {"cpu_s": c, "npu_s": n, "ratio": n / c} for name, c, n in large},
        "training_step": {"cpu_s": cpu_step, "npu_s": npu_step, "ratio": npu_step / cpu_step},
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
