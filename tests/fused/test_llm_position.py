"""The positional and sampling operators of LLM serving (csrc/ops/fused/position.cpp) against
the compositions they stand for: float32, float16 and bfloat16 at small real-model shapes, npu and
cpu tensors, gradients where the op has a backward, torch.compile, and the errors of bad input."""
import json

import pytest
import torch
import torch.nn.functional as F

import torch_npu

from helpers import last_line, run_python

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICES = ["npu", "cpu"]


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def close(actual, expected, dtype):
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), **tol(dtype))


def leaf(t, device="cpu", dtype=None):
    """A fresh leaf copy of t that requires grad."""
    return t.detach().to(device, dtype or t.dtype, copy=True).requires_grad_()


def rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def rotate_pairs(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)


# ---- npu_apply_rotary_pos_emb -------------------------------------------------------------------

# query, key, cos shapes per layout: Qwen-like 4 query heads over 2 key heads.
LAYOUT_SHAPES = {
    "BSND": ((2, 5, 4, 128), (2, 5, 2, 128), (2, 5, 1, 128)),
    "BSH": ((2, 5, 4, 128), (2, 5, 2, 128), (2, 5, 1, 128)),  # the default: BSND on Ascend too
    "SBND": ((5, 2, 4, 64), (5, 2, 2, 64), (5, 2, 1, 64)),
    "BNSD": ((2, 4, 5, 64), (2, 2, 5, 64), (2, 1, 5, 64)),
    "TND": ((7, 4, 128), (7, 2, 128), (7, 1, 128)),
}


def apply_rotary_ref(x, cos, sin, mode):
    x, cos, sin = x.float(), cos.float(), sin.float()
    return x * cos + (rotate_half(x) if mode == "half" else rotate_pairs(x)) * sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(LAYOUT_SHAPES))
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_apply_rotary_pos_emb_updates_query_and_key_in_place(dtype, layout, mode):
    torch.manual_seed(0)
    q_shape, k_shape, c_shape = LAYOUT_SHAPES[layout]
    q, k = torch.randn(q_shape).to(dtype), torch.randn(k_shape).to(dtype)
    cos, sin = torch.randn(c_shape).to(dtype), torch.randn(c_shape).to(dtype)
    for device in DEVICES:
        qd, kd = q.to(device, copy=True), k.to(device, copy=True)
        versions = qd._version, kd._version
        q_out, k_out = torch_npu.npu_apply_rotary_pos_emb(qd, kd, cos.to(device), sin.to(device), layout=layout,
                                                          rotary_mode=mode)
        assert q_out is qd and k_out is kd  # the Ascend contract: the inputs, updated
        assert qd._version > versions[0] and kd._version > versions[1]  # autograd sees the mutation
        close(qd, apply_rotary_ref(q, cos, sin, mode), dtype)
        close(kd, apply_rotary_ref(k, cos, sin, mode), dtype)


def test_apply_rotary_pos_emb_broadcasts_batch_and_updates_non_contiguous_views():
    torch.manual_seed(0)
    qkv = torch.randn(2, 3, 6, 64)  # [B, S, q heads 4 + k heads 2, D]: query and key are views of it
    cos, sin = torch.randn(1, 3, 1, 64), torch.randn(1, 3, 1, 64)  # B = 1 broadcasts
    expected_q = apply_rotary_ref(qkv[:, :, :4], cos, sin, "half")
    expected_k = apply_rotary_ref(qkv[:, :, 4:], cos, sin, "half")
    for device in DEVICES:
        packed = qkv.to(device, copy=True)
        q, k = packed[:, :, :4], packed[:, :, 4:]
        torch.ops.npu.npu_apply_rotary_pos_emb(q, k, cos.to(device), sin.to(device))
        close(packed[:, :, :4], expected_q, torch.float32)
        close(packed[:, :, 4:], expected_k, torch.float32)


def test_apply_rotary_pos_emb_refuses_tensors_that_require_grad():
    q, k, cos, sin = (torch.randn(1, 2, 2, 64, device="npu") for _ in range(4))
    cos, sin = cos[:, :, :1], sin[:, :, :1]
    with pytest.raises(RuntimeError, match="no backward.*npu_rotary_mul"):
        torch_npu.npu_apply_rotary_pos_emb(q.requires_grad_(), k, cos, sin)
    with torch.no_grad():
        torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin)  # fine without autograd
    with torch.inference_mode():  # as vLLM serves
        q, k = q.clone(), k.clone()
        torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin)
    with pytest.raises(RuntimeError, match="inference tensor outside InferenceMode"):
        torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin)  # as aten's in-place ops


def test_apply_rotary_pos_emb_compiles_and_matches_eager():
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 4, 64, device="npu"), torch.randn(1, 4, 2, 64, device="npu")
    cos, sin = torch.randn(1, 4, 1, 64, device="npu"), torch.randn(1, 4, 1, 64, device="npu")

    def rotate_copies(q, k, cos, sin):
        q, k = q.clone(), k.clone()
        torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin)
        return q * 2, k

    def rotate_inputs(q, k, cos, sin):
        return torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin)

    expected = rotate_copies(q, k, cos, sin)
    actual = torch.compile(rotate_copies, fullgraph=True, backend="aot_eager")(q, k, cos, sin)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
    q2, k2 = q.clone(), k.clone()
    torch.compile(rotate_inputs, fullgraph=True, backend="aot_eager")(q2, k2, cos, sin)  # mutates its inputs
    torch.testing.assert_close(q2, expected[0] / 2)
    torch.testing.assert_close(k2, expected[1])


def test_apply_rotary_pos_emb_errors():
    q, k = torch.randn(1, 2, 4, 64, device="npu"), torch.randn(1, 2, 2, 64, device="npu")
    cos = sin = torch.randn(1, 2, 1, 64, device="npu")
    apply = torch_npu.npu_apply_rotary_pos_emb
    with pytest.raises(RuntimeError, match="npu_apply_rotary_pos_emb: key must have query's dtype"):
        apply(q, k.half(), cos, sin)
    with pytest.raises(RuntimeError, match="query must be float32, float16 or bfloat16 on npu:0, got Double"):
        apply(q.double(), k.double(), cos.double(), sin.double())
    with pytest.raises(RuntimeError, match="cos and sin must have query's shape .* with N = 1"):
        apply(q, k, torch.randn(1, 2, 2, 64, device="npu"), torch.randn(1, 2, 2, 64, device="npu"))
    with pytest.raises(ValueError, match="layout must be 'BSH' \\(= 'BSND'\\), 'BSND', 'SBND', 'BNSD' or 'TND', got 'NSD'"):
        apply(q, k, cos, sin, "NSD")
    with pytest.raises(RuntimeError, match="with layout 'TND' query must have 3 dimensions"):
        apply(q, k, cos, sin, "TND")
    with pytest.raises(NotImplementedError, match="'quarter'.*use 'half' or 'interleave'"):
        apply(q, k, cos, sin, rotary_mode="quarter")
    with pytest.raises(RuntimeError, match="must be even"):
        apply(q[..., :63], k[..., :63], cos[..., :63], sin[..., :63])


# ---- npu_mrope -------------------------------------------------------------------------------------

def rope_cache(max_pos, rotary_dim, dtype):
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv)
    return torch.cat([freqs.cos(), freqs.sin()], -1).to(dtype)


def mrope_ref(positions, query, key, cache, head_size, sections=None, mode="half", cache_mode="default"):
    """The composition the Ascend documentation gives (vLLM's MRotaryEmbedding), in float."""
    tokens, rotary_dim = query.shape[0], cache.shape[-1]
    cos, sin = cache.float()[positions].chunk(2, -1)  # [T, R/2] or [m, T, R/2]
    if positions.dim() == 2:
        def select(table):
            if cache_mode == "default":
                return torch.cat([part[i] for i, part in enumerate(table.split(sections, -1))], -1)
            merged = table[0].clone()
            merged[..., 1:sections[1] * 3:3] = table[1, ..., 1:sections[1] * 3:3]
            merged[..., 2:sections[1] * 3:3] = table[2, ..., 2:sections[1] * 3:3]
            return merged
        cos, sin = select(cos), select(sin)
    cos, sin = cos[:, None], sin[:, None]

    def rotate(x):
        x = x.float().view(tokens, -1, head_size)
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        if mode == "half":
            x1, x2 = rot.chunk(2, -1)
            rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
        else:
            x1, x2 = rot[..., ::2], rot[..., 1::2]
            rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
        return torch.cat((rot, rest), -1).reshape(tokens, -1)

    return rotate(query), rotate(key)


# (sections, rotary_dim, head_size, cache_mode): Qwen2-VL, Qwen2.5-VL-small, 4 sections, Qwen3-VL
# interleaved, and plain rope with a partial rotary dimension.
MROPE_CASES = [
    ([16, 24, 24], 128, 128, "default"),
    ([8, 12, 12], 64, 64, "default"),
    ([16, 16, 16, 16], 128, 128, "default"),
    ([24, 20, 20], 128, 128, "interleave"),
    (None, 64, 128, "default"),
]


def mrope_inputs(sections, rotary_dim, head_size, dtype, tokens=7, q_heads=4, k_heads=2, max_pos=32):
    positions = torch.randint(0, max_pos, (tokens,) if sections is None else (len(sections), tokens))
    query = torch.randn(tokens, q_heads * head_size).to(dtype)
    key = torch.randn(tokens, k_heads * head_size).to(dtype)
    return positions, query, key, rope_cache(max_pos, rotary_dim, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MROPE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}")
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_mrope_matches_the_composition_with_gradients(dtype, case, mode):
    sections, rotary_dim, head_size, cache_mode = case
    torch.manual_seed(0)
    positions, query, key, cache = mrope_inputs(sections, rotary_dim, head_size, dtype)
    ref_q, ref_k = leaf(query, dtype=torch.float32), leaf(key, dtype=torch.float32)
    expected = mrope_ref(positions, ref_q, ref_k, cache, head_size, sections, mode, cache_mode)
    grads = [torch.randn_like(e) for e in expected]
    torch.autograd.backward(expected, grads)
    for device in DEVICES:
        q, k = leaf(query, device), leaf(key, device)
        actual = torch_npu.npu_mrope(positions.to(device), q, k, cache.to(device), head_size,
                                     mrope_section=sections, rotary_mode=mode, cache_mode=cache_mode)
        for a, e in zip(actual, expected):
            assert a.device.type == device and a.dtype == dtype and a.shape == e.shape
            close(a, e, dtype)
        torch.autograd.backward(actual, [g.to(device, dtype) for g in grads])
        close(q.grad, ref_q.grad, dtype)
        close(k.grad, ref_k.grad, dtype)


def test_mrope_int32_positions_zero_sections_and_compile():
    torch.manual_seed(0)
    positions, query, key, cache = (t.npu() for t in mrope_inputs(None, 128, 128, torch.float16))
    expected = torch_npu.npu_mrope(positions, query, key, cache, 128)
    as_int32 = torch_npu.npu_mrope(positions.int(), query, key, cache, 128, mrope_section=[0, 0, 0])
    for a, e in zip(as_int32, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=0)

    def f(positions, query, key, cache):
        return torch_npu.npu_mrope(positions, query, key, cache, 128, mrope_section=[0, 0, 0], rotary_mode="half")

    for a, e in zip(torch.compile(f, fullgraph=True, backend="aot_eager")(positions, query, key, cache), expected):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


def test_mrope_errors():
    positions, query, key, cache = (t.npu() for t in mrope_inputs([16, 24, 24], 128, 128, torch.float32))
    mrope = torch_npu.npu_mrope
    with pytest.raises(IndexError, match=r"positions must be in \[0, 32\)"):
        mrope(positions + 32, query, key, cache, 128, mrope_section=[16, 24, 24])
    with pytest.raises(ValueError, match="sum to rotary_dim / 2 = 64"):
        mrope(positions, query, key, cache, 128, mrope_section=[16, 24, 16])
    with pytest.raises(RuntimeError, match="positions must be 1-D"):
        mrope(positions, query, key, cache, 128)
    with pytest.raises(RuntimeError, match="cos_sin_cache must have query's dtype"):
        mrope(positions, query, key, cache.half(), 128, mrope_section=[16, 24, 24])
    with pytest.raises(RuntimeError, match="head_size .* must be a positive multiple of 32 for Half"):
        mrope(positions, query.half(), key.half(), cache.half(), 120, mrope_section=[16, 24, 24])
    with pytest.raises(RuntimeError, match="query and key must be 2-D"):
        mrope(positions, query.view(7, 4, 128), key, cache, 128, mrope_section=[16, 24, 24])
    with pytest.raises(ValueError, match="cache_mode 'interleave' needs 3 sections with section"):
        mrope(positions, query, key, cache, 128, mrope_section=[16, 28, 20], cache_mode="interleave")
    with pytest.raises(RuntimeError, match="cos_sin_cache requires grad"):
        mrope(positions, query, key, cache.requires_grad_(), 128, mrope_section=[16, 24, 24])


# ---- npu_interleave_rope ---------------------------------------------------------------------------

def interleave_rope_ref(x, cos, sin):
    x, cos, sin = x.float(), cos.float(), sin.float()
    q = torch.cat((x[..., 0::2], x[..., 1::2]), -1)
    return q * cos + rotate_half(q) * sin


# (x, cos) shapes: decode (DeepSeek MLA's rope part: tokens x heads x 1 x 64) and prefill.
INTERLEAVE_SHAPES = [((3, 4, 1, 64), (3, 1, 1, 64)), ((2, 2, 5, 64), (2, 1, 5, 64)), ((2, 2, 5, 64), (2, 1, 1, 64))]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shapes", INTERLEAVE_SHAPES, ids=str)
def test_interleave_rope_matches_the_composition_with_gradients(dtype, shapes):
    torch.manual_seed(0)
    x_shape, c_shape = shapes
    x, cos, sin = torch.randn(x_shape).to(dtype), torch.randn(c_shape).to(dtype), torch.randn(c_shape).to(dtype)
    ref_x = leaf(x, dtype=torch.float32)
    expected = interleave_rope_ref(ref_x, cos, sin)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    for device in DEVICES:
        xd = leaf(x, device)
        actual = torch_npu.npu_interleave_rope(xd, cos.to(device), sin.to(device))
        assert actual.dtype == dtype and actual.device.type == device
        close(actual, expected, dtype)
        actual.backward(grad.to(device, dtype))
        close(xd.grad, ref_x.grad, dtype)


def test_interleave_rope_compiles_and_refuses_what_ascend_refuses():
    x = torch.randn(3, 4, 1, 64, device="npu", dtype=torch.bfloat16)
    cos, sin = (torch.randn(3, 1, 1, 64, device="npu", dtype=torch.bfloat16) for _ in range(2))
    compiled = torch.compile(torch_npu.npu_interleave_rope, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, cos, sin), torch_npu.npu_interleave_rope(x, cos, sin), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="x must be float16 or bfloat16 on npu:0, got Float .*cast x, cos and sin"):
        torch_npu.npu_interleave_rope(x.float(), cos.float(), sin.float())
    with pytest.raises(RuntimeError, match="D = 64"):
        torch_npu.npu_interleave_rope(x[..., :32], cos[..., :32], sin[..., :32])
    with pytest.raises(RuntimeError, match=r"cos and sin must be \[B, 1, S or 1, 64\]"):
        torch_npu.npu_interleave_rope(x, cos.expand(3, 4, 1, 64), sin.expand(3, 4, 1, 64))
    with pytest.raises(RuntimeError, match="cos requires grad"):
        torch_npu.npu_interleave_rope(x, cos.clone().requires_grad_(), sin)


# ---- npu_top_k_top_p -------------------------------------------------------------------------------

def top_k_top_p_ref(logits, p, k):
    """The Ascend documentation's formula: ascending stable sort, top-k by the k-th largest value,
    top-p by the cumulative softmax from the smallest (the largest always kept)."""
    values, order = logits.float().sort(dim=-1, descending=False, stable=True)
    if k is not None:
        kth = values.gather(-1, (logits.shape[1] - k.long()).unsqueeze(1))
        values = values.masked_fill(values < kth, float("-inf"))
    if p is not None:
        cumulative = values.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - p.float().unsqueeze(1)
        drop[:, -1] = False
        values = values.masked_fill(drop, float("-inf"))
    return torch.empty_like(values).scatter_(-1, order, values)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["both", "k", "p"])
def test_top_k_top_p_equals_the_reference_filter_exactly(dtype, which):
    torch.manual_seed(0)
    logits = (torch.randn(5, 3000) * 3).to(dtype)  # bfloat16 has ties at the thresholds
    k = torch.tensor([1, 7, 50, 1024, 300], dtype=torch.int32) if which != "p" else None
    p = torch.tensor([0.9, 0.5, 1.0, 0.95, 0.0]).to(dtype) if which != "k" else None
    expected = top_k_top_p_ref(logits, p, k)
    for device in DEVICES:
        actual = torch_npu.npu_top_k_top_p(logits.to(device), p=None if p is None else p.to(device),
                                           k=None if k is None else k.to(device))
        assert actual.dtype == dtype and actual.device.type == device
        torch.testing.assert_close(actual.float().cpu(), expected, rtol=0, atol=0)  # -inf where filtered
    kept = torch.isfinite(expected).sum(1)
    assert (kept >= 1).all() and (kept < logits.shape[1]).any()  # it filtered something


def test_top_k_top_p_without_filters_and_compiled():
    logits = torch.randn(3, 100, device="npu")
    unfiltered = torch_npu.npu_top_k_top_p(logits)
    assert unfiltered.data_ptr() != logits.data_ptr()
    torch.testing.assert_close(unfiltered, logits, rtol=0, atol=0)
    p, k = torch.tensor([0.8, 0.3, 0.6], device="npu"), torch.tensor([5, 10, 100], dtype=torch.int32, device="npu")
    compiled = torch.compile(torch_npu.npu_top_k_top_p, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(logits, p, k), torch_npu.npu_top_k_top_p(logits, p, k), rtol=0, atol=0)


def test_top_k_top_p_errors():
    logits = torch.randn(2, 2000, device="npu")
    p = torch.tensor([0.5, 0.5], device="npu")
    k = torch.tensor([3, 3], dtype=torch.int32, device="npu")
    with pytest.raises(ValueError, match=r"k must be in \[1, 1024\] .* got 1025 in row 1"):
        torch_npu.npu_top_k_top_p(logits, p, torch.tensor([3, 1025], dtype=torch.int32, device="npu"))
    with pytest.raises(ValueError, match=r"k must be in \[1, 10\]"):
        torch_npu.npu_top_k_top_p(logits[:, :10], p, torch.tensor([0, 1], dtype=torch.int32, device="npu"))
    with pytest.raises(RuntimeError, match=r"k must be int32 on npu:0, got Long \(convert it"):
        torch_npu.npu_top_k_top_p(logits, p, k.long())
    with pytest.raises(RuntimeError, match="p must have logits's dtype"):
        torch_npu.npu_top_k_top_p(logits, p.half(), k)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\] on npu:0, got 1.5 in row 0"):
        torch_npu.npu_top_k_top_p(logits, torch.tensor([1.5, 0.5], device="npu"), k)
    empty = torch_npu.npu_top_k_top_p(logits[:, :0], p)  # no vocabulary: nothing to filter
    assert empty.shape == (2, 0)
    with pytest.raises(RuntimeError, match="logits must be 2-D"):
        torch_npu.npu_top_k_top_p(logits.view(2, 1, 2000), p, k)


# ---- npu_scaled_masked_softmax ---------------------------------------------------------------------

def scaled_masked_softmax_ref(x, mask, scale):
    return F.softmax((x.float() * scale).masked_fill(mask, -10000.0), -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_shape", [(2, 1, 32, 64), (1, 1, 32, 64), (2, 3, 32, 64), (32, 1)], ids=str)
def test_scaled_masked_softmax_matches_the_composition_with_gradients(dtype, mask_shape):
    torch.manual_seed(0)
    x = (torch.randn(2, 3, 32, 64) * 3).to(dtype)
    mask = torch.rand(mask_shape) > 0.6
    if mask.shape[-1] == 64:
        mask[..., 0, :] = True  # a fully masked row: uniform, as the composition
    scale = 0.125
    ref_x = leaf(x, dtype=torch.float32)
    expected = scaled_masked_softmax_ref(ref_x, mask, scale)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    for device in DEVICES:
        xd = leaf(x, device)
        actual = torch_npu.npu_scaled_masked_softmax(xd, mask.to(device), scale)
        assert actual.dtype == dtype and actual.device.type == device
        close(actual, expected, dtype)
        actual.backward(grad.to(device, dtype))
        close(xd.grad, ref_x.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hw", [(64, 64), (32, 64)], ids=str)
def test_scaled_masked_softmax_fixed_triu_mask_is_the_causal_triangle(dtype, hw):
    """fixed_triu_mask=True (MindSpeed's ScaledUpperTriangMaskedSoftmax): the given mask is
    replaced by the upper triangle of (H, W), w > h masked; forward, backward and its op."""
    torch.manual_seed(0)
    h, w = hw
    x = (torch.randn(2, 3, h, w) * 3).to(dtype)
    ignored = torch.rand(1, 1, h, w) > 0.5  # its content is not read (MindSpeed passes zeros)
    causal = torch.ones(h, w, dtype=torch.bool).triu(1)
    scale = 0.25
    ref_x = leaf(x, dtype=torch.float32)
    expected = scaled_masked_softmax_ref(ref_x, causal, scale)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    for device in DEVICES:
        xd = leaf(x, device)
        actual = torch_npu.npu_scaled_masked_softmax(xd, ignored.to(device), scale, fixed_triu_mask=True)
        close(actual, expected, dtype)
        actual.backward(grad.to(device, dtype))
        close(xd.grad, ref_x.grad, dtype)
        dx = torch.ops.npu.npu_scaled_masked_softmax_backward(grad.to(device, dtype), actual.detach(),
                                                              ignored.to(device), scale, True)
        close(dx, ref_x.grad, dtype)
        assert torch.count_nonzero(dx.float().cpu() * causal) == 0  # the masked positions get no gradient


def test_scaled_masked_softmax_compiles_with_its_backward():
    torch.manual_seed(0)
    x = torch.randn(1, 2, 32, 32, device="npu")
    mask = torch.triu(torch.ones(32, 32, dtype=torch.bool, device="npu"), 1)

    def loss(x):
        return (torch_npu.npu_scaled_masked_softmax(x, mask, 0.5) * torch.arange(32.0, device="npu")).sum()

    eager_x, compiled_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    loss(eager_x).backward()
    torch.compile(loss, fullgraph=True, backend="aot_eager")(compiled_x).backward()
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)


def test_scaled_masked_softmax_errors():
    x = torch.randn(1, 1, 32, 64, device="npu")
    mask = torch.zeros(1, 1, 32, 64, dtype=torch.bool, device="npu")
    with pytest.raises(RuntimeError, match="mask .* must broadcast to x's shape"):
        torch_npu.npu_scaled_masked_softmax(x, mask[..., :32], 1.0, True)  # checked even when not read
    with pytest.raises(RuntimeError, match=r"mask must be bool on npu:0, got Float \(make it with mask.bool\(\)"):
        torch_npu.npu_scaled_masked_softmax(x, mask.float())
    with pytest.raises(RuntimeError, match=r"H and W of x .* must be multiples of 32 in \[32, 4096\]"):
        torch_npu.npu_scaled_masked_softmax(x[..., :48], mask[..., :48])
    with pytest.raises(RuntimeError, match=r"x must be 4-D \[N, C, H, W\]"):
        torch_npu.npu_scaled_masked_softmax(x[0], mask[0])
    with pytest.raises(RuntimeError, match="mask .* must broadcast to x's shape"):
        torch_npu.npu_scaled_masked_softmax(x, mask[..., :32])


# ---- npu_transpose_batchmatmul ---------------------------------------------------------------------

def transpose_bmm_ref(x1, x2, perm_x1=(0, 1, 2), perm_x2=(0, 1, 2)):
    return (x1.float().permute(perm_x1) @ x2.float().permute(perm_x2)).permute(1, 0, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("perm_x1", [(0, 1, 2), (1, 0, 2)])
@pytest.mark.parametrize("perm_x2", [(0, 1, 2), (0, 2, 1)])
def test_transpose_batchmatmul_matches_the_composition(dtype, perm_x1, perm_x2):
    # MLA's value up-projection: heads B = 4, tokens M = 5, latent K = 64, value head N = 32.
    torch.manual_seed(0)
    x1 = torch.randn(4, 5, 64).permute(perm_x1).to(dtype)  # [B, M, K] or [M, B, K]
    x2 = (torch.randn(4, 64, 32) / 8).permute(perm_x2).to(dtype)  # [B, K, N] or [B, N, K]
    expected = transpose_bmm_ref(x1, x2, perm_x1, perm_x2)
    for device in DEVICES:
        actual = torch_npu.npu_transpose_batchmatmul(x1.to(device), x2.to(device), perm_x1=perm_x1, perm_x2=perm_x2,
                                                     perm_y=(1, 0, 2))
        assert actual.shape == (5, 4, 32) and actual.dtype == dtype and actual.is_contiguous()
        close(actual, expected, dtype)


def test_transpose_batchmatmul_split_factor_quantized_and_compiled():
    torch.manual_seed(0)
    x1, x2 = torch.randn(4, 5, 64, device="npu"), torch.randn(4, 64, 32, device="npu") / 8
    y = transpose_bmm_ref(x1.cpu(), x2.cpu())  # [5, 4, 32]
    split = torch_npu.npu_transpose_batchmatmul(x1, x2, batch_split_factor=2)
    torch.testing.assert_close(split.cpu(), y.reshape(5, 2, 64).transpose(0, 1), rtol=1e-5, atol=1e-5)
    # int8 with per-column float32 scales, packed as npu_trans_quant_param does (truncated to 19 bits, bit 46 set).
    scales = torch.rand(4 * 32) * 20 + 1
    packed = (scales.view(torch.int32).long() & 0xFFFFE000) | (1 << 46)
    truncated = (packed & 0xFFFFFFFF).int().view(torch.float32)
    quantized = torch_npu.npu_transpose_batchmatmul(x1, x2, scale=packed.npu())
    assert quantized.shape == (5, 1, 128) and quantized.dtype == torch.int8
    expected = torch.round(y.reshape(5, 1, 128) * truncated).clamp(-128, 127).to(torch.int8)
    assert (quantized.cpu().int() - expected.int()).abs().max() <= 1  # at most one step of int8 rounding
    assert (quantized.cpu() == expected).float().mean() > 0.99
    compiled = torch.compile(lambda a, b: torch_npu.npu_transpose_batchmatmul(a, b, perm_y=[1, 0, 2]),
                             fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x1, x2), torch_npu.npu_transpose_batchmatmul(x1, x2))


def test_transpose_batchmatmul_int64_scale_carries_its_offset():
    # npu_trans_quant_param(scale, offset) packs the offset into bits 37..45: it applies before rounding
    torch.manual_seed(1)
    x1, x2 = torch.randn(2, 3, 16, device="npu"), torch.randn(2, 16, 16, device="npu") / 4
    y = transpose_bmm_ref(x1.cpu(), x2.cpu())  # [3, 2, 16]
    scales, offsets = torch.rand(32) * 4 + 1, torch.randint(-30, 30, (32,)).float()
    packed = torch_npu.npu_trans_quant_param(scales.npu(), offsets.npu())
    truncated = (packed.cpu() & 0xFFFFFFFF).int().view(torch.float32)
    quantized = torch_npu.npu_transpose_batchmatmul(x1, x2, scale=packed)
    expected = torch.round(y.reshape(3, 1, 32) * truncated + offsets).clamp(-128, 127)
    assert (quantized.cpu().float() - expected).abs().max() <= 1
    assert (quantized.cpu().float() == expected).float().mean() > 0.95


def test_transpose_batchmatmul_errors():
    x1, x2 = torch.randn(4, 5, 64, device="npu"), torch.randn(4, 64, 32, device="npu")
    tbmm = torch_npu.npu_transpose_batchmatmul
    with pytest.raises(NotImplementedError, match="bias is not supported"):
        tbmm(x1, x2, bias=torch.zeros(32, device="npu"))
    with pytest.raises(ValueError, match=r"perm_y must be \[1, 0, 2\]"):
        tbmm(x1, x2, perm_y=[0, 1, 2])
    with pytest.raises(RuntimeError, match="K .* and N .* must be multiples of 16"):
        tbmm(x1[..., :60], x2[:, :60])
    with pytest.raises(RuntimeError, match="weight must have input's dtype"):
        tbmm(x1, x2.half())
    with pytest.raises(RuntimeError, match=r"weight .* must be \[B = 4, K = 64, N\]"):
        tbmm(x1, x2[:2])
    with pytest.raises(RuntimeError, match=r"with perm_x1 \[1, 0, 2\], K \* B \(65536\) must be below 65536"):
        tbmm(torch.empty(1, 64, 1024, device="npu"), torch.empty(64, 1024, 16, device="npu"), perm_x1=[1, 0, 2])
    with pytest.raises(ValueError, match="batch_split_factor .* must divide"):
        tbmm(x1, x2, batch_split_factor=3)


def test_ops_are_reachable_under_both_names():
    for name in ["npu_apply_rotary_pos_emb", "npu_mrope", "npu_interleave_rope", "npu_top_k_top_p",
                 "npu_scaled_masked_softmax", "npu_transpose_batchmatmul"]:
        assert callable(getattr(torch_npu, name))
        assert hasattr(torch.ops.npu, name)


def opcheck_cases(device):
    def t(*shape, dtype=torch.float32, grad=False):
        return torch.randn(*shape, dtype=dtype, device=device, requires_grad=grad)

    ops = torch.ops.npu
    cos16 = t(3, 1, 1, 64, dtype=torch.bfloat16)
    return [
        (ops.npu_apply_rotary_pos_emb_inplace.default, (t(1, 3, 4, 64), t(1, 3, 2, 64), t(1, 3, 1, 64),
                                                         t(1, 3, 1, 64), "BSND", "half"), {}),
        (ops.npu_apply_rotary_pos_emb.default, (t(1, 3, 4, 64), t(1, 3, 2, 64), t(1, 3, 1, 64), t(1, 3, 1, 64)), {}),
        (ops.npu_mrope.default, (torch.randint(0, 16, (3, 5), device=device), t(5, 128, grad=True),
                                 t(5, 64, grad=True), t(16, 64), 64), {"mrope_section": [8, 12, 12]}),
        (ops.npu_interleave_rope.default, (t(3, 4, 1, 64, dtype=torch.bfloat16, grad=True), cos16, cos16), {}),
        (ops.npu_top_k_top_p.default, (t(2, 50), torch.tensor([0.5, 0.9], device=device),
                                       torch.tensor([3, 5], dtype=torch.int32, device=device)), {}),
        (ops.npu_scaled_masked_softmax.default, (t(1, 2, 32, 32, grad=True),
                                                 torch.rand(1, 1, 32, 32, device=device) > 0.5, 0.5, False), {}),
        (ops.npu_transpose_batchmatmul.default, (t(5, 4, 32), t(4, 32, 16)), {"perm_x1": [1, 0, 2]}),
    ]


def test_ops_pass_opcheck():
    """Schemas (the in-place op's mutation annotations), fake tensors and AOT dispatch on the npu;
    the autograd registration check, which only runs for cpu tensors, on the cpu."""
    for op, args, kwargs in opcheck_cases("npu"):
        result = torch.library.opcheck(op, args, kwargs, test_utils=("test_schema", "test_faketensor",
                                                                     "test_aot_dispatch_dynamic"))
        assert set(result.values()) == {"SUCCESS"}, (op, result)
    for op, args, kwargs in opcheck_cases("cpu"):
        result = torch.library.opcheck(op, args, kwargs, test_utils=("test_autograd_registration",))
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_inductor_compiles_the_ops_in_one_graph():
    """The default backend (inductor) takes the in-place rope, mrope and the masked softmax in one
    graph (fake tensors, functionalization of the in-place op) and matches eager."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 4, 64, device="npu"), torch.randn(1, 4, 2, 64, device="npu")
    cos, sin = torch.randn(1, 4, 1, 64, device="npu"), torch.randn(1, 4, 1, 64, device="npu")
    mask = torch.rand(1, 1, 32, 64, device="npu") > 0.5

    def layer(q, k, cos, sin):
        q, k = q * 2, k + 1
        torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin)
        cache = torch.cat((cos[0, :, 0, :32], sin[0, :, 0, :32]), -1)
        q2, k2 = torch_npu.npu_mrope(torch.arange(4, device=q.device), q.reshape(4, -1), k.reshape(4, -1), cache, 64)
        scores = q2.reshape(1, 1, 4, 256)[:, :, :1, :64].expand(1, 1, 32, 64)
        return torch_npu.npu_scaled_masked_softmax(scores, mask, 0.5), k2

    for actual, expected in zip(torch.compile(layer, fullgraph=True)(q, k, cos, sin), layer(q, k, cos, sin)):
        torch.testing.assert_close(actual, expected)


def test_profiler_projects_the_ops_onto_a_chip():
    """Under a chip profile each op's kernel carries its projected time: memory traffic for the
    rope and softmax, the matrix unit's FLOPs for transpose_batchmatmul (more with K)."""
    code = r"""
import json, torch, torch_npu
from torch_npu.profiler import ProfilerActivity, profile
from torch_npu.profiler._analyse import projections
x, w = torch.randn(64, 16, 512).npu(), torch.randn(16, 512, 128).npu()
x4, w4 = torch.randn(64, 16, 2048).npu(), torch.randn(16, 2048, 128).npu()
q, k = torch.randn(64, 4 * 128).npu(), torch.randn(64, 2 * 128).npu()
positions, cache = torch.arange(64).npu(), torch.randn(256, 128).npu()
scores, mask = torch.randn(2, 8, 128, 128).npu(), torch.zeros(2, 1, 128, 128, dtype=torch.bool).npu()
torch.npu.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as prof:
    torch_npu.npu_transpose_batchmatmul(x, w, perm_x1=(1, 0, 2))
    torch_npu.npu_transpose_batchmatmul(x4, w4, perm_x1=(1, 0, 2))
    torch_npu.npu_mrope(positions, q, k, cache, 128)
    torch_npu.npu_scaled_masked_softmax(scores, mask, 0.5)
    torch.npu.synchronize()
print(json.dumps([[p.name, p.projected_ns] for p in projections(prof)]))
"""
    found = json.loads(last_line(run_python(code, env={"NPU_EMU_PROFILE": "ascend910b2"}, timeout=300)))
    names = [name for name, _ in found]
    assert names == ["npu_transpose_batchmatmul", "npu_transpose_batchmatmul", "npu_mrope",
                     "npu_scaled_masked_softmax"], found
    assert all(ns > 0 for _, ns in found)
    assert found[1][1] > found[0][1]  # four times the reduction dimension


def test_top_k_top_p_and_transpose_batchmatmul_gradients():
    """The inference ops differentiate as their compositions do (no silent None gradient)."""
    torch.manual_seed(0)
    logits = torch.randn(3, 40)
    p, k = torch.tensor([0.7, 0.9, 0.5]), torch.tensor([5, 40, 12], dtype=torch.int32)
    kept = torch.isfinite(top_k_top_p_ref(logits, p, k))
    ref = leaf(logits)
    (ref.masked_fill(~kept, float("-inf")).clamp(min=-1e9) * torch.arange(40.0)).sum().backward()
    x1, x2 = torch.randn(5, 4, 32), torch.randn(4, 16, 32)  # perm_x1 [1, 0, 2], perm_x2 [0, 2, 1]
    ref1, ref2 = leaf(x1), leaf(x2)
    y = transpose_bmm_ref(ref1, ref2, (1, 0, 2), (0, 2, 1))
    grad = torch.randn_like(y)
    y.backward(grad)
    for device in DEVICES:
        lg = leaf(logits, device)
        out = torch_npu.npu_top_k_top_p(lg, p.to(device), k.to(device))
        (out.clamp(min=-1e9) * torch.arange(40.0, device=device)).sum().backward()
        close(lg.grad, ref.grad, torch.float32)
        a, b = leaf(x1, device), leaf(x2, device)
        out = torch_npu.npu_transpose_batchmatmul(a, b, perm_x1=[1, 0, 2], perm_x2=[0, 2, 1])
        out.backward(grad.to(device))
        close(a.grad, ref1.grad, torch.float32)
        close(b.grad, ref2.grad, torch.float32)
        a2, b2 = leaf(x1, device), leaf(x2, device)  # the split form: the same columns, stacked
        split = torch_npu.npu_transpose_batchmatmul(a2, b2, perm_x1=[1, 0, 2], perm_x2=[0, 2, 1], batch_split_factor=4)
        split.backward(grad.reshape(5, 4, 16).transpose(0, 1).to(device))
        close(a2.grad, ref1.grad, torch.float32)
        close(b2.grad, ref2.grad, torch.float32)


def test_apply_rotary_pos_emb_defaults_to_ascends_bsh():
    q, k = torch.randn(1, 3, 2, 64), torch.randn(1, 3, 1, 64)
    cos, sin = torch.randn(1, 3, 1, 64), torch.randn(1, 3, 1, 64)
    qd, kd = torch_npu.npu_apply_rotary_pos_emb(q.npu(), k.npu(), cos.npu(), sin.npu())
    close(qd, apply_rotary_ref(q, cos, sin, "half"), torch.float32)
    assert 'str layout="BSH"' in str(torch.ops.npu.npu_apply_rotary_pos_emb.default._schema)
