"""The fused npu ops against the same computation composed of aten ops, on the npu.

For float32 tensors of 1 MB and 16 MB: forward alone, and forward plus backward.
The figure is composed time / fused time (above 1: the fused op is faster).
Targets: rms_norm, add_rms_norm, rotary_mul, swiglu >= 1.5x; fused_add_matmul no
slower (>= 1.0x). Each time is the best of interleaved repeats (noisy machines).
The LLM positional ops (position_cases) follow, against the compositions they stand
for at two sizes each: memory-bound ones >= 1.5x, transpose_batchmatmul >= 1.0x.

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


# ---- the LLM positional ops (torch_npu/_llm_position.py) --------------------------------------------

def _rope_tables(rows, dim, dtype=torch.float32):
    """Unit-magnitude cos/sin (real rotations), so in-place repeats keep the values finite."""
    angles = torch.rand(rows, dim // 2, device="npu") * 6.28
    angles = torch.cat((angles, angles), -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _mrope_composed(positions, q, k, cache, head_size, sections):
    cos, sin = cache[positions].chunk(2, -1)  # [3, T, R/2]
    cos = torch.cat([part[i] for i, part in enumerate(cos.split(sections, -1))], -1)[:, None]
    sin = torch.cat([part[i] for i, part in enumerate(sin.split(sections, -1))], -1)[:, None]

    def rotate(x):
        x = x.view(x.shape[0], -1, head_size)
        x1, x2 = x.chunk(2, -1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(1)

    return rotate(q), rotate(k)


def _top_k_top_p_composed(logits, p, k):
    values, order = logits.sort(dim=-1, descending=False, stable=True)
    kth = values.gather(-1, (logits.shape[1] - k.long()).unsqueeze(1))
    values = values.masked_fill(values < kth, float("-inf"))
    drop = values.softmax(-1).cumsum(-1) <= 1 - p.unsqueeze(1)
    drop[:, -1] = False
    return torch.empty_like(values).scatter_(-1, order, values.masked_fill(drop, float("-inf")))


def position_cases(scale):
    """(name, inputs, differentiable input indices or None, op, composition) at size `scale` (1 or 16)."""
    tokens = 64 * scale
    # Rotary embedding of a Qwen-like layer: 32 query heads, 8 key heads, head_dim 128.
    q, k = torch.randn(1, tokens, 32, 128, device="npu"), torch.randn(1, tokens, 8, 128, device="npu")
    cos, sin = (t.view(1, tokens, 1, 128) for t in _rope_tables(tokens, 128))
    # Multimodal rope (Qwen2-VL sections) from a cos|sin cache of 4096 positions.
    q2, k2 = q.view(tokens, -1), k.view(tokens, -1)
    cos_table, sin_table = _rope_tables(4096, 128)
    cache = torch.cat((cos_table[:, :64], sin_table[:, :64]), -1)
    positions = torch.randint(0, 4096, (3, tokens), device="npu")
    sections = [16, 24, 24]
    # DeepSeek MLA's interleaved rope part: [tokens, heads, 1, 64] bfloat16.
    xi = torch.randn(tokens * 4, 32, 1, 64, device="npu", dtype=torch.bfloat16)
    ci, si = (t.view(tokens * 4, 1, 1, 64) for t in _rope_tables(tokens * 4, 64, torch.bfloat16))
    # Sampling: 2 or 32 rows of a 32k vocabulary.
    logits = torch.randn(2 * scale, 32768, device="npu") * 3
    p = torch.full((2 * scale,), 0.9, device="npu")
    top_k = torch.full((2 * scale,), 50, dtype=torch.int32, device="npu")
    # Attention probabilities of a training step: [batch, heads, seq, seq] with a causal mask.
    seq = 128 * int(scale ** 0.5)
    scores = torch.randn(2, 8, seq, seq, device="npu")
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device="npu"), 1).expand(2, 1, seq, seq)
    # MLA's value up-projection: [tokens, 16 heads, 512] x [16, 512, 128].
    latent = torch.randn(tokens * 2, 16, 512, device="npu")
    w_uv = torch.randn(16, 512, 128, device="npu") / 20

    def interleave_composed(x, c, s):
        x = torch.cat((x[..., 0::2], x[..., 1::2]), -1)
        return x * c + rotate_half(x) * s

    return [
        ("apply_rotary_pos_emb", (q, k, cos, sin), None,
         lambda a, b, c, s: torch_npu.npu_apply_rotary_pos_emb(a, b, c, s),
         lambda a, b, c, s: (a * c + rotate_half(a) * s, b * c + rotate_half(b) * s)),
        ("mrope", (positions, q2, k2, cache), (1, 2),
         lambda pos, a, b, t: torch_npu.npu_mrope(pos, a, b, t, 128, mrope_section=sections),
         lambda pos, a, b, t: _mrope_composed(pos, a, b, t, 128, sections)),
        ("interleave_rope", (xi, ci, si), (0,), torch_npu.npu_interleave_rope, interleave_composed),
        ("top_k_top_p", (logits, p, top_k), (0,), torch_npu.npu_top_k_top_p, _top_k_top_p_composed),
        ("scaled_masked_softmax", (scores, causal), (0,),
         lambda x, m: torch_npu.npu_scaled_masked_softmax(x, m, 0.125),
         lambda x, m: torch.softmax((x * 0.125).masked_fill(m, -10000.0), -1)),
        ("transpose_batchmatmul", (latent, w_uv), (0, 1),
         lambda x, w: torch_npu.npu_transpose_batchmatmul(x, w, perm_x1=(1, 0, 2)),
         lambda x, w: (x.transpose(0, 1) @ w).transpose(0, 1).contiguous()),
    ]


def _position_step(fn, inputs, differentiable, backward):
    leaves = [t.detach().requires_grad_(backward and i in differentiable) for i, t in enumerate(inputs)]

    def step():
        out = fn(*leaves)
        if backward:
            sum(o.float().sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
            for t in leaves:
                t.grad = None

    return step


def compare_position(op, composed, inputs, differentiable, backward, iters, repeats):
    """composed time / op time, each the best of repeats interleaved with the other's."""
    steps = [_position_step(fn, inputs, differentiable, backward) for fn in (op, composed)]
    best = [float("inf")] * 2
    for _ in range(repeats):
        for i, step in enumerate(steps):
            best[i] = min(best[i], best_time(step, iters, 1))
    return best[1] / best[0]


def run_position(iters, repeats):
    print("LLM positional npu ops: composed aten time / op time (target >= 1.5x; transpose_batchmatmul >= 1.0x)")
    print(f"  {'op':<22}{'size':>6}{'forward':>10}{'fwd+bwd':>10}")
    for scale in (1, 16):
        for name, inputs, differentiable, op, composed in position_cases(scale):
            ratios = []
            for backward in (False, True) if differentiable else (False,):
                ratio = compare_position(op, composed, inputs, differentiable, backward, iters, repeats)
                ratios.append(f"{ratio:>9.2f}x")
            ratios += ["        -"] * (2 - len(ratios))
            print(f"  {name:<22}{'x' + str(scale):>6}{ratios[0]}{ratios[1]}", flush=True)


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
    run_position(iters, repeats)


if __name__ == "__main__":
    main()
