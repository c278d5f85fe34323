"""The fused npu ops against the same computation composed of aten ops, on the npu.

For float32 tensors of 1 MB and 16 MB: forward alone, and forward plus backward.
The figure is composed time / fused time (above 1: the fused op is faster).
Targets: rms_norm, add_rms_norm, rotary_mul, swiglu >= 1.5x; fused_add_matmul no
slower (>= 1.0x). Each time is the best of interleaved repeats (noisy machines).
The LLM positional ops (position_cases) follow, against the compositions they stand
for at two sizes each: memory-bound ones >= 1.5x, transpose_batchmatmul >= 1.0x.

Then the attention ops of LLM serving (float16, GQA 8 query / 2 kv heads, head size
64) against the composition a user would write on the npu (repeat_interleave, matmul,
masked_fill, softmax, matmul; index gathers for the paged cache), at two sequence
lengths: prefill (npu_prompt_flash_attention, causal), paged decode
(npu_incre_flash_attention and npu_fused_infer_attention_score, 8 sequences, blocks
of 16), npu_scatter_pa_kv_cache (memory-bound: index_put into the cache) and
npu_fusion_attention_grad (against autograd of the composition). Targets: >= 1.0x
for the attention (matmul-bound), >= 1.5x for the scatter.

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


# ---- the LLM positional ops (torch_npu/ops/position.py) ----------------------------------------------

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


def attention_cases(seq):
    """(name, fused, composed) for the LLM attention ops at sequence length `seq`, float16."""
    heads, kv_heads, d, batch, block = 8, 2, 64, 8, 16
    group, scale = heads // kv_heads, 1 / d ** 0.5
    half = dict(device="npu", dtype=torch.float16)
    q, k, v = torch.randn(1, heads, seq, d, **half), torch.randn(1, kv_heads, seq, d, **half), \
        torch.randn(1, kv_heads, seq, d, **half)
    causal = torch.ones(seq, seq, dtype=torch.bool, device="npu").triu(1)
    compressed = torch.ones(2048, 2048, dtype=torch.bool, device="npu").triu(1)

    def attend(q, k, v, mask=None):
        scores = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * scale
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        return scores.softmax(-1) @ v.repeat_interleave(group, 1)

    # a paged cache holding `seq` tokens of each of `batch` sequences, blocks shuffled
    blocks = batch * seq // block
    key_cache = torch.randn(blocks, block, kv_heads * d, **half)
    value_cache = torch.randn(blocks, block, kv_heads * d, **half)
    table = torch.randperm(blocks, device="npu").view(batch, -1).int()
    slots = (table.long().unsqueeze(-1) * block + torch.arange(block, device="npu")).view(batch, -1)  # [B, seq]
    q_decode = torch.randn(batch, 1, heads * d, **half)

    def paged_composed():
        keys = key_cache.view(-1, kv_heads, d)[slots].transpose(1, 2)   # [B, kv heads, seq, d]
        values = value_cache.view(-1, kv_heads, d)[slots].transpose(1, 2)
        return attend(q_decode.view(batch, heads, 1, d), keys, values)

    lengths = [seq] * batch
    decode_args = dict(num_heads=heads, num_key_value_heads=kv_heads, block_table=table, block_size=block)
    # scatter: `seq` new tokens of every sequence into the cache
    new_k = torch.randn(batch * seq, kv_heads, d, **half)
    flat_slots = slots.reshape(-1)

    def scatter_composed():
        key_cache.view(-1, kv_heads, d)[flat_slots] = new_k
        value_cache.view(-1, kv_heads, d)[flat_slots] = new_k

    # the backward of attention: the grad op against autograd of the composition
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    out = attend(*leaves, causal)
    dy = torch.randn_like(out)
    # the statistics and output of the forward, as MindSpeed passes them to the grad op
    _, softmax_max, softmax_sum, _, *_ = torch_npu.npu_fusion_attention(
        *(t.detach() for t in leaves), heads, "BNSD", scale=scale, sparse_mode=2)
    return [
        ("prompt_flash_attn", lambda: torch_npu.npu_prompt_flash_attention(
            q, k, v, num_heads=heads, num_key_value_heads=kv_heads, input_layout="BNSD", scale_value=scale,
            atten_mask=compressed, sparse_mode=3), lambda: attend(q, k, v, causal)),
        ("incre_flash_attn", lambda: torch_npu.npu_incre_flash_attention(
            q_decode, key_cache, value_cache, scale_value=scale, actual_seq_lengths=lengths, **decode_args),
         paged_composed),
        ("fused_infer_attn", lambda: torch_npu.npu_fused_infer_attention_score(
            q_decode, key_cache, value_cache, scale=scale, actual_seq_lengths_kv=lengths, **decode_args)[0],
         paged_composed),
        ("scatter_pa_kv", lambda: torch_npu.npu_scatter_pa_kv_cache(
            new_k, new_k, key_cache.view(blocks, block, kv_heads, d), value_cache.view(blocks, block, kv_heads, d),
            flat_slots, cache_mode="Norm"), scatter_composed),
        ("fusion_attn_grad", lambda: torch_npu.npu_fusion_attention_grad(
            *(t.detach() for t in leaves), dy, heads, "BNSD", scale_value=scale, sparse_mode=2,
            softmax_max=softmax_max, softmax_sum=softmax_sum, attention_in=out.detach()),
         lambda: torch.autograd.grad(out, leaves, dy, retain_graph=True)),
    ]


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
    print("LLM attention ops, float16: composed time / fused time, forward "
          "(target >= 1.0x; scatter_pa_kv >= 1.5x; fusion_attn_grad: the backward, float32)")
    print(f"  {'op':<18}{'seq':>6}{'fused ms':>10}{'speed-up':>10}")
    for seq in (256, 1024):
        for name, fused, composed in attention_cases(seq):
            t_fused = best_time(fused, iters, repeats)
            t_composed = best_time(composed, iters, repeats)
            print(f"  {name:<18}{seq:>6}{t_fused * 1e3:>10.2f}{t_composed / t_fused:>9.2f}x", flush=True)
    llm_main(iters, repeats)
    run_position(iters, repeats)


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
            a, expert_idx, expert_num=experts, expert_tokens_num_flag=True, expert_tokens_num_type=1, quant_mode=-1)[0],
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
