"""The fused npu ops against the same computation composed of aten ops, on the npu.

For float32 tensors of 1 MB and 16 MB: forward alone, and forward plus backward.
The figure is composed time / fused time (above 1: the fused op is faster).
Targets: rms_norm, add_rms_norm, rotary_mul, swiglu >= 1.5x; fused_add_matmul no
slower (>= 1.0x). Each time is the best of interleaved repeats (noisy machines).

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
