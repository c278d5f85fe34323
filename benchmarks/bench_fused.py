"""The fused npu ops against the same computation composed of aten ops, on the npu.

For float32 tensors of 1 MB and 16 MB: forward alone, and forward plus backward.
The figure is composed time / fused time (above 1: the fused op is faster).
Targets: rms_norm, add_rms_norm, rotary_mul, swiglu >= 1.5x; fused_add_matmul no
slower (>= 1.0x). Each time is the best of interleaved repeats (noisy machines).

    python benchmarks/bench_fused.py [--quick]
"""
import argparse
import time

import torch
import torch.nn.functional as F

import torch_npu


def best_time(fn, iters, repeats):
    fn()
    torch.npu.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.npu.synchronize()
        best = min(best, (time.perf_counter() - start) / iters)
    return best


def rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def cases(megabytes):
    rows = megabytes * (1 << 20) // 4 // 1024  # float32 rows of 1024
    x = torch.randn(rows, 1024, device="npu")
    x2 = torch.randn_like(x)
    gamma = torch.randn(1024, device="npu")
    seq = rows // 8
    q = torch.randn(8, seq // 8, 8, 128, device="npu")  # [batch, seq, heads, head_dim]
    cos, sin = (torch.randn(1, seq // 8, 1, 128, device="npu") for _ in range(2))
    side = int((megabytes * (1 << 20) // 4) ** 0.5) // 64 * 64
    m, w = torch.randn(side, side, device="npu"), torch.randn(side, side, device="npu")

    def rms_composed(a, g):
        return a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * g

    return [
        ("rms_norm", (x, gamma), lambda a, g: torch_npu.npu_rms_norm(a, g)[0], rms_composed),
        ("add_rms_norm", (x, x2, gamma), lambda a, b, g: torch_npu.npu_add_rms_norm(a, b, g)[0],
         lambda a, b, g: rms_composed(a + b, g)),
        ("rotary_mul", (q, cos, sin), lambda a, c, s: torch_npu.npu_rotary_mul(a, c, s),
         lambda a, c, s: a * c + rotate_half(a) * s),
        ("swiglu", (x,), lambda a: torch_npu.npu_swiglu(a), lambda a: F.silu(a[..., :512]) * a[..., 512:]),
        ("fused_add_matmul", (m, w), torch_npu.npu_fused_add_matmul, lambda a, b: a @ b + a),
    ]


def measure(fn, inputs, backward, iters, repeats):
    leaves = [t.detach().requires_grad_(backward) for t in inputs]

    def step():
        out = fn(*leaves)
        if backward:
            out.sum().backward()
            for t in leaves:
                t.grad = None

    return best_time(step, iters, repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args, _ = parser.parse_known_args(argv)  # run_all.py passes every benchmark the same flags
    iters, repeats = (3, 3) if args.quick else (5, 7)
    print("Fused npu ops: composed aten time / fused time (target >= 1.5x; fused_add_matmul >= 1.0x)")
    print(f"  {'op':<18}{'size':>6}{'forward':>10}{'fwd+bwd':>10}")
    for megabytes in (1, 16):
        for name, inputs, fused, composed in cases(megabytes):
            ratios = []
            for backward in (False, True):
                t_fused = measure(fused, inputs, backward, iters, repeats)
                t_composed = measure(composed, inputs, backward, iters, repeats)
                ratios.append(t_composed / t_fused)
            print(f"  {name:<18}{megabytes:>4}MB{ratios[0]:>9.2f}x{ratios[1]:>9.2f}x", flush=True)


if __name__ == "__main__":
    main()
