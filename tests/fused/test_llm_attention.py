"""The attention operators of LLM serving (torch_npu/ops/attention.py) against a
reference composition: softmax(q k^T * scale + mask) v per head in float32, GQA by
repeat_interleave; layouts, masks, sparse modes, actual lengths, paged KV caches,
the cache scatter/gather, npu_fusion_attention_grad against autograd, torch.compile."""
import math
import os
import sys

import pytest
import torch

import torch_npu
from helpers import REPO_ROOT

ROOT = REPO_ROOT
sys.path.insert(0, os.path.join(ROOT, "examples"))

NO_BAND = 2147483647
HALF_DTYPES = [torch.float16, torch.bfloat16]
B, N, KVN, D = 2, 4, 2, 32


def tol(dtype):
    return {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=2e-3, atol=2e-3),
            torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}[dtype]


def rand(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


def reference(q, k, v, scale, keep=None, pse=None):
    """q [B, N, Sq, D], k/v [B, KVN, Skv, D] -> (out [B, N, Sq, Dv], lse [B, N, Sq]) in float32.
    keep: bool broadcastable to [B, N, Sq, Skv], True where a query sees a key; rows that see
    nothing give 0 and lse -inf."""
    q, k, v = q.float(), k.float(), v.float()
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    if pse is not None:
        s = s + pse.float()
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(torch.exp(s - lse.unsqueeze(-1)), nan=0.0)
    return p @ v, lse


def to_layout(x, layout):
    """[B, N, S, D] -> layout."""
    if layout == "BNSD":
        return x.contiguous()
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.transpose(1, 2).reshape(x.size(0), x.size(2), -1).contiguous()
    raise AssertionError(layout)


def from_layout(x, layout, heads):
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    return x.reshape(x.size(0), x.size(1), heads, -1).transpose(1, 2)  # BSH


def geometry(sq, skv, mode, pre=NO_BAND, nxt=NO_BAND, band=False):
    """The keep mask of a sparse mode for one sequence: [sq, skv]."""
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(skv).unsqueeze(0)
    keep = torch.ones(sq, skv, dtype=torch.bool)
    if mode == 2:
        keep = j <= i
    elif mode == 3:
        keep = j <= i + (skv - sq)
    elif mode == 4:
        shift = skv - sq
        keep = (j >= i + shift - pre) & (j <= i + shift + nxt)
    elif band:
        keep = (j >= i - pre) & (j <= i + nxt)
    return keep


COMPRESSED = torch.ones(2048, 2048, dtype=torch.bool).triu(1)  # Ascend's compressed causal pattern


def inputs(dtype, sq=8, skv=8, dv=D):
    torch.manual_seed(0)
    return rand(B, N, sq, D, dtype=dtype), rand(B, KVN, skv, D, dtype=dtype), rand(B, KVN, skv, dv, dtype=dtype)


# ---- npu_prompt_flash_attention --------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD", "BNSD_BSND"])
def test_prompt_flash_attention_layouts_mask_and_default_band(dtype, layout):
    q, k, v = inputs(dtype, sq=8, skv=8)
    mask = torch.rand(8, 8) < 0.3
    mask[:, 0] = False
    scale = 1 / math.sqrt(D)
    in_layout = layout.split("_")[0]
    out = torch_npu.npu_prompt_flash_attention(
        to_layout(q, in_layout).npu(), to_layout(k, in_layout).npu(), to_layout(v, in_layout).npu(),
        atten_mask=mask.npu(), num_heads=N, num_key_value_heads=KVN, scale_value=scale, input_layout=layout)
    assert out.device.type == "npu" and out.dtype == dtype
    # sparse_mode 0 with a mask: the band of pre_tokens / next_tokens (default 0: causal) applies too.
    keep = ~mask & geometry(8, 8, 0, band=True, nxt=0)
    expected, _ = reference(q, k, v, scale, keep)
    out_layout = layout.split("_")[-1]
    torch.testing.assert_close(from_layout(out.cpu().float(), out_layout, N), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("mode", [2, 3, 4])
def test_prompt_flash_attention_sparse_modes(dtype, mode):
    q, k, v = inputs(dtype, sq=6, skv=10)
    scale = 0.2
    out = torch_npu.npu_prompt_flash_attention(
        q.npu(), k.npu(), v.npu(), atten_mask=COMPRESSED.npu(), num_heads=N, num_key_value_heads=KVN,
        scale_value=scale, input_layout="BNSD", sparse_mode=mode, pre_tokens=3, next_tokens=1)
    expected, _ = reference(q, k, v, scale, geometry(6, 10, mode, pre=3, nxt=1))
    torch.testing.assert_close(out.cpu().float(), expected, **tol(dtype))


@pytest.mark.parametrize("mode,pre,nxt", [(3, NO_BAND, NO_BAND), (4, 100, 0), (0, 37, 5)])
def test_prompt_flash_attention_long_sequences_in_tiles(mode, pre, nxt):
    """600 queries: the kernel's tiles of rows, each over only the keys its rows can see."""
    torch.manual_seed(4)
    q, k, v = rand(1, N, 600, D), rand(1, KVN, 640, D), rand(1, KVN, 640, D)
    mask = COMPRESSED if mode else torch.rand(600, 640) < 0.2
    out = torch_npu.npu_prompt_flash_attention(
        q.npu(), k.npu(), v.npu(), atten_mask=mask.npu(), num_heads=N, num_key_value_heads=KVN, scale_value=0.15,
        input_layout="BNSD", sparse_mode=mode, pre_tokens=pre, next_tokens=nxt)
    keep = geometry(600, 640, mode, pre=pre, nxt=nxt, band=mode == 0)
    if mode == 0:
        keep = keep & ~mask
    expected, _ = reference(q, k, v, 0.15, keep)
    torch.testing.assert_close(out.cpu().float(), expected, **tol(torch.float16))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_prompt_flash_attention_actual_lengths_and_pse(dtype):
    q, k, v = inputs(dtype, sq=8, skv=10)
    pse = rand(1, N, 8, 10, dtype=dtype)
    scale = 0.25
    out = torch_npu.npu_prompt_flash_attention(
        q.npu(), k.npu(), v.npu(), pse_shift=pse.npu(), actual_seq_lengths=[5, 8], actual_seq_lengths_kv=[7, 10],
        num_heads=N, num_key_value_heads=KVN, scale_value=scale, input_layout="BNSD")
    for b, (sq, skv) in enumerate([(5, 7), (8, 10)]):
        expected, _ = reference(q[b:b + 1, :, :sq], k[b:b + 1, :, :skv], v[b:b + 1, :, :skv], scale,
                                pse=pse[:, :, :sq, :skv])
        torch.testing.assert_close(out[b:b + 1, :, :sq].cpu().float(), expected, **tol(dtype))
        assert (out[b, :, sq:].cpu() == 0).all()  # rows past the actual length


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_prompt_flash_attention_tnd_varlen_causal(dtype):
    torch.manual_seed(1)
    q, k, v = rand(11, N, D, dtype=dtype), rand(14, KVN, D, dtype=dtype), rand(14, KVN, D, dtype=dtype)
    q_ends, kv_ends = [3, 11], [4, 14]
    out = torch_npu.npu_prompt_flash_attention(
        q.npu(), k.npu(), v.npu(), atten_mask=COMPRESSED.npu(), actual_seq_lengths=q_ends,
        actual_seq_lengths_kv=kv_ends, num_heads=N, num_key_value_heads=KVN, scale_value=0.3, input_layout="TND",
        sparse_mode=3)
    assert out.shape == (11, N, D)
    for (q0, q1), (k0, k1) in zip([(0, 3), (3, 11)], [(0, 4), (4, 14)]):
        bnsd = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731
        expected, _ = reference(bnsd(q[q0:q1]), bnsd(k[k0:k1]), bnsd(v[k0:k1]), 0.3,
                                geometry(q1 - q0, k1 - k0, 3))
        torch.testing.assert_close(out[q0:q1].cpu().float(), expected[0].transpose(0, 1), **tol(dtype))


# ---- npu_incre_flash_attention -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD"])
def test_incre_flash_attention_decode_with_mask_and_kv_lengths(dtype, layout):
    q, k, v = inputs(dtype, sq=1, skv=12)
    mask = torch.rand(B, 12) < 0.3
    mask[:, 0] = False
    out = torch_npu.npu_incre_flash_attention(
        to_layout(q, layout).npu(), to_layout(k, layout).npu(), to_layout(v, layout).npu(), atten_mask=mask.npu(),
        actual_seq_lengths=[9, 12], num_heads=N, num_key_value_heads=KVN, scale_value=0.17, input_layout=layout)
    got = from_layout(out.cpu().float(), layout, N)
    for b, skv in enumerate([9, 12]):
        expected, _ = reference(q[b:b + 1], k[b:b + 1, :, :skv], v[b:b + 1, :, :skv], 0.17,
                                ~mask[b, :skv].view(1, 1, 1, skv))
        torch.testing.assert_close(got[b:b + 1], expected, **tol(dtype))


def paged(k, v, lengths, block_size, head_major=False, seed=0):
    """Dense k/v [B, KVN, S, D] -> caches (with shuffled blocks) and the block table."""
    g = torch.Generator().manual_seed(seed)
    need = [math.ceil(n / block_size) for n in lengths]
    blocks = sum(need) + 3
    order = torch.randperm(blocks, generator=g)
    table = torch.full((len(lengths), max(need) + 1), -1, dtype=torch.int32)  # unused entries: -1
    kvn, d, dv = k.size(1), k.size(-1), v.size(-1)
    kc = torch.zeros(blocks, block_size, kvn, d, dtype=k.dtype)
    vc = torch.zeros(blocks, block_size, kvn, dv, dtype=v.dtype)
    used = 0
    for b, n in enumerate(lengths):
        for c in range(need[b]):
            blk = int(order[used])
            used += 1
            table[b, c] = blk
            rows = slice(c * block_size, min(n, (c + 1) * block_size))
            count = rows.stop - rows.start
            kc[blk, :count] = k[b, :, rows].transpose(0, 1)
            vc[blk, :count] = v[b, :, rows].transpose(0, 1)
    if head_major:
        return kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous(), table
    return kc.reshape(blocks, block_size, -1), vc.reshape(blocks, block_size, -1), table


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("cache", ["BnBsH", "BnNBsD"])
def test_incre_flash_attention_paged_kv_cache(dtype, cache):
    lengths = [20, 37]
    q, k, v = inputs(dtype, sq=1, skv=37)
    kc, vc, table = paged(k, v, lengths, 16, head_major=cache == "BnNBsD")
    layout = "BNSD" if cache == "BnNBsD" else "BSH"
    out = torch_npu.npu_incre_flash_attention(
        to_layout(q, layout).npu(), kc.npu(), vc.npu(), block_table=table.npu(), block_size=16,
        actual_seq_lengths=lengths, num_heads=N, num_key_value_heads=KVN, scale_value=0.2, input_layout=layout)
    got = from_layout(out.cpu().float(), layout, N)
    for b, n in enumerate(lengths):
        expected, _ = reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], 0.2)
        torch.testing.assert_close(got[b:b + 1], expected, **tol(dtype))


def int8_cache(k, v, seed=1):
    """int8 k/v [B, KVN, S, D] with per-channel (head, dim) scales and offsets [2, KVN, D], and the
    float k/v they stand for: (x + offset) * scale, computed as the chip does, in the query's dtype."""
    g = torch.Generator().manual_seed(seed)
    kq = torch.randint(-128, 128, k.shape, dtype=torch.int8, generator=g)
    vq = torch.randint(-128, 128, v.shape, dtype=torch.int8, generator=g)
    scale = (torch.rand(2, k.size(1), k.size(-1), generator=g) * 0.02 + 0.005).to(k.dtype)
    offset = torch.randint(-4, 5, (2, k.size(1), k.size(-1)), generator=g).to(k.dtype)

    def dequantized(x, which):
        return (x.to(k.dtype) + offset[which].unsqueeze(1)) * scale[which].unsqueeze(1)
    return kq, vq, scale, offset, dequantized(kq, 0), dequantized(vq, 1)


def antiquant_shape(t, layout):
    """[2, KVN, D] -> the shape Ascend documents for the layout."""
    return {"BSH": t.reshape(2, -1), "BSND": t, "BNSD": t.unsqueeze(2)}[layout].contiguous()


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD"])
def test_incre_flash_attention_int8_kv_cache_with_antiquant(dtype, layout):
    q, k, v = inputs(dtype, sq=1, skv=12)
    kq, vq, scale, offset, kd, vd = int8_cache(k, v)
    out = torch_npu.npu_incre_flash_attention(
        to_layout(q, layout).npu(), to_layout(kq, layout).npu(), to_layout(vq, layout).npu(),
        antiquant_scale=antiquant_shape(scale, layout).npu(), antiquant_offset=antiquant_shape(offset, layout).npu(),
        num_heads=N, num_key_value_heads=KVN, scale_value=0.17, input_layout=layout)
    expected, _ = reference(q, kd, vd, 0.17)
    torch.testing.assert_close(from_layout(out.cpu().float(), layout, N), expected, **tol(dtype))
    # the offset matters: without it the result is another one
    no_offset = torch_npu.npu_incre_flash_attention(
        to_layout(q, layout).npu(), to_layout(kq, layout).npu(), to_layout(vq, layout).npu(),
        antiquant_scale=antiquant_shape(scale, layout).npu(), num_heads=N, num_key_value_heads=KVN,
        scale_value=0.17, input_layout=layout)
    assert not torch.allclose(no_offset.cpu().float(), out.cpu().float(), **tol(dtype))


@pytest.mark.parametrize("cache", ["BnBsH", "BnNBsD"])
def test_paged_int8_kv_cache_with_antiquant(cache):
    dtype, lengths = torch.float16, [20, 37]
    q, k, v = inputs(dtype, sq=1, skv=37)
    kq, vq, scale, offset, kd, vd = int8_cache(k, v)
    kc, vc, table = paged(kq, vq, lengths, 32, head_major=cache == "BnNBsD")
    layout = "BNSD" if cache == "BnNBsD" else "BSH"
    common = dict(block_table=table.npu(), block_size=32, num_heads=N, num_key_value_heads=KVN,
                  antiquant_scale=antiquant_shape(scale, layout).npu(),
                  antiquant_offset=antiquant_shape(offset, layout).npu())
    ifa = torch_npu.npu_incre_flash_attention(to_layout(q, layout).npu(), kc.npu(), vc.npu(), scale_value=0.2,
                                              actual_seq_lengths=lengths, input_layout=layout, **common)
    fia, _ = torch_npu.npu_fused_infer_attention_score(to_layout(q, layout).npu(), kc.npu(), vc.npu(), scale=0.2,
                                                       actual_seq_lengths_kv=lengths, input_layout=layout, **common)
    for out in (ifa, fia):
        got = from_layout(out.cpu().float(), layout, N)
        for b, n in enumerate(lengths):
            expected, _ = reference(q[b:b + 1], kd[b:b + 1, :, :n], vd[b:b + 1, :, :n], 0.2)
            torch.testing.assert_close(got[b:b + 1], expected, **tol(dtype))
    # the workspace query reads the geometry only, int8 cache included
    workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(
        to_layout(q, layout).npu(), kc.npu(), vc.npu(), scale=0.2, actual_seq_lengths_kv=lengths,
        input_layout=layout, **common)
    assert workspace.numel() == 0 and workspace.device.type == "npu"


@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD", "TND"])
def test_fused_infer_int8_dense_cache_with_antiquant(layout):
    dtype = torch.bfloat16
    q, k, v = inputs(dtype, sq=4, skv=10)
    kq, vq, scale, offset, kd, vd = int8_cache(k, v)
    mask = torch.ones(4, 10, dtype=torch.bool).triu(7)   # causal, bottom-right aligned
    expected, _ = reference(q, kd, vd, 0.3, ~mask)
    if layout == "TND":   # the batches one after the other: [B * S, N, D]
        tnd = lambda t: t.transpose(1, 2).reshape(-1, t.size(1), t.size(3)).contiguous()  # noqa: E731
        out, _ = torch_npu.npu_fused_infer_attention_score(
            tnd(q).npu(), tnd(kq).npu(), tnd(vq).npu(), antiquant_scale=scale.npu(), antiquant_offset=offset.npu(),
            actual_seq_lengths=[4, 8], actual_seq_lengths_kv=[10, 20], num_heads=N, num_key_value_heads=KVN,
            scale=0.3, input_layout="TND", sparse_mode=3, atten_mask=torch.ones(2048, 2048, dtype=torch.bool)
            .triu(1).npu())
        got = out.cpu().float().reshape(B, 4, N, D).transpose(1, 2)
    else:
        out, _ = torch_npu.npu_fused_infer_attention_score(
            to_layout(q, layout).npu(), to_layout(kq, layout).npu(), to_layout(vq, layout).npu(),
            antiquant_scale=antiquant_shape(scale, layout).npu(), antiquant_offset=antiquant_shape(offset, layout).npu(),
            atten_mask=mask.npu(), num_heads=N, num_key_value_heads=KVN, scale=0.3, input_layout=layout)
        got = from_layout(out.cpu().float(), layout, N)
    torch.testing.assert_close(got, expected, **tol(dtype))

def test_antiquant_errors_name_op_and_remedy():
    q, k, v = (t.npu() for t in inputs(torch.float16, sq=1, skv=8))
    kq, vq = k.to(torch.int8), v.to(torch.int8)
    scale = torch.ones(2, KVN, 1, D, dtype=torch.float16).npu()
    ifa, fia = torch_npu.npu_incre_flash_attention, torch_npu.npu_fused_infer_attention_score
    with pytest.raises(RuntimeError, match="antiquant_scale and antiquant_offset are for an int8 key and value"):
        ifa(q, k, v, antiquant_scale=scale, num_heads=N, num_key_value_heads=KVN, input_layout="BNSD")
    with pytest.raises(RuntimeError, match=r"one value per key/value channel, \[2, 2, 1, 32\] \(or \[2, 64\]\) "
                                           r"of query's dtype"):
        ifa(q, kq, vq, antiquant_scale=scale.float(), num_heads=N, num_key_value_heads=KVN, input_layout="BNSD")
    with pytest.raises(RuntimeError, match="per-tensor and per-token antiquant are not supported"):
        ifa(q, kq, vq, antiquant_scale=scale.reshape(-1)[:2].clone(), num_heads=N, num_key_value_heads=KVN,
            input_layout="BNSD")
    with pytest.raises(RuntimeError, match="antiquant_mode 1 is not supported.*use 0"):
        fia(q, kq, vq, antiquant_scale=scale, antiquant_mode=1, num_heads=N, num_key_value_heads=KVN,
            input_layout="BNSD")
    with pytest.raises(RuntimeError, match="key_antiquant_scale is not supported"):
        fia(q, kq, vq, key_antiquant_scale=scale, num_heads=N, num_key_value_heads=KVN, input_layout="BNSD")


# ---- npu_fused_infer_attention_score (and _v2) ----------------------------------------------------

@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("v2", [False, True])
def test_fused_infer_prefill_returns_out_and_lse(dtype, v2):
    q, k, v = inputs(dtype, sq=8, skv=8, dv=16)
    mask = torch.ones(8, 8, dtype=torch.bool).triu(1)
    if v2:
        out, lse = torch_npu.npu_fused_infer_attention_score_v2(
            q.npu(), k.npu(), v.npu(), atten_mask=mask.npu(), num_query_heads=N, num_key_value_heads=KVN,
            softmax_scale=0.25, input_layout="BNSD", return_softmax_lse=True)
    else:
        out, lse = torch_npu.npu_fused_infer_attention_score(
            q.npu(), k.npu(), v.npu(), atten_mask=mask.npu(), num_heads=N, num_key_value_heads=KVN, scale=0.25,
            input_layout="BNSD", softmax_lse_flag=True)
    expected, expected_lse = reference(q, k, v, 0.25, ~mask)
    assert out.shape == (B, N, 8, 16) and lse.shape == (B, N, 8, 1) and lse.dtype == torch.float32
    torch.testing.assert_close(out.cpu().float(), expected, **tol(dtype))
    torch.testing.assert_close(lse.cpu().squeeze(-1), expected_lse, rtol=1e-4, atol=1e-4)
    _, no_lse = torch_npu.npu_fused_infer_attention_score(q.npu(), k.npu(), v.npu(), num_heads=N,
                                                          num_key_value_heads=KVN, input_layout="BNSD")
    assert no_lse.shape == (1,) and no_lse.item() == 0


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_fused_infer_decode_paged_and_chunked_prefill(dtype):
    lengths = [130, 200]
    q, k, v = inputs(dtype, sq=4, skv=200)
    # decode, block size 16, BSH: the sparse mode does not apply to one query
    kc, vc, table = paged(k, v, lengths, 16)
    out, _ = torch_npu.npu_fused_infer_attention_score(
        to_layout(q[:, :, -1:], "BSH").npu(), kc.npu(), vc.npu(), block_table=table.npu(), block_size=16,
        actual_seq_lengths_kv=lengths, num_heads=N, num_key_value_heads=KVN, scale=0.2, input_layout="BSH",
        atten_mask=COMPRESSED.npu(), sparse_mode=3)
    got = from_layout(out.cpu().float(), "BSH", N)
    for b, n in enumerate(lengths):
        expected, _ = reference(q[b:b + 1, :, -1:], k[b:b + 1, :, :n], v[b:b + 1, :, :n], 0.2)
        torch.testing.assert_close(got[b:b + 1], expected, **tol(dtype))
    # chunked prefill over a paged cache (block size 128): the last 4 tokens of each sequence, causal
    kc, vc, table = paged(k, v, lengths, 128)
    out, lse = torch_npu.npu_fused_infer_attention_score_v2(
        to_layout(q, "BSH").npu(), kc.npu(), vc.npu(), block_table=table.npu(), block_size=128,
        actual_seq_kvlen=lengths, num_query_heads=N, num_key_value_heads=KVN, softmax_scale=0.2,
        input_layout="BSH", atten_mask=COMPRESSED.npu(), sparse_mode=3, return_softmax_lse=True)
    got = from_layout(out.cpu().float(), "BSH", N)
    for b, n in enumerate(lengths):
        expected, expected_lse = reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], 0.2, geometry(4, n, 3))
        torch.testing.assert_close(got[b:b + 1], expected, **tol(dtype))
        torch.testing.assert_close(lse[b:b + 1].cpu().squeeze(-1), expected_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_fused_infer_vllm_ascend_call_tnd_over_a_paged_cache_with_out_and_workspace(dtype):
    """vllm-ascend's call: queries packed (TND, cumulative ends), keys in a paged cache
    [blocks, block_size, H] with each request's own length, sparse_mode 3, the .out form."""
    torch.manual_seed(2)
    kv_lens, q_lens = [33, 7, 20], [1, 3, 4]           # a decode, two chunked prefills
    q_ends = [1, 4, 8]
    k, v = rand(3, KVN, 33, D, dtype=dtype), rand(3, KVN, 33, D, dtype=dtype)
    kc, vc, table = paged(k, v, kv_lens, 16)
    q = rand(8, N, D, dtype=dtype)
    kwargs = dict(query=q.npu(), key=kc.npu(), value=vc.npu(), atten_mask=COMPRESSED.npu(), block_table=table.npu(),
                  input_layout="TND", block_size=16, actual_seq_lengths=q_ends, actual_seq_lengths_kv=kv_lens,
                  num_key_value_heads=KVN, num_heads=N, scale=0.2, sparse_mode=3)
    out, _ = torch_npu.npu_fused_infer_attention_score(**kwargs)
    workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(**kwargs)
    given_out = torch.empty(8, N, D, dtype=dtype, device="npu")
    given_lse = torch.empty(1, dtype=dtype, device="npu")
    torch_npu.npu_fused_infer_attention_score.out(workspace=workspace, out=[given_out, given_lse], **kwargs)
    torch.testing.assert_close(given_out.cpu(), out.cpu())
    start = 0
    for b, (sq, skv) in enumerate(zip(q_lens, kv_lens)):
        query = q[start:start + sq].transpose(0, 1).unsqueeze(0)
        expected, _ = reference(query, k[b:b + 1, :, :skv], v[b:b + 1, :, :skv], 0.2, geometry(sq, skv, 3))
        torch.testing.assert_close(out[start:start + sq].cpu().float(), expected[0].transpose(0, 1), **tol(dtype))
        start += sq


def test_fused_infer_v2_learnable_sink():
    torch.manual_seed(3)
    q, k, v = rand(7, N, D, dtype=torch.bfloat16), rand(7, KVN, D, dtype=torch.bfloat16), rand(7, KVN, D,
                                                                                                 dtype=torch.bfloat16)
    sink = rand(N, dtype=torch.bfloat16)
    out, lse = torch_npu.npu_fused_infer_attention_score_v2(
        q.npu(), k.npu(), v.npu(), learnable_sink=sink.npu(), actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7],
        num_query_heads=N, num_key_value_heads=KVN, softmax_scale=0.3, input_layout="TND",
        atten_mask=COMPRESSED.npu(), sparse_mode=3, return_softmax_lse=True)
    for q0, q1 in ((0, 3), (3, 7)):
        bnsd = lambda t: t[q0:q1].transpose(0, 1).unsqueeze(0).float()  # noqa: E731
        kr, vr = bnsd(k).repeat_interleave(2, 1), bnsd(v).repeat_interleave(2, 1)
        scores = (bnsd(q) @ kr.transpose(-1, -2) * 0.3).masked_fill(~geometry(q1 - q0, q1 - q0, 3), float("-inf"))
        scores = torch.cat([scores, sink.float().view(1, N, 1, 1).expand(1, N, q1 - q0, 1)], -1)  # the sink column
        probs = scores.softmax(-1)[..., :-1]
        torch.testing.assert_close(out[q0:q1].cpu().float(), (probs @ vr)[0].transpose(0, 1), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(lse[q0:q1, :, 0].cpu(), scores.logsumexp(-1)[0].transpose(0, 1), rtol=1e-4,
                                   atol=1e-4)
    with pytest.raises(RuntimeError, match="learnable_sink must be bfloat16 .* layout TND"):
        torch_npu.npu_fused_infer_attention_score_v2(q.npu(), k.npu(), v.npu(), learnable_sink=sink.half().npu(),
                                                     actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7],
                                                     num_query_heads=N, num_key_value_heads=KVN, input_layout="TND")


def test_fused_infer_tnd_lse_shape_and_cpu_tensors():
    q, k, v = rand(9, N, D), rand(9, KVN, D), rand(9, KVN, D)
    out, lse = torch_npu.npu_fused_infer_attention_score(
        q.npu(), k.npu(), v.npu(), actual_seq_lengths=[4, 9], actual_seq_lengths_kv=[4, 9], num_heads=N,
        num_key_value_heads=KVN, input_layout="TND", softmax_lse_flag=True, scale=0.3)
    assert out.shape == (9, N, D) and lse.shape == (9, N, 1)
    cpu_out, cpu_lse = torch.ops.npu.npu_fused_infer_attention_score(
        q, k, v, actual_seq_lengths=[4, 9], actual_seq_lengths_kv=[4, 9], num_heads=N, num_key_value_heads=KVN,
        input_layout="TND", softmax_lse_flag=True, scale=0.3)
    torch.testing.assert_close(out.cpu(), cpu_out)
    torch.testing.assert_close(lse.cpu(), cpu_lse)
    bnsd = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731
    expected, expected_lse = reference(bnsd(q[4:]), bnsd(k[4:]), bnsd(v[4:]), 0.3)
    torch.testing.assert_close(out[4:].cpu().float(), expected[0].transpose(0, 1), **tol(torch.float16))
    torch.testing.assert_close(lse[4:, :, 0].cpu(), expected_lse[0].transpose(0, 1), rtol=1e-4, atol=1e-4)


def test_attention_errors_name_op_and_remedy():
    q, k, v = (t.npu() for t in inputs(torch.float16))
    fia = torch_npu.npu_fused_infer_attention_score
    with pytest.raises(RuntimeError, match="npu_prompt_flash_attention: query must be float16 or bfloat16.*npu"):
        torch_npu.npu_prompt_flash_attention(q.float(), k.float(), v.float(), num_heads=N, input_layout="BNSD")
    with pytest.raises(RuntimeError, match="int8 key and value .* need antiquant_scale"):
        torch_npu.npu_incre_flash_attention(q[:, :, :1], k.to(torch.int8), v.to(torch.int8), num_heads=N,
                                            input_layout="BNSD")
    with pytest.raises(RuntimeError, match="input_layout 'SBH' is not supported.*use one of BSH"):
        fia(q, k, v, num_heads=N, input_layout="SBH")
    with pytest.raises(RuntimeError, match="num_heads \\(1\\) must equal query's head dimension \\(4\\).*num_heads=4"):
        fia(q, k, v, input_layout="BNSD")
    with pytest.raises(RuntimeError, match="num_key_value_heads .* pass num_key_value_heads=2"):
        fia(q, k, v, num_heads=N, input_layout="BNSD")
    with pytest.raises(RuntimeError, match="quant_scale2 is not supported on the npu device"):
        fia(q, k, v, num_heads=N, num_key_value_heads=KVN, input_layout="BNSD",
            quant_scale2=torch.ones(1, device="npu"))
    with pytest.raises(RuntimeError, match="sparse_mode 3 needs atten_mask as the compressed"):
        fia(q, k, v, num_heads=N, num_key_value_heads=KVN, input_layout="BNSD", sparse_mode=3)
    with pytest.raises(RuntimeError, match="sparse_mode 5 is not supported"):
        fia(q, k, v, num_heads=N, num_key_value_heads=KVN, input_layout="BNSD", sparse_mode=5)
    with pytest.raises(RuntimeError, match="query's S must be 1"):
        torch_npu.npu_incre_flash_attention(q, k, v, num_heads=N, num_key_value_heads=KVN, input_layout="BNSD")
    kc, vc, table = paged(k.cpu(), v.cpu(), [8, 8], 16)
    table[1, 0] = 99
    with pytest.raises(RuntimeError, match="block_table\\[1\\]\\[0\\] = 99 is not a block of the cache"):
        fia(to_layout(q.cpu()[:, :, :1], "BSH").npu(), kc.npu(), vc.npu(), block_table=table.npu(), block_size=16,
            actual_seq_lengths_kv=[8, 8], num_heads=N, num_key_value_heads=KVN)
    with pytest.raises(RuntimeError, match="paged KV cache needs the actual key/value length"):
        fia(to_layout(q.cpu()[:, :, :1], "BSH").npu(), kc.npu(), vc.npu(), block_table=table.npu(), block_size=16,
            num_heads=N, num_key_value_heads=KVN)
    with pytest.raises(RuntimeError, match="block_size a multiple of 128"):
        fia(to_layout(q.cpu(), "BSH").npu(), kc.npu(), vc.npu(), block_table=table.npu(), block_size=16,
            actual_seq_lengths_kv=[8, 8], num_heads=N, num_key_value_heads=KVN)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        fia(q, k.cpu(), v, num_heads=N, num_key_value_heads=KVN, input_layout="BNSD")


# ---- the paged KV cache: scatter and gather -------------------------------------------------------

def scatter_reference(key, cache, slots, mode, block_size):
    cache = cache.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        blk, off = divmod(slot, block_size)
        if mode == "Norm":
            cache[blk, off] = key[t]
        else:
            row = key[t].reshape(-1)
            last = cache.size(-1)
            for piece in range(row.numel() // last):
                cache[blk, piece, off] = row[piece * last:(piece + 1) * last]
    return cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("mode", ["Norm", "PA_NZ"])
def test_scatter_pa_kv_cache(dtype, mode):
    torch.manual_seed(0)
    tokens, heads, dk, dv, blocks, bs = 6, 2, 32, 16, 4, 16
    key = torch.randn(tokens, heads, dk).mul(20).to(dtype)
    value = torch.randn(tokens, heads, dv).mul(20).to(dtype)
    if mode == "Norm":
        kc, vc = torch.zeros(blocks, bs, heads, dk, dtype=dtype), torch.zeros(blocks, bs, heads, dv, dtype=dtype)
    else:
        kc = torch.zeros(blocks, heads * dk // 16, bs, 16, dtype=dtype)
        vc = torch.zeros(blocks, heads * dv // 16, bs, 16, dtype=dtype)
    slots = torch.tensor([5, 17, -1, 63, 0, 40], dtype=torch.int32)
    kn, vn = kc.npu(), vc.npu()
    result = torch_npu.npu_scatter_pa_kv_cache(key.npu(), value.npu(), kn, vn, slots.npu(), cache_mode=mode)
    assert result is None
    torch.testing.assert_close(kn.cpu(), scatter_reference(key, kc, slots, mode, bs), rtol=0, atol=0)
    torch.testing.assert_close(vn.cpu(), scatter_reference(value, vc, slots, mode, bs), rtol=0, atol=0)
    new_k, new_v = torch.ops.npu.npu_scatter_pa_kv_cache_functional(key.npu(), value.npu(), kc.npu(), vc.npu(),
                                                                    slots.npu(), cache_mode=mode)
    torch.testing.assert_close(new_k.cpu(), kn.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(new_v.cpu(), vn.cpu(), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="slot_mapping\\[1\\] = 64 is past the cache"):
        torch_npu.npu_scatter_pa_kv_cache(key.npu(), value.npu(), kn, vn, torch.tensor([1, 64, 2, 3, 4, 5]).npu(),
                                          cache_mode=mode)


def test_scatter_pa_kv_cache_errors():
    key = torch.randn(2, 2, 16).npu()
    cache = torch.zeros(2, 16, 2, 16).npu()
    with pytest.raises(RuntimeError, match="key_cache must have key's dtype"):
        torch_npu.npu_scatter_pa_kv_cache(key, key, cache.half(), cache, torch.tensor([0, 1]).npu(), cache_mode="Norm")
    with pytest.raises(RuntimeError, match="compress_lens is not supported on the npu device"):
        torch_npu.npu_scatter_pa_kv_cache(key, key, cache, cache, torch.tensor([0, 1]).npu(), cache_mode="Norm",
                                          compress_lens=torch.tensor([0, 1]).npu())
    with pytest.raises(RuntimeError, match="cache_mode must be 'PA_NZ' or 'Norm'"):
        torch_npu.npu_scatter_pa_kv_cache(key, key, cache, cache, torch.tensor([0, 1]).npu(), cache_mode="NZ")
    with pytest.raises(RuntimeError, match="slot_mapping must be int32 or int64"):
        torch_npu.npu_scatter_pa_kv_cache(key, key, cache, cache, torch.tensor([0., 1.]).npu(), cache_mode="Norm")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cumsum", [False, True])
def test_gather_pa_kv_cache(dtype, cumsum):
    torch.manual_seed(0)
    blocks, bs, heads, d = 6, 16, 2, 32
    kc, vc = torch.randn(blocks, bs, heads, d).to(dtype), torch.randn(blocks, bs, heads, d).to(dtype)
    table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    lens, offsets = [20, 7], [0, 16]  # sequence 1 starts at its second block
    expected_k = torch.cat([torch.cat([kc[4], kc[1]])[:20], kc[5][:7]])
    expected_v = torch.cat([torch.cat([vc[4], vc[1]])[:20], vc[5][:7]])
    seq_lens = torch.tensor([0, 20, 27] if cumsum else lens, dtype=torch.int32)
    key, value = torch.zeros(27, heads, d, dtype=dtype).npu(), torch.zeros(27, heads, d, dtype=dtype).npu()
    torch_npu.npu_gather_pa_kv_cache(kc.npu(), vc.npu(), table.npu(), seq_lens.npu(), key, value,
                                     seq_offset=torch.tensor(offsets).npu(), is_seq_lens_cumsum=cumsum)
    torch.testing.assert_close(key.cpu(), expected_k, rtol=0, atol=0)
    torch.testing.assert_close(value.cpu(), expected_v, rtol=0, atol=0)
    fk, fv = torch.ops.npu.npu_gather_pa_kv_cache_functional(
        kc.npu(), vc.npu(), table.npu(), seq_lens.npu(), torch.zeros_like(key), torch.zeros_like(value),
        seq_offset=torch.tensor(offsets).npu(), is_seq_lens_cumsum=cumsum)
    torch.testing.assert_close(fk.cpu(), expected_k, rtol=0, atol=0)
    torch.testing.assert_close(fv.cpu(), expected_v, rtol=0, atol=0)


def test_scatter_then_gather_round_trip_and_nz_gather_refused():
    torch.manual_seed(0)
    key, value = torch.randn(10, 2, 16).half().npu(), torch.randn(10, 2, 16).half().npu()
    kc, vc = torch.zeros(4, 16, 2, 16).half().npu(), torch.zeros(4, 16, 2, 16).half().npu()
    slots = torch.tensor([3 * 16 + i for i in range(6)] + [16 + i for i in range(4)]).npu()
    torch_npu.npu_scatter_pa_kv_cache(key, value, kc, vc, slots, cache_mode="Norm")
    out_k, out_v = torch.zeros_like(key), torch.zeros_like(value)
    torch_npu.npu_gather_pa_kv_cache(kc, vc, torch.tensor([[3], [1]], dtype=torch.int32).npu(),
                                     torch.tensor([6, 4]).npu(), out_k, out_v)
    torch.testing.assert_close(out_k.cpu(), key.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(out_v.cpu(), value.cpu(), rtol=0, atol=0)
    nz = torch_npu.npu_format_cast(kc, 29)
    with pytest.raises(ValueError, match="FRACTAL_NZ.*not supported"):
        torch_npu.npu_gather_pa_kv_cache(nz, vc, torch.tensor([[3], [1]], dtype=torch.int32).npu(),
                                         torch.tensor([6, 4]).npu(), out_k, out_v)


# ---- npu_fusion_attention_grad ----------------------------------------------------------------------

GRAD_CASES = [  # layout, sparse_mode, with an atten_mask, with pse
    ("BNSD", 0, True, False), ("BSND", 2, False, False), ("BSH", 3, False, True), ("SBH", 0, False, False),
    ("TND", 3, False, False),
]


def fa_layout(x, layout):
    """[B, N, S, D] -> npu_fusion_attention's layouts (TND: the batches packed)."""
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(x.size(2), x.size(0), -1)
    if layout == "TND":
        return x.transpose(1, 2).reshape(-1, x.size(1), x.size(3))
    return to_layout(x, layout)


def fa_unlayout(x, layout, b, heads):
    if layout == "SBH":
        return x.reshape(x.size(0), b, heads, -1).permute(1, 2, 0, 3)
    if layout == "TND":
        return x.reshape(b, -1, heads, x.size(-1)).transpose(1, 2)
    return from_layout(x, layout, heads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout,mode,with_mask,with_pse", GRAD_CASES)
def test_fusion_attention_grad_matches_autograd_of_the_composition(dtype, layout, mode, with_mask, with_pse):
    torch.manual_seed(0)
    s = 6
    q, k, v = rand(B, N, s, D, dtype=dtype), rand(B, KVN, s, D, dtype=dtype), rand(B, KVN, s, D, dtype=dtype)
    dy = rand(B, N, s, D, dtype=dtype)
    mask = (torch.rand(s, s) < 0.3) & ~torch.eye(s, dtype=torch.bool) if with_mask else None
    pse = rand(1, N, s, s, dtype=dtype) if with_pse else None
    scale = 0.3
    keep = geometry(s, s, mode)
    if mask is not None:
        keep = keep & ~mask
    ref_in = [t.float().requires_grad_() for t in (q, k, v)]
    ref_pse = pse.float().requires_grad_() if with_pse else None
    # npu_fusion_attention's scores are scale * (q k^T + pse), as Ascend documents.
    expected, _ = reference(*ref_in, scale, keep, pse=ref_pse * scale if with_pse else None)
    expected.backward(dy.float())

    lay = lambda t: fa_layout(t, layout).npu()  # noqa: E731
    extra = dict(actual_seq_qlen=[s, 2 * s], actual_seq_kvlen=[s, 2 * s]) if layout == "TND" else {}
    npu_mask = mask.npu() if mask is not None else None
    npu_pse = pse.npu() if pse is not None else None
    fwd = torch_npu.npu_fusion_attention(lay(q), lay(k), lay(v), N, layout, atten_mask=npu_mask, pse=npu_pse,
                                         scale=scale, sparse_mode=mode, **extra)
    for stats in (True, False):
        given = dict(softmax_max=fwd[1], softmax_sum=fwd[2], attention_in=fwd[0]) if stats else {}
        dq, dk, dv, dpse, dsink = torch_npu.npu_fusion_attention_grad(
            lay(q), lay(k), lay(v), lay(dy), N, layout, atten_mask=npu_mask, pse=npu_pse, scale_value=scale,
            sparse_mode=mode, **given, **extra)
        assert dq.device.type == "npu" and dq.dtype == dtype and dsink.shape == (0,)
        for got, ref, heads in ((dq, ref_in[0], N), (dk, ref_in[1], KVN), (dv, ref_in[2], KVN)):
            got = fa_unlayout(got.cpu().float(), layout, B, heads)
            torch.testing.assert_close(got, ref.grad, **(tol(dtype) if dtype == torch.float32 else
                                                         dict(rtol=3e-2, atol=3e-2)))
        if with_pse:
            torch.testing.assert_close(dpse.cpu().float(), ref_pse.grad, rtol=3e-2, atol=3e-2)
        else:
            assert dpse is None


def test_fusion_attention_grad_long_causal_in_tiles():
    torch.manual_seed(5)
    s = 520
    q, k, v, dy = rand(1, N, s, D, dtype=torch.float32), rand(1, KVN, s, D, dtype=torch.float32), \
        rand(1, KVN, s, D, dtype=torch.float32), rand(1, N, s, D, dtype=torch.float32)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    expected, _ = reference(*ref_in, 0.2, geometry(s, s, 2))
    expected.backward(dy)
    fwd = torch_npu.npu_fusion_attention(q.npu(), k.npu(), v.npu(), N, "BNSD", scale=0.2, sparse_mode=2)
    grads = torch_npu.npu_fusion_attention_grad(q.npu(), k.npu(), v.npu(), dy.npu(), N, "BNSD", scale_value=0.2,
                                                sparse_mode=2, softmax_max=fwd[1], softmax_sum=fwd[2],
                                                attention_in=fwd[0])
    for got, ref in zip(grads[:3], ref_in):
        torch.testing.assert_close(got.cpu(), ref.grad, rtol=1e-4, atol=1e-4)
    again = torch_npu.npu_fusion_attention_grad(q.npu(), k.npu(), v.npu(), dy.npu(), N, "BNSD", scale_value=0.2,
                                                sparse_mode=2, softmax_max=fwd[1], softmax_sum=fwd[2],
                                                attention_in=fwd[0])
    for first, second in zip(grads[:3], again[:3]):  # the tiles' parts are added in a fixed order
        assert torch.equal(first.cpu(), second.cpu())


def band_reference(q, k, v, scale, keep):
    """float32 attention whose empty rows (no kept key) are 0, differentiable everywhere:
    the rows with a key take the softmax, the others contribute nothing."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
    seen = keep.any(-1, keepdim=True)
    p = torch.where(seen, s, torch.zeros_like(s)).softmax(-1) * keep * seen
    return p @ v, torch.logsumexp(s, -1)


# (sq, skv, pre_tockens, next_tockens): a sliding window, a band off a longer key sequence
# (counted from the bottom-right corner: the last query's band ends at the last key), a
# shorter key sequence (the first queries see no key), the whole lower triangle (= mode 3)
# and a band that leaves out the diagonal.
BAND_CASES = [(6, 6, 2, 0), (4, 7, 1, 1), (7, 4, 2, 1), (6, 6, NO_BAND, 0), (5, 5, 3, -1)]


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "SBH", "TND"])
@pytest.mark.parametrize("sq,skv,pre,nxt", BAND_CASES)
def test_fusion_attention_band_mode_4_forward_grad_op_and_autograd(layout, sq, skv, pre, nxt):
    torch.manual_seed(1)
    dtype, scale = torch.float32, 0.4
    q, k, v = rand(B, N, sq, D, dtype=dtype), rand(B, KVN, skv, D, dtype=dtype), rand(B, KVN, skv, D, dtype=dtype)
    dy = rand(B, N, sq, D, dtype=dtype)
    keep = geometry(sq, skv, 4, pre, nxt)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    expected, expected_lse = band_reference(*ref_in, scale, keep)
    expected.backward(dy)

    lay = lambda t: fa_layout(t, layout).npu()  # noqa: E731
    extra = dict(actual_seq_qlen=[sq, 2 * sq], actual_seq_kvlen=[skv, 2 * skv]) if layout == "TND" else {}
    band = dict(atten_mask=COMPRESSED.npu(), sparse_mode=4, pre_tockens=pre, next_tockens=nxt, **extra)
    leaves = [lay(t).requires_grad_() for t in (q, k, v)]
    fwd = torch_npu.npu_fusion_attention(*leaves, N, layout, scale=scale, **band)
    torch.testing.assert_close(fa_unlayout(fwd[0].detach().cpu(), layout, B, N), expected.detach(), **tol(dtype))
    seen = keep.any(-1)
    lse = fwd[1][..., 0].cpu()
    if layout == "TND":
        lse = lse.reshape(B, sq, N).transpose(1, 2)
    torch.testing.assert_close(lse[..., seen], expected_lse.detach()[..., seen], **tol(dtype))
    # autograd through the forward
    fwd[0].backward(lay(dy))
    for got, ref, heads in zip(leaves, ref_in, (N, KVN, KVN)):
        torch.testing.assert_close(fa_unlayout(got.grad.cpu(), layout, B, heads), ref.grad, **tol(dtype))
    # the grad op, with the forward's statistics and recomputing them
    for stats in (True, False):
        given = dict(softmax_max=fwd[1], softmax_sum=fwd[2], attention_in=fwd[0].detach()) if stats else {}
        grads = torch_npu.npu_fusion_attention_grad(lay(q), lay(k), lay(v), lay(dy), N, layout, scale_value=scale,
                                                    **band, **given)
        for got, ref, heads in zip(grads[:3], ref_in, (N, KVN, KVN)):
            torch.testing.assert_close(fa_unlayout(got.cpu(), layout, B, heads), ref.grad, **tol(dtype))


def test_fusion_attention_band_mode_4_varlen_per_sequence_and_half_precision():
    """TND: each sequence has its own band, from its own bottom-right corner; bfloat16."""
    torch.manual_seed(2)
    qlens, kvlens, pre, nxt, scale = [3, 6], [5, 4], 1, 0, 0.5
    dtype = torch.bfloat16
    q, k, v, dy = rand(9, N, D, dtype=dtype), rand(9, KVN, D, dtype=dtype), rand(9, KVN, D, dtype=dtype), \
        rand(9, N, D, dtype=dtype)
    leaves = [t.npu().requires_grad_() for t in (q, k, v)]
    band = dict(atten_mask=COMPRESSED.npu(), sparse_mode=4, pre_tockens=pre, next_tockens=nxt,
                actual_seq_qlen=[3, 9], actual_seq_kvlen=[5, 9])
    out = torch_npu.npu_fusion_attention(*leaves, N, "TND", scale=scale, **band)[0]
    out.backward(dy.npu())
    grads = torch_npu.npu_fusion_attention_grad(q.npu(), k.npu(), v.npu(), dy.npu(), N, "TND", scale_value=scale,
                                                **band)
    qb = kb = 0
    for sq, skv in zip(qlens, kvlens):
        seq = [t.float()[b:b + n].transpose(0, 1).unsqueeze(0).requires_grad_()
               for t, b, n in ((q, qb, sq), (k, kb, skv), (v, kb, skv))]
        expected, _ = band_reference(*seq, scale, geometry(sq, skv, 4, pre, nxt))
        expected.backward(dy.float()[qb:qb + sq].transpose(0, 1).unsqueeze(0))
        unpack = lambda t: t.squeeze(0).transpose(0, 1)  # noqa: E731
        close = dict(rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(out[qb:qb + sq].detach().cpu().float(), unpack(expected.detach()), **close)
        for i, (lo, n) in enumerate(((qb, sq), (kb, skv), (kb, skv))):
            torch.testing.assert_close(leaves[i].grad[lo:lo + n].cpu().float(), unpack(seq[i].grad), **close)
            torch.testing.assert_close(grads[i][lo:lo + n].cpu().float(), unpack(seq[i].grad), **close)
        qb, kb = qb + sq, kb + skv


def test_fusion_attention_grad_errors():
    q = torch.randn(1, 2, 4, 8).npu()
    with pytest.raises(RuntimeError, match="keep_prob 0.9 < 1 .* autograd"):
        torch_npu.npu_fusion_attention_grad(q, q, q, q, 2, "BNSD", keep_prob=0.9)
    with pytest.raises(RuntimeError, match="input_layout 'NSD' is not supported"):
        torch_npu.npu_fusion_attention_grad(q, q, q, q, 2, "NSD")
    with pytest.raises(RuntimeError, match="must be float32, float16 or bfloat16"):
        torch_npu.npu_fusion_attention_grad(q.double(), q.double(), q.double(), q.double(), 2, "BNSD")
    with pytest.raises(RuntimeError, match="sparse_mode 5 is not supported.*0 to 4"):
        torch_npu.npu_fusion_attention_grad(q, q, q, q, 2, "BNSD", sparse_mode=5)


# ---- torch.compile: the meta kernels trace each op ----------------------------------------------------

def test_compile_fullgraph_traces_each_op_and_matches_eager():
    torch.manual_seed(0)
    q, k, v = (t.npu() for t in inputs(torch.float16, sq=4, skv=20))
    kc, vc, table = (t.npu() for t in paged(k.cpu(), v.cpu(), [20, 17], 16))
    dy = rand(B, N, 4, D).npu()
    slot_key = torch.randn(3, KVN, D).half().npu()

    def serve(q, k, v, kc, vc, table, dy, slot_key):
        pfa = torch_npu.npu_prompt_flash_attention(q, k, v, num_heads=N, num_key_value_heads=KVN,
                                                   input_layout="BNSD", scale_value=0.2)
        fia, lse = torch_npu.npu_fused_infer_attention_score(q, k, v, num_heads=N, num_key_value_heads=KVN,
                                                             input_layout="BNSD", softmax_lse_flag=True)
        v2, _ = torch_npu.npu_fused_infer_attention_score_v2(q, k, v, num_query_heads=N, num_key_value_heads=KVN,
                                                             input_layout="BNSD_BSND")
        ifa = torch_npu.npu_incre_flash_attention(q[:, :, :1].reshape(B, 1, N * D), kc, vc, block_table=table,
                                                  block_size=16, actual_seq_lengths=[20, 17], num_heads=N,
                                                  num_key_value_heads=KVN)
        grads = torch_npu.npu_fusion_attention_grad(q.float(), k.float(), v.float(), dy.float(), N, "BNSD",
                                                    scale_value=0.2)
        new_kc, _ = torch.ops.npu.npu_scatter_pa_kv_cache_functional(slot_key, slot_key, kc.view(-1, 16, KVN, D),
                                                                     vc.view(-1, 16, KVN, D),
                                                                     torch.tensor([0, 5, 40], device=q.device),
                                                                     cache_mode="Norm")
        return pfa, fia, lse, v2, ifa, grads[0], grads[1], grads[2], new_kc

    args = (q, k, v, kc, vc, table, dy, slot_key)
    eager = serve(*args)
    compiled = torch.compile(serve, backend="aot_eager", fullgraph=True)(*args)
    for e, c in zip(eager, compiled):
        assert c.shape == e.shape and c.dtype == e.dtype
        torch.testing.assert_close(c.cpu(), e.cpu())

    def scatter_in_place(key, kc, vc, slots):
        torch_npu.npu_scatter_pa_kv_cache(key, key, kc, vc, slots, cache_mode="Norm")
        return kc + 0

    cache = torch.zeros(3, 16, KVN, D, dtype=torch.float16, device="npu")
    slots = torch.tensor([1, 2, 33], device="npu")
    out = torch.compile(scatter_in_place, backend="aot_eager", fullgraph=True)(slot_key, cache, cache.clone(), slots)
    expected = torch.zeros(3, 16, KVN, D, dtype=torch.float16)
    torch_npu.npu_scatter_pa_kv_cache(slot_key.cpu(), slot_key.cpu(), expected, expected.clone(), slots.cpu(),
                                      cache_mode="Norm")
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(cache.cpu(), expected)  # the compiled graph mutated the caller's cache


def opcheck_cases():
    torch.manual_seed(0)
    q, k = rand(B, N, 8, D).npu(), rand(B, KVN, 8, D).npu()
    kc, vc, table = (t.npu() for t in paged(k.cpu(), k.cpu(), [8, 5], 16))
    tokens, cache = torch.randn(3, KVN, D).npu(), torch.zeros(2, 16, KVN, D).npu()
    mask = COMPRESSED.npu()
    return {
        "npu_prompt_flash_attention": ((q, k, k), dict(num_heads=N, num_key_value_heads=KVN, input_layout="BNSD")),
        "npu_incre_flash_attention": ((q[:, :, :1].reshape(B, 1, -1), kc, vc),
                                      dict(block_table=table, block_size=16, actual_seq_lengths=[8, 5], num_heads=N,
                                           num_key_value_heads=KVN)),
        "npu_fused_infer_attention_score": ((q, k, k), dict(num_heads=N, num_key_value_heads=KVN, input_layout="BNSD",
                                                            atten_mask=mask, sparse_mode=3, softmax_lse_flag=True)),
        "npu_fused_infer_attention_score_v2": ((q, k, k), dict(num_query_heads=N, num_key_value_heads=KVN,
                                                               input_layout="BNSD_BSND", return_softmax_lse=True)),
        "npu_fusion_attention_grad": ((q.float(), k.float(), k.float(), q.float(), N, "BNSD"), dict(scale_value=0.3)),
        "npu_scatter_pa_kv_cache": ((tokens, tokens, cache, cache.clone(), torch.tensor([0, 3, 17]).npu()),
                                    dict(cache_mode="Norm")),
        "npu_scatter_pa_kv_cache_functional": ((tokens, tokens, cache, cache.clone(), torch.tensor([0, 3, 17]).npu()),
                                               dict(cache_mode="Norm")),
        "npu_gather_pa_kv_cache": ((cache, cache, torch.tensor([[1], [0]], dtype=torch.int32).npu(),
                                    torch.tensor([2, 1]).npu(), torch.zeros_like(tokens), torch.zeros_like(tokens)),
                                   {}),
        "npu_gather_pa_kv_cache_functional": ((cache, cache, torch.tensor([[1], [0]], dtype=torch.int32).npu(),
                                               torch.tensor([2, 1]).npu(), torch.zeros_like(tokens),
                                               torch.zeros_like(tokens)), {}),
    }


OPCHECK_CASES = ["npu_prompt_flash_attention", "npu_incre_flash_attention", "npu_fused_infer_attention_score",
                 "npu_fused_infer_attention_score_v2", "npu_fusion_attention_grad", "npu_scatter_pa_kv_cache",
                 "npu_scatter_pa_kv_cache_functional", "npu_gather_pa_kv_cache",
                 "npu_gather_pa_kv_cache_functional"]


@pytest.mark.parametrize("name", OPCHECK_CASES)
def test_opcheck_schema_fake_and_aot_dispatch(name):
    cases = opcheck_cases()  # made in the test: no npu work while pytest collects
    assert list(cases) == OPCHECK_CASES
    args, kwargs = cases[name]
    torch.library.opcheck(getattr(torch.ops.npu, name).default, args, kwargs,
                          test_utils=["test_schema", "test_faketensor", "test_aot_dispatch_static",
                                      "test_aot_dispatch_dynamic"])


def test_compile_with_dynamic_shapes_traces_the_serving_calls():
    """vllm compiles with the token count dynamic: the meta kernels work on symbolic shapes."""
    torch.manual_seed(0)
    kc, vc = torch.randn(6, 16, KVN * D).half().npu(), torch.randn(6, 16, KVN * D).half().npu()
    table = torch.tensor([[0, 3], [5, 1]], dtype=torch.int32).npu()

    def serve(q, k, v, new_k, slots, q_ends):
        cache = kc.view(6, 16, KVN, D).clone()
        torch_npu.npu_scatter_pa_kv_cache(new_k, new_k, cache, cache.clone(), slots, cache_mode="Norm")
        decode, lse = torch_npu.npu_fused_infer_attention_score(
            q, kc, vc, block_table=table, block_size=16, input_layout="TND", actual_seq_lengths=q_ends,
            actual_seq_lengths_kv=[20, 25], num_heads=N, num_key_value_heads=KVN, atten_mask=COMPRESSED.npu(),
            sparse_mode=3, softmax_lse_flag=True)
        prefill = torch_npu.npu_prompt_flash_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), num_heads=N,
                                                       num_key_value_heads=KVN, input_layout="BSND")
        grads = torch_npu.npu_fusion_attention_grad(q.float(), k.float(), v.float(), q.float(), N, "TND",
                                                    actual_seq_qlen=q_ends, actual_seq_kvlen=q_ends)
        return decode, lse, prefill, grads[0], grads[1], cache

    compiled = torch.compile(serve, backend="aot_eager", dynamic=True, fullgraph=True)
    for tokens in (5, 9):
        q, k, v = (torch.randn(tokens, n, D).half().npu() for n in (N, KVN, KVN))
        new_k = torch.randn(tokens, KVN, D).half().npu()
        slots = torch.arange(tokens).npu()
        args = (q, k, v, new_k, slots, [2, tokens])
        for e, c in zip(serve(*args), compiled(*args)):
            assert c.shape == e.shape and c.dtype == e.dtype
            torch.testing.assert_close(c.cpu(), e.cpu())


PROJECTION_RUN = r"""
import json, torch, torch_npu
from torch_npu.profiler import ProfilerActivity, profile

def projected(seq):
    q = torch.randn(1, 8, seq, 64, dtype=torch.float16).npu()
    k = torch.randn(1, 2, seq, 64, dtype=torch.float16).npu()
    tokens = k[0].transpose(0, 1).contiguous()
    cache = torch.zeros(seq // 16, 16, 2, 64, dtype=torch.float16).npu()
    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1).npu()
    torch.npu.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as prof:
        torch_npu.npu_fused_infer_attention_score(q, k, k, num_heads=8, num_key_value_heads=2, input_layout="BNSD",
                                                  atten_mask=mask, sparse_mode=3)
        torch_npu.npu_fusion_attention_grad(q, k, k, q, 8, "BNSD", sparse_mode=2)
        torch_npu.npu_scatter_pa_kv_cache(tokens, tokens, cache, cache.clone(), torch.arange(seq).npu(),
                                          cache_mode="Norm")
        torch.npu.synchronize()
    return {e.name: e.npu_projected_time_total for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.PrivateUse1}

print(json.dumps([projected(256), projected(2048)]))
"""


def test_projected_times_under_a_chip_profile():
    """Under a chip profile the profiler shows each op's projected time on that chip: the
    attention's matmuls on the cube unit grow with the sequence, the grad's five past the
    forward's two."""
    import json

    from helpers import last_line, run_python

    small, large = json.loads(last_line(run_python(PROJECTION_RUN, env={"NPU_EMU_PROFILE": "ascend910b2"},
                                                   timeout=300)))
    ops = ("npu_fused_infer_attention_score", "npu_fusion_attention_grad", "npu_scatter_pa_kv_cache")
    for op in ops:
        assert small[op] > 0 and large[op] > small[op], (op, small, large)
    forward = large[ops[0]] - small[ops[0]]
    backward = large[ops[1]] - small[ops[1]]
    assert 2.0 < backward / forward < 3.0  # 5 matmuls against 2 (the launch overhead cancels)


# ---- end to end: a tiny decoder served from a paged KV cache -----------------------------------------------

@pytest.mark.parametrize("engine", ["pfa_ifa", "fused_infer", "vllm_ascend"])
def test_paged_decode_generates_the_dense_models_tokens(engine):
    import paged_decode

    dense, served = paged_decode.compare(engine=engine, new_tokens=14)
    assert dense.shape == served.shape == (2, 14)
    assert torch.equal(dense, served), (dense, served)
