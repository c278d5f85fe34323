"""Foundation benchmark: allocation and copy costs of the npu against the cpu.

1. Host time to allocate and free a tensor (torch.empty + del) on the npu, whose
   caching allocator hands back a cached block, against the cpu allocator.
2. Bandwidth of cpu -> npu -> cpu copies of 64 MiB against torch's own cpu
   ``dst.copy_(src)`` of the same size between the same kind of memory (pageable,
   or pinned for the pinned copies), timed interleaved; ``numpy.copyto`` (one
   thread's memcpy) for scale.

Every figure is the median of several repeats, each timing many iterations with
time.perf_counter. Ratios are npu/cpu: for times above 1 means the npu is slower,
for bandwidths above 1 means the npu is faster. Runs in well under a minute.

    python benchmarks/bench_foundation.py [--json PATH] [--quick]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

try:  # `import torch` loads torch_npu through its entry point; be explicit anyway
    import torch_npu  # noqa: F401
except ImportError as error:  # pragma: no cover
    sys.exit(f"torch_npu is not importable: {error}")

KiB = 1 << 10
MiB = 1 << 20

ALLOC_SIZES = [("1KiB", 1 * KiB, 20000), ("1MiB", 1 * MiB, 10000), ("64MiB", 64 * MiB, 2000)]
COPY_BYTES = 64 * MiB


def median_time(fn, iterations, repeats):
    """Median over ``repeats`` of the mean seconds per call of ``fn`` (run ``iterations`` times)."""
    fn()  # warm-up: caches, page faults, lazy initialisation
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        samples.append((time.perf_counter() - start) / iterations)
    return statistics.median(samples)


def bench_alloc(device, nbytes, iterations, repeats):
    def alloc_free():
        t = torch.empty(nbytes, dtype=torch.uint8, device=device)
        del t

    seconds = median_time(alloc_free, iterations, repeats)
    if device.startswith("npu"):
        torch.npu.synchronize()
    return seconds


def bench_copies(repeats, iterations):
    """Seconds per copy of COPY_BYTES for each way of moving the bytes, and each one's
    ratio to torch's cpu ``copy_``: the median over repeats of the ratio within one
    repeat, where every way is timed in turn (interleaved), so that a change of the
    host's load in the middle of a run moves the copies and the reference alike."""
    n = COPY_BYTES // 4
    src = torch.randn(n)
    host_dst = torch.empty(n)
    npu_buf = torch.empty(n, device="npu")
    np_src, np_dst = src.numpy(), host_dst.numpy()
    pinned_src = src.pin_memory()
    pinned_dst = torch.empty(n, pin_memory=True)

    def h2d():
        npu_buf.copy_(src)
        torch.npu.synchronize()

    def d2h():
        host_dst.copy_(npu_buf)

    def round_trip():
        npu_buf.copy_(src)
        host_dst.copy_(npu_buf)

    def round_trip_allocating():
        src.to("npu").cpu()

    def round_trip_pinned_non_blocking():
        npu_buf.copy_(pinned_src, non_blocking=True)
        pinned_dst.copy_(npu_buf, non_blocking=True)
        torch.npu.synchronize()

    # The reference copies the same bytes between the same kind of memory: pageable
    # to pageable (the pageable copies' memory), and pinned to pinned.
    def torch_cpu_copy():
        host_dst.copy_(src)

    def torch_cpu_copy_pinned():
        pinned_dst.copy_(pinned_src)

    def numpy_copyto():
        np.copyto(np_dst, np_src)

    ways = {
        "cpu->npu": h2d,
        "npu->cpu": d2h,
        "cpu->npu->cpu": round_trip,
        "cpu->npu->cpu (.to/.cpu, allocating)": round_trip_allocating,
        "cpu->npu->cpu (pinned, non_blocking)": round_trip_pinned_non_blocking,
        "cpu copy_ (memcpy)": torch_cpu_copy,
        "cpu copy_ (pinned)": torch_cpu_copy_pinned,
        "numpy.copyto (memcpy)": numpy_copyto,
    }
    for fn in ways.values():
        fn()  # warm-up: caches, page faults, lazy initialisation
    samples = {name: [] for name in ways}
    for _ in range(repeats):
        for name, fn in ways.items():
            start = time.perf_counter()
            for _ in range(iterations):
                fn()
            samples[name].append((time.perf_counter() - start) / iterations)
    ratios = {}
    for name in ways:
        pinned = "pinned" in name
        reference = samples["cpu copy_ (pinned)" if pinned else "cpu copy_ (memcpy)"]
        copies = 2 if "->npu->" in name else 1  # a round trip is two copies
        ratios[name] = statistics.median(copies * r / s for r, s in zip(reference, samples[name]))
    # Check that the copies copied.
    round_trip()
    assert torch.equal(host_dst, src), "the cpu->npu->cpu round trip changed the data"
    return {name: statistics.median(times) for name, times in samples.items()}, ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke test)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per figure (median taken)")
    parser.add_argument("--copies", action="store_true", help="the copies only")
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    repeats = 3 if args.quick else args.repeats

    results = {
        "meta": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "intra_op_threads": torch.get_num_threads(),
            "npu": torch.npu.get_device_name(0),
            "env": {k: v for k, v in os.environ.items() if k.startswith("NPU_")},
            "repeats": repeats,
        },
        "alloc_free_us": {},
        "copy_64MiB": {},
    }

    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, {torch.get_num_threads()} intra-op threads, "
          f"{torch.npu.get_device_name(0)}; medians of {repeats} repeats\n")
    print("Allocate + free (torch.empty, del): host time per call")
    print(f"{'size':>8} | {'npu us':>9} | {'cpu us':>9} | {'npu/cpu':>8}")
    print("-" * 44)
    for label, nbytes, iterations in [] if args.copies else ALLOC_SIZES:
        npu_s = bench_alloc("npu", nbytes, max(1, iterations // scale), repeats)
        cpu_s = bench_alloc("cpu", nbytes, max(1, iterations // scale), repeats)
        row = {"npu_us": npu_s * 1e6, "cpu_us": cpu_s * 1e6, "ratio_npu_over_cpu": npu_s / cpu_s}
        results["alloc_free_us"][label] = row
        print(f"{label:>8} | {row['npu_us']:9.2f} | {row['cpu_us']:9.2f} | {row['ratio_npu_over_cpu']:7.2f}x")

    copies, ratios = bench_copies(repeats, max(1, 10 // scale))
    print(f"\nCopies of {COPY_BYTES // MiB} MiB: bandwidth (bytes moved / time); ratio = bandwidth / "
          f"the bandwidth of torch's cpu copy_ between the same kind of memory (pageable or pinned), "
          f"timed interleaved, median of the per-repeat ratios")
    print(f"{'copy':>38} | {'ms':>8} | {'GB/s':>7} | {'vs copy_':>9}")
    print("-" * 72)
    for name, seconds in copies.items():
        moved = COPY_BYTES * (2 if "->npu->" in name else 1)
        row = {"ms": seconds * 1e3, "GBps": moved / seconds / 1e9, "ratio_vs_cpu_copy": ratios[name]}
        results["copy_64MiB"][name] = row
        print(f"{name:>38} | {row['ms']:8.2f} | {row['GBps']:7.2f} | {row['ratio_vs_cpu_copy']:8.2f}x")

    if args.json:
        directory = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(directory, exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
        print(f"\nwrote {args.json}")
    return results


if __name__ == "__main__":
    main()
