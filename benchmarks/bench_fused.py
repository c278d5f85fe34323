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
    llm_main(iters, repeats)


# ---- LLM operators: mixture of experts and int8 quantization ---------------------------------

def llm_cases(scale):
    """(name, inputs, fused, composed, has_backward) at `scale` x 256 tokens: the MoE and
    quantization ops of serving and training against what code without them writes."""
    tokens, hidden, ffn, experts, k = 256 * scale, 1024, 256, 16, 2
    logits = torch.randn(tokens, 64, device="npu")
    x = torch.randn(tokens, hidden, device="npu")
    _, expert_idx, _ = torch_npu.npu_moe_gating_top_k_softmax(torch.randn(tokens, experts, device="npu"), k=k)
    flat = expert_idx.flatten().long()
    counts = torch.bincount(flat, minlength=experts)
    sizes = counts.tolist()
    xg = torch.randn(tokens * k, 512, device="npu")
    w = torch.randn(experts, 512, ffn, device="npu") * 0.05
    permuted = torch.randn(tokens * k, hidden, device="npu")
    order = torch.randperm(tokens * k, device="npu")
    probs = torch.rand(tokens, k, device="npu")
    xb = x.bfloat16()
    a8 = torch.randint(-128, 128, (tokens, 1024), dtype=torch.int8, device="npu")
    b8 = torch.randint(-128, 128, (1024, 1024), dtype=torch.int8, device="npu")
    w_scale, t_scale = torch.rand(1024, device="npu") * 1e-3, torch.rand(tokens, device="npu")

    def routing_composed(a):
        sorted_pairs = torch.argsort(flat, stable=True)
        row_idx = torch.empty_like(sorted_pairs).scatter_(0, sorted_pairs, torch.arange(flat.numel(), device="npu"))
        torch.bincount(flat, minlength=experts)
        return a[sorted_pairs // k] + 0 * row_idx[:1, None]

    def quant_composed(a):
        s = a.float().abs().amax(-1, keepdim=True) / 127
        return torch.round(a.float() / s).clamp(-128, 127).to(torch.int8)

    return [
        ("moe_gating_top_k", (logits,), lambda a: torch_npu.npu_moe_gating_top_k_softmax(a, k=k)[0],
         lambda a: torch.softmax(a, -1).topk(k, -1).values, True),
        ("moe_init_routing", (x,), lambda a: torch_npu.npu_moe_init_routing_v2(
            a, expert_idx, expert_num=experts, expert_tokens_num_flag=True, expert_tokens_num_type=1)[0],
         routing_composed, True),
        ("grouped_matmul", (xg, w), lambda a, b: torch_npu.npu_grouped_matmul(
            [a], [b], group_list=counts, group_list_type=1, group_type=0, split_item=3)[0],
         lambda a, b: torch.cat([part @ b[e] for e, part in enumerate(a.split(sizes))]), True),
        ("moe_token_unpermute", (permuted, probs), lambda p, q: torch_npu.npu_moe_token_unpermute(p, order.int(), q),
         lambda p, q: (p[order].view(tokens, k, hidden) * q.unsqueeze(-1)).sum(1), True),
        ("dynamic_quant", (xb,), lambda a: torch_npu.npu_dynamic_quant(a)[0], quant_composed, False),
        ("quant_matmul", (a8, b8), lambda a, b: torch_npu.npu_quant_matmul(
            a, b, w_scale, pertoken_scale=t_scale, output_dtype=torch.bfloat16),
         lambda a, b: (a.float() @ b.float() * w_scale * t_scale[:, None]).to(torch.bfloat16), False),
    ]


def llm_main(iters, repeats, scales=(1, 8)):
    print("LLM ops (MoE, int8): composed aten time / fused time "
          "(target >= 1.5x; grouped_matmul, quant_matmul >= 1.0x)")
    print(f"  {'op':<20}{'tokens':>7}{'forward':>10}{'fwd+bwd':>10}")
    for scale in scales:
        for name, inputs, fused, composed, has_backward in llm_cases(scale):
            ratios = []
            for backward in (False, True) if has_backward else (False,):
                t_fused = measure(fused, inputs, backward, iters, repeats)
                t_composed = measure(composed, inputs, backward, iters, repeats)
                ratios.append(f"{t_composed / t_fused:>9.2f}x")
            ratios += ["         -"] * (2 - len(ratios))
            print(f"  {name:<20}{256 * scale:>7}{ratios[0]}{ratios[1]}", flush=True)


if __name__ == "__main__":
    main()
