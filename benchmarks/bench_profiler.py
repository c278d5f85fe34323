"""What profiling costs: a training step of a small transformer block on the
npu, not profiled, profiled with CPU activities only, and with CPU + NPU
activities (device kernels, copies and memory as well). Ratios of step times
in one run; target: CPU+NPU at most 1.3x of CPU-only profiling.

    python benchmarks/bench_profiler.py [--quick]
"""
import argparse
import contextlib
import time

import torch

import torch_npu
from torch_npu.profiler import ProfilerActivity, profile


def block(width=256):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(width, 4, dim_feedforward=4 * width, batch_first=True, dropout=0.0)
    return layer.npu()


def step_time(model, optimizer, x, steps, context):
    with context():
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        torch.npu.synchronize()
        return (time.perf_counter() - start) / steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args, _ = parser.parse_known_args(argv)
    steps, repeats = (5, 3) if args.quick else (10, 5)
    model = block()
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(8, 32, 256).npu()
    modes = {
        "off": contextlib.nullcontext,
        "cpu": lambda: profile(activities=[ProfilerActivity.CPU], profile_memory=True),
        "cpu+npu": lambda: profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU], profile_memory=True),
    }
    step_time(model, optimizer, x, 2, contextlib.nullcontext)  # warm up
    best = {name: float("inf") for name in modes}
    for _ in range(repeats):  # interleaved: the machine's noise hits every mode alike
        for name, context in modes.items():
            best[name] = min(best[name], step_time(model, optimizer, x, steps, context))
    print("Profiler overhead: training step of a 256-wide transformer block on the npu")
    print(f"  not profiled         {best['off'] * 1e3:8.2f} ms")
    print(f"  CPU activities       {best['cpu'] * 1e3:8.2f} ms  ({best['cpu'] / best['off']:.2f}x of not profiled)")
    print(f"  CPU + NPU activities {best['cpu+npu'] * 1e3:8.2f} ms  ({best['cpu+npu'] / best['off']:.2f}x of not "
          f"profiled, {best['cpu+npu'] / best['cpu']:.2f}x of CPU-only; target <= 1.3x)")


if __name__ == "__main__":
    main()
