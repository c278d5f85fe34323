"""Pinned host memory: a DataLoader-style step (pin a batch, copy it to the npu
non_blocking, free the pinned copy, synchronise) with the caching host allocator, against the same
step when every pin is a fresh host allocation (torch.accelerator.empty_host_cache()
after each step gives the block back, as the allocator did before it cached).

Each figure is the median over repeats of the mean time per step (synchronised at the
end of each repeat). Ratio = fresh / cached (above 1: caching is faster).

    python benchmarks/bench_pinned.py [--json PATH]
"""
import argparse
import json
import statistics
import time

import torch
import torch_npu  # noqa: F401

SIZES = [("64KiB", 64 << 10, 2000), ("4MiB", 4 << 20, 200), ("64MiB", 64 << 20, 20)]


def step_time(nbytes, iterations, fresh, repeats=5):
    src = torch.ones(nbytes // 4)
    dst = torch.empty(nbytes // 4, device="npu")

    def step():
        pinned = src.pin_memory()
        dst.copy_(pinned, non_blocking=True)
        del pinned
        torch.npu.synchronize()  # in both variants: the copy ran, its block is free
        if fresh:
            torch.accelerator.empty_host_cache()  # ... and goes back to the host

    step()
    torch.npu.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            step()
        torch.npu.synchronize()
        samples.append((time.perf_counter() - start) / iterations)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {}
    for name, nbytes, iterations in SIZES:
        cached = step_time(nbytes, iterations, fresh=False)
        fresh = step_time(nbytes, iterations, fresh=True)
        results[name] = {"cached_us": round(cached * 1e6, 1), "fresh_us": round(fresh * 1e6, 1),
                         "ratio": round(fresh / cached, 2)}
        print(f"pin + non_blocking copy {name:>6}: cached {cached * 1e6:9.1f} us  fresh {fresh * 1e6:9.1f} us  "
              f"fresh/cached {fresh / cached:5.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
