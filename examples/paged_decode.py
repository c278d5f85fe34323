"""A tiny decoder served with a paged KV cache, as vllm-ascend serves models.

Two layers of GQA attention (4 query heads, 2 kv heads, head size 32) with
rotary positions, random weights seeded on the npu, float16. The served model
keeps each layer's keys and values in blocks of 16 tokens
(``npu_scatter_pa_kv_cache``, blocks handed out in a shuffled order); the prompt
is prefilled with ``npu_prompt_flash_attention`` (or ``npu_fused_infer_attention_score``),
then each new token is decoded with ``npu_incre_flash_attention`` (or the fused
infer op) reading the cache through the block table. The "vllm_ascend" engine
calls the fused infer op for both as vllm-ascend does: tokens packed (layout
TND, cumulative query ends), keys read from the paged cache with each
sequence's length, causal (sparse_mode 3). The same model with dense
attention (the plain composition softmax(q k^T / sqrt(d) + causal) v, keys and
values concatenated) generates the same tokens greedily.

    python examples/paged_decode.py [--engine pfa_ifa|fused_infer|vllm_ascend] [--tokens 24]
"""
import argparse
import math

import torch

import torch_npu

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, FFN = 96, 128, 4, 2, 32, 2, 256
BLOCK_SIZE, NUM_BLOCKS = 16, 32
CAUSAL_2048 = None  # Ascend's compressed causal pattern, made on first use


class TinyDecoder:
    """Weights and the parts of a Llama-like decoder; attention is the caller's."""

    def __init__(self, seed=0, device="npu", dtype=torch.float16):
        torch.npu.manual_seed(seed)

        def w(*shape):
            return (torch.randn(*shape, device=device) / math.sqrt(shape[0])).to(dtype)

        self.embed = torch.randn(VOCAB, HIDDEN, device=device).to(dtype)
        self.layers = [dict(wq=w(HIDDEN, HEADS * HEAD_DIM), wk=w(HIDDEN, KV_HEADS * HEAD_DIM),
                            wv=w(HIDDEN, KV_HEADS * HEAD_DIM), wo=w(HEADS * HEAD_DIM, HIDDEN),
                            w_gate_up=w(HIDDEN, 2 * FFN), w_down=w(FFN, HIDDEN),
                            norm1=torch.ones(HIDDEN, device=device, dtype=dtype),
                            norm2=torch.ones(HIDDEN, device=device, dtype=dtype)) for _ in range(LAYERS)]
        self.norm = torch.ones(HIDDEN, device=device, dtype=dtype)
        self.head = w(HIDDEN, VOCAB)
        inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
        self.inv_freq = inv

    def rope(self, x, positions):
        """x [B, S, heads, D], positions [S]: rotate-half rotary embedding."""
        angles = positions.float().unsqueeze(-1) * self.inv_freq          # [S, D/2]
        cos = torch.cat([angles.cos(), angles.cos()], -1)[None, :, None, :]
        sin = torch.cat([angles.sin(), angles.sin()], -1)[None, :, None, :]
        x1, x2 = x.float().chunk(2, -1)
        return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)

    def forward(self, tokens, positions, attend):
        """tokens [B, S]; attend(layer, q [B,S,N,D], k/v [B,S,KVN,D]) -> [B, S, N, D]. -> logits [B, S, V]."""
        x = self.embed[tokens]
        b, s = tokens.shape
        for index, layer in enumerate(self.layers):
            h = torch_npu.npu_rms_norm(x, layer["norm1"], 1e-6)[0]
            q = self.rope((h @ layer["wq"]).view(b, s, HEADS, HEAD_DIM), positions)
            k = self.rope((h @ layer["wk"]).view(b, s, KV_HEADS, HEAD_DIM), positions)
            v = (h @ layer["wv"]).view(b, s, KV_HEADS, HEAD_DIM)
            x = x + attend(index, q, k, v).reshape(b, s, -1) @ layer["wo"]
            h = torch_npu.npu_rms_norm(x, layer["norm2"], 1e-6)[0]
            x = x + torch_npu.npu_swiglu(h @ layer["w_gate_up"]) @ layer["w_down"]
        return torch_npu.npu_rms_norm(x, self.norm, 1e-6)[0] @ self.head


class DenseAttention:
    """Keys and values concatenated per layer; the plain composition, in float32."""

    def __init__(self):
        self.keys, self.values = {}, {}

    def __call__(self, layer, q, k, v):
        if layer in self.keys:
            k, v = torch.cat([self.keys[layer], k], 1), torch.cat([self.values[layer], v], 1)
        self.keys[layer], self.values[layer] = k, v
        qf, kf, vf = (t.transpose(1, 2).float() for t in (q, k, v))   # [B, heads, S, D]
        group = HEADS // KV_HEADS
        kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
        scores = qf @ kf.transpose(-1, -2) / math.sqrt(HEAD_DIM)
        sq, skv = scores.shape[-2:]
        causal = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril(skv - sq)
        scores = scores.masked_fill(~causal, float("-inf"))
        return (scores.softmax(-1) @ vf).transpose(1, 2).to(q.dtype)


class PagedAttention:
    """Per layer a key and a value cache of blocks [blocks, block_size, kv heads, D];
    each sequence gets blocks as it grows (from a shuffled free list)."""

    def __init__(self, batch, engine, device="npu", dtype=torch.float16):
        global CAUSAL_2048
        if CAUSAL_2048 is None:
            CAUSAL_2048 = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
        self.engine = engine
        self.mask = CAUSAL_2048.to(device)
        shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
        self.caches = [(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
                       for _ in range(LAYERS)]
        generator = torch.Generator().manual_seed(1)
        self.free = torch.randperm(NUM_BLOCKS, generator=generator).tolist()
        self.tables = [[] for _ in range(batch)]
        self.lengths = [0] * batch
        self.device = device

    def reserve(self, new):
        """Room for `new` more tokens per sequence: their slots [B * new] (token-major per sequence)."""
        slots = []
        for b, table in enumerate(self.tables):
            for position in range(self.lengths[b], self.lengths[b] + new):
                if position // BLOCK_SIZE >= len(table):
                    table.append(self.free.pop())
                slots.append(table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE)
            self.lengths[b] += new
        return torch.tensor(slots, device=self.device)

    def block_table(self):
        width = max(len(t) for t in self.tables)
        return torch.tensor([t + [0] * (width - len(t)) for t in self.tables], dtype=torch.int32, device=self.device)

    def __call__(self, layer, q, k, v):
        b, s = q.shape[:2]
        if layer == 0:
            self.slots = self.reserve(s)    # once per step: every layer writes the same slots
        key_cache, value_cache = self.caches[layer]
        torch_npu.npu_scatter_pa_kv_cache(k.reshape(b * s, KV_HEADS, HEAD_DIM), v.reshape(b * s, KV_HEADS, HEAD_DIM),
                                          key_cache, value_cache, self.slots, cache_mode="Norm")
        scale = 1 / math.sqrt(HEAD_DIM)
        flat = dict(key=key_cache.view(NUM_BLOCKS, BLOCK_SIZE, -1), value=value_cache.view(NUM_BLOCKS, BLOCK_SIZE, -1))
        if self.engine == "vllm_ascend":  # prefill and decode alike: packed tokens over the paged cache
            out, _ = torch_npu.npu_fused_infer_attention_score(
                q.reshape(b * s, HEADS, HEAD_DIM), flat["key"], flat["value"], input_layout="TND",
                block_table=self.block_table(), block_size=BLOCK_SIZE,
                actual_seq_lengths=[s * (i + 1) for i in range(b)], actual_seq_lengths_kv=self.lengths,
                num_heads=HEADS, num_key_value_heads=KV_HEADS, scale=scale, atten_mask=self.mask, sparse_mode=3)
            return out.view(b, s, HEADS, HEAD_DIM)
        if s > 1:  # prefill: attention over the prompt itself, causal
            if self.engine == "pfa_ifa":
                return torch_npu.npu_prompt_flash_attention(
                    q, k, v, num_heads=HEADS, num_key_value_heads=KV_HEADS, input_layout="BSND", scale_value=scale,
                    atten_mask=self.mask, sparse_mode=3)
            return torch_npu.npu_fused_infer_attention_score(
                q, k, v, num_heads=HEADS, num_key_value_heads=KV_HEADS, input_layout="BSND", scale=scale,
                atten_mask=self.mask, sparse_mode=3)[0]
        # decode: one query per sequence over its blocks, [blocks, block_size, H] caches
        q = q.reshape(b, 1, HEADS * HEAD_DIM)
        if self.engine == "pfa_ifa":
            out = torch_npu.npu_incre_flash_attention(
                q, flat["key"], flat["value"], num_heads=HEADS, num_key_value_heads=KV_HEADS, input_layout="BSH",
                scale_value=scale, block_table=self.block_table(), block_size=BLOCK_SIZE,
                actual_seq_lengths=self.lengths)
        else:
            out = torch_npu.npu_fused_infer_attention_score(
                q, flat["key"], flat["value"], num_heads=HEADS, num_key_value_heads=KV_HEADS, input_layout="BSH",
                scale=scale, block_table=self.block_table(), block_size=BLOCK_SIZE,
                actual_seq_lengths_kv=self.lengths)[0]
        return out.view(b, 1, HEADS, HEAD_DIM)


def generate(model, prompt, attend, new_tokens):
    """Greedy decoding: the prompt at once, then one token per step."""
    tokens = prompt
    logits = model.forward(prompt, torch.arange(prompt.size(1), device=prompt.device), attend)
    generated = []
    for step in range(new_tokens):
        nxt = logits[:, -1].float().argmax(-1, keepdim=True)
        generated.append(nxt)
        tokens = torch.cat([tokens, nxt], 1)
        if step + 1 < new_tokens:
            position = torch.tensor([tokens.size(1) - 1], device=prompt.device)
            logits = model.forward(nxt, position, attend)
    return torch.cat(generated, 1)


def compare(engine="pfa_ifa", new_tokens=24, seed=0):
    """-> (tokens of the dense model, tokens of the paged one), each [2, new_tokens]."""
    model = TinyDecoder(seed)
    prompt = torch.tensor([[5, 17, 42, 8, 63, 2, 11], [90, 3, 3, 27, 71, 14, 56]], device="npu")
    dense = generate(model, prompt, DenseAttention(), new_tokens)
    served = generate(model, prompt, PagedAttention(prompt.size(0), engine), new_tokens)
    return dense.cpu(), served.cpu()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["pfa_ifa", "fused_infer", "vllm_ascend"], default="pfa_ifa")
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    dense, served = compare(args.engine, args.tokens)
    print("dense attention:", dense.tolist())
    print("paged KV cache :", served.tolist())
    print("same tokens" if torch.equal(dense, served) else "DIFFERENT tokens")


if __name__ == "__main__":
    main()
