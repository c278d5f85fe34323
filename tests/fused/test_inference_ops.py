"""The LLM-serving npu_* ops (csrc/ops/fused/inference.cpp) against independent plain-torch cpu
references: weight-only quantized matmul (dequantise, then matmul), OCP MX quantization, MLA's
cache preparation, ScatterNdUpdate, paged attention (SDPA over the gathered blocks), the lse merge,
MoE finalize routing and the MLA prolog; npu and cpu tensors, the errors, meta shapes and
torch.compile."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu
from helpers import last_line, run_python

DEVICES = ["npu", "cpu"]
ops = torch.ops.npu


def close(actual, expected, dtype, **kw):
    t = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    t.update(kw)
    torch.testing.assert_close(actual.float().cpu(), expected.float(), **t)


# ---- npu_weight_quant_batchmatmul -----------------------------------------------------------

def wqbmm_ref(x, w_int, scale, offset=None, bias=None, group=0):
    """Dequantise the (k, n) integer weight in x's dtype, then matmul in float32."""
    k = w_int.shape[0]
    s, o = scale.float(), None if offset is None else offset.float()
    if group:
        s = s.repeat_interleave(group, 0)[:k]
        o = None if o is None else o.repeat_interleave(group, 0)[:k]
    w = w_int.float() + (0 if o is None else o)
    w = (w * s).to(x.dtype).float()
    y = x.float() @ w
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["tensor", "channel", "group"])
def test_w8a16(device, dtype, mode):
    torch.manual_seed(0)
    m, k, n = 5, 96, 24
    x = torch.randn(m, k).to(dtype)
    w = torch.randint(-128, 128, (k, n), dtype=torch.int8)
    shape = {"tensor": (1,), "channel": (n,), "group": (3, n)}[mode]
    group = 32 if mode == "group" else 0
    scale = (torch.rand(shape) * 0.02 + 0.001).to(dtype)
    offset = torch.randn(shape).to(dtype)
    bias = torch.randn(n).to(torch.float16 if dtype == torch.float16 else torch.float32)
    y = torch_npu.npu_weight_quant_batchmatmul(x.to(device), w.to(device), scale.to(device), offset.to(device),
                                               bias=bias.to(device), antiquant_group_size=group)
    assert y.dtype == dtype and y.shape == (m, n) and y.device.type == device
    close(y, wqbmm_ref(x, w, scale, offset, bias, group), dtype)
    # the transposed weight vllm-ascend passes (weight.t() of an (n, k) tensor)
    wt = w.t().contiguous().t()
    y2 = torch_npu.npu_weight_quant_batchmatmul(x.to(device), wt.to(device), scale.to(device),
                                                antiquant_group_size=group)
    close(y2, wqbmm_ref(x, w, scale, group=group), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_w4a16_int4_packed_weight(device):
    torch.manual_seed(1)
    m, k, n = 3, 64, 16
    x = torch.randn(m, k).half()
    w = torch.randint(-8, 8, (k, n), dtype=torch.int32)
    scale = (torch.rand(2, n) * 0.1).half()
    offset = torch.randn(2, n).half()
    packed = torch_npu.npu_convert_weight_to_int4pack(w.to(device))  # (k, n / 8)
    y = torch_npu.npu_weight_quant_batchmatmul(x.to(device), packed, scale.to(device), offset.to(device),
                                               antiquant_group_size=32)
    close(y, wqbmm_ref(x, w, scale, offset, group=32), torch.float16)
    # packed along k and transposed: (k / 8, n) view of an (n, k / 8) packing
    packed_t = torch_npu.npu_convert_weight_to_int4pack(w.t().contiguous().to(device)).t()
    y2 = torch_npu.npu_weight_quant_batchmatmul(x.to(device), packed_t, scale.to(device), offset.to(device),
                                                antiquant_group_size=32)
    close(y2, wqbmm_ref(x, w, scale, offset, group=32), torch.float16)


def test_w8a16_requantized_int8_output():
    torch.manual_seed(2)
    x, w = torch.randn(4, 32).half(), torch.randint(-128, 128, (32, 8), dtype=torch.int8)
    scale = torch.full((8,), 0.01).half()
    qs, qo = torch.rand(8) * 0.5 + 0.1, torch.randn(8)
    y = torch_npu.npu_weight_quant_batchmatmul(x.npu(), w.npu(), scale.npu(), quant_scale=qs.npu(),
                                               quant_offset=qo.npu())
    assert y.dtype == torch.int8
    ref = (wqbmm_ref(x, w, scale).float() * qs + qo).round().clamp(-128, 127)
    assert (y.cpu().float() - ref).abs().max() <= 1


def test_w8a16_requantized_int64_scale_carries_its_offset():
    # npu_trans_quant_param(scale, offset) packs the offset into the int64 scale: it must apply
    torch.manual_seed(3)
    x, w = torch.randn(4, 32).half(), torch.randint(-128, 128, (32, 8), dtype=torch.int8)
    scale = torch.full((8,), 0.01).half()
    qs, qo = torch.rand(8) * 0.5 + 0.1, torch.randint(-20, 20, (8,)).float()
    packed = torch_npu.npu_trans_quant_param(qs.npu(), qo.npu())
    assert packed.dtype == torch.int64
    y = torch_npu.npu_weight_quant_batchmatmul(x.npu(), w.npu(), scale.npu(), quant_scale=packed)
    # the reference: the scale cut to FP19 as the packing does, the offset as given
    qs19 = (qs.view(torch.int32) & -8192).view(torch.float32)
    ref = (wqbmm_ref(x, w, scale).float() * qs19 + qo).round().clamp(-128, 127)
    assert (y.cpu().float() - ref).abs().max() <= 1
    assert (y.cpu().float() - (wqbmm_ref(x, w, scale).float() * qs19).round().clamp(-128, 127)).abs().max() > 1
    # an antiquant_scale with an offset packed in: refused by name
    with pytest.raises(RuntimeError, match=r"npu_weight_quant_batchmatmul .*antiquant_scale carries an offset"):
        torch_npu.npu_weight_quant_batchmatmul(x.npu(), w.npu(), torch_npu.npu_trans_quant_param(
            scale.float().npu(), qo.npu()), antiquant_offset=torch.zeros(8, dtype=torch.int32).npu())


def test_w8a16_errors():
    x, s = torch.randn(4, 32).half().npu(), torch.ones(8).half().npu()
    w = torch.randint(-8, 8, (32, 8), dtype=torch.int8).npu()
    with pytest.raises(RuntimeError, match=r"npu::npu_weight_quant_batchmatmul \(npu:0\): antiquant_scale must have"):
        torch_npu.npu_weight_quant_batchmatmul(x, w, s.float())
    with pytest.raises(RuntimeError, match="antiquant_group_size must be 0 or a multiple of 32"):
        torch_npu.npu_weight_quant_batchmatmul(x, w, s, antiquant_group_size=16)
    with pytest.raises(RuntimeError, match="bias must be float16"):
        torch_npu.npu_weight_quant_batchmatmul(x, w, s, bias=torch.ones(8).npu())
    with pytest.raises(RuntimeError, match="weight_dtype torch_npu.hifloat8 .* Ascend 950"):
        torch_npu.npu_weight_quant_batchmatmul(x, w, s, weight_dtype=290)
    with pytest.raises(RuntimeError, match=r"weight must be \(k, n\) with x's k = 32"):
        torch_npu.npu_weight_quant_batchmatmul(x, w.t(), s)


# ---- npu_dynamic_mx_quant ---------------------------------------------------------------------

FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
ELEM = {torch.float8_e4m3fn: (8, 448.0), torch.float8_e5m2: (15, 57344.0), "fp4": (2, 6.0)}


def mx_ref(x, dst, block=32, axis=-1):
    """OCP MX v1.0 in torch: X = 2^(floor(log2(amax)) - emax) per block (zero blocks: 2^-127), the
    elements x / X cast to the element format with saturation and round-to-nearest-even.
    -> (dequantised elements x / X as the format holds them, scale exponents), axis last."""
    emax, maxv = ELEM[dst]
    xf = x.float().movedim(axis, -1)
    k = xf.shape[-1]
    nb = -(-k // block)
    padded = F.pad(xf, (0, nb * block - k)).unflatten(-1, (nb, block))
    amax = padded.abs().amax(-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax)) - emax, torch.full_like(amax, -127.0)).clamp(-127, 127)
    v = padded / torch.exp2(exp).unsqueeze(-1)
    if dst == "fp4":
        a = v.abs().clamp(max=6.0)
        d = (a.unsqueeze(-1) - FP4_GRID).abs()
        best = d.min(-1, keepdim=True).values
        # ties: the even code (mantissa 0); codes are the grid's indices
        cand = (d == best) & (torch.arange(8) % 2 == 0) | ((d == best) & ((d == best).sum(-1, keepdim=True) == 1))
        code = cand.float().argmax(-1)
        q = FP4_GRID[code] * torch.sign(v)
    else:
        q = v.clamp(-maxv, maxv).to(dst).float()
    return q.flatten(-2)[..., :k], exp


def fp4_values(y):
    """float4_e2m1fn_x2 (two per byte, the first in the low nibble) as float32, last dim doubled."""
    b = y.cpu().view(torch.uint8)
    codes = torch.stack([b & 0xF, b >> 4], -1).flatten(-2).long()
    return FP4_GRID[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)


def mx_scale_exponents(s, axis, ndim):
    """The e8m0 scales as exponents, pairs unfolded, the axis last (blocks)."""
    e = s.cpu().view(torch.uint8).float() - 127          # (..., pairs, ..., 2)
    e = e.movedim(axis if axis >= 0 else axis + ndim, -2)  # (..., pairs, 2)
    return e.flatten(-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dst", [torch.float8_e4m3fn, torch.float8_e5m2, "fp4"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_dynamic_mx_quant_matches_ocp_mx(device, dst, axis):
    torch.manual_seed(3)
    x = (torch.randn(64, 96) * torch.logspace(-3, 3, 96)).bfloat16()
    x[0, :32] = 0  # a zero block
    dst_type = 296 if dst == "fp4" else dst
    y, s = torch_npu.npu_dynamic_mx_quant(x.to(device), axis=axis, dst_type=dst_type)
    assert s.dtype == torch.float8_e8m0fnu
    expect_q, expect_e = mx_ref(x, dst, axis=axis)
    k = x.shape[axis]
    pairs = -(-(-(-k // 32)) // 2)
    scale_shape = list(x.shape)
    scale_shape[axis] = pairs
    assert list(s.shape) == scale_shape + [2]
    if dst == "fp4":
        assert y.dtype == torch.float4_e2m1fn_x2 and y.shape == (64, 48)
        q = fp4_values(y).movedim(axis, -1)
    else:
        assert y.dtype == dst and y.shape == x.shape
        q = y.cpu().float().movedim(axis, -1)
    e = mx_scale_exponents(s, axis, 2)[..., :expect_e.shape[-1]]
    torch.testing.assert_close(e, expect_e, rtol=0, atol=0)
    torch.testing.assert_close(q, expect_q, rtol=0, atol=0)


def test_dynamic_mx_quant_fp4_rounding_modes():
    x = torch.tensor([[0.25, 0.75, 1.25, 2.5, 5.0, -0.25, -2.5, -5.0] + [6.0] * 24]).half()  # amax 6: scale 1
    for mode, expect in [("rint", [0, 1, 1, 2, 4, 0, -2, -4]), ("round", [0.5, 1, 1.5, 3, 6, -0.5, -3, -6]),
                         ("floor", [0, 0.5, 1, 2, 4, -0.5, -3, -6])]:
        y, s = torch_npu.npu_dynamic_mx_quant(x.npu(), round_mode=mode)
        assert fp4_values(y)[0, :8].tolist() == expect, mode
        assert s.cpu().view(torch.uint8)[0, 0, 0].item() == 127


def test_dynamic_mx_quant_torch_dtype_codes():
    x = torch.randn(4, 64).half().npu()
    for code in (torch.float4_e2m1fn_x2, 296):
        assert torch_npu.npu_dynamic_mx_quant(x, dst_type=code)[0].dtype == torch.float4_e2m1fn_x2
    for code, dt in ((292, torch.float8_e4m3fn), (291, torch.float8_e5m2)):
        assert torch_npu.npu_dynamic_mx_quant(x, dst_type=code)[0].dtype == dt


def test_dynamic_mx_quant_errors():
    x = torch.randn(4, 64).half().npu()
    with pytest.raises(RuntimeError, match="round_mode must be \"rint\" for float8"):
        torch_npu.npu_dynamic_mx_quant(x, dst_type=torch.float8_e4m3fn, round_mode="round")
    with pytest.raises(RuntimeError, match="float4_e1m2fn_x2 has no torch dtype"):
        torch_npu.npu_dynamic_mx_quant(x, dst_type=297)
    with pytest.raises(RuntimeError, match="scale_alg 1"):
        torch_npu.npu_dynamic_mx_quant(x, scale_alg=1)
    with pytest.raises(RuntimeError, match="block_size must be a multiple of 32"):
        torch_npu.npu_dynamic_mx_quant(x, block_size=16)


MX_ON_A2 = r"""
import torch, torch_npu
x = torch.randn(4, 64).half().npu()
try:
    torch_npu.npu_dynamic_mx_quant(x)
except RuntimeError as e:
    print(str(e).splitlines()[0])
"""


def test_dynamic_mx_quant_refused_on_a2_and_a3_profiles():
    for profile in ("ascend910b2", "ascend910_9391"):
        line = last_line(run_python(MX_ON_A2, env={"NPU_EMU_PROFILE": profile}))
        assert "npu::npu_dynamic_mx_quant (npu:0)" in line and "Ascend 950 op" in line and profile in line


# ---- npu_kv_rmsnorm_rope_cache -------------------------------------------------------------------

def mla_rope_ref(x, cos, sin):
    d = x.shape[-1]
    k = torch.cat([x[..., 0::2], x[..., 1::2]], -1)  # de-interleave
    rot = torch.cat([-k[..., d // 2:], k[..., :d // 2]], -1)
    return k * cos + rot * sin


def rms_ref(x, gamma, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["Norm", "PA", "PA_BNSD", "PA_NZ"])
def test_kv_rmsnorm_rope_cache(device, mode):
    torch.manual_seed(4)
    B, S, Dv, Dk, dt = 2, 3, 32, 16, torch.bfloat16
    kv = torch.randn(B, 1, S, Dv + Dk).to(dt)
    gamma = torch.rand(Dv).to(dt) + 0.5
    cos, sin = torch.rand(B, 1, S, Dk).to(dt), torch.rand(B, 1, S, Dk).to(dt)
    c_ref = rms_ref(kv[..., :Dv].float(), gamma.float(), 1e-5).to(dt)
    k_ref = mla_rope_ref(kv[..., Dv:].float(), cos.float(), sin.float()).to(dt)
    if mode == "Norm":
        kc, cc = torch.zeros(B, 1, 8, Dk, dtype=dt), torch.zeros(B, 1, 8, Dv, dtype=dt)
        index = torch.tensor([[5, 0, -1], [2, 7, 3]])
    else:
        blocks, bs = 4, 4
        shapes = {"PA": lambda d: (blocks, bs, 1, d), "PA_BNSD": lambda d: (blocks, 1, bs, d),
                  "PA_NZ": lambda d: (blocks, d // 16, bs, 16)}[mode]
        kc, cc = torch.zeros(shapes(Dk), dtype=dt), torch.zeros(shapes(Dv), dtype=dt)
        index = torch.tensor([9, 0, -1, 15, 4, 6])
    kc_d, cc_d = kc.to(device), cc.to(device)
    out = torch_npu.npu_kv_rmsnorm_rope_cache(kv.to(device), gamma.to(device), cos.to(device), sin.to(device),
                                              index.to(device), kc_d, cc_d, cache_mode=mode, is_output_kv=True)
    assert out[0] is kc_d and out[1] is cc_d
    close(out[2], k_ref, dt)
    close(out[3], c_ref, dt)
    # the caches, read back per token
    for b in range(B):
        for s in range(S):
            slot = index.view(B, S)[b, s].item()
            if slot < 0:
                continue
            if mode == "Norm":
                got_k, got_c = kc_d[b, 0, slot], cc_d[b, 0, slot]
            elif mode == "PA":
                got_k, got_c = kc_d[slot // 4, slot % 4, 0], cc_d[slot // 4, slot % 4, 0]
            elif mode == "PA_BNSD":
                got_k, got_c = kc_d[slot // 4, 0, slot % 4], cc_d[slot // 4, 0, slot % 4]
            else:
                got_k, got_c = kc_d[slot // 4, :, slot % 4].reshape(-1), cc_d[slot // 4, :, slot % 4].reshape(-1)
            close(got_k, k_ref[b, 0, s], dt)
            close(got_c, c_ref[b, 0, s], dt)
    written = 5  # every other slot stays zero
    assert (kc_d.cpu().float().abs().sum(-1) > 0).sum() == written


def test_kv_rmsnorm_rope_cache_errors():
    kv, g = torch.randn(1, 1, 2, 48).npu(), torch.ones(32).npu()
    c = torch.ones(1, 1, 2, 16).npu()
    kc, cc = torch.zeros(2, 4, 1, 16).npu(), torch.zeros(2, 4, 1, 32).npu()
    idx = torch.tensor([0, 1]).npu()
    with pytest.raises(RuntimeError, match="cache_mode \"PA_BLK_NZ\" .* not supported"):
        torch_npu.npu_kv_rmsnorm_rope_cache(kv, g, c, c, idx, kc, cc, cache_mode="PA_BLK_NZ")
    with pytest.raises(RuntimeError, match="index must be int64"):
        torch_npu.npu_kv_rmsnorm_rope_cache(kv, g, c, c, idx.int(), kc, cc, cache_mode="PA")
    with pytest.raises(RuntimeError, match="int8 caches"):
        torch_npu.npu_kv_rmsnorm_rope_cache(kv, g, c, c, idx, kc, cc, cache_mode="PA", c_kv_scale=torch.ones(32).npu(),
                                            k_rope_scale=torch.ones(16).npu())
    with pytest.raises(RuntimeError, match=r"index\[1\] = 99 is outside the cache"):
        torch_npu.npu_kv_rmsnorm_rope_cache(kv, g, c, c, torch.tensor([0, 99]).npu(), kc, cc, cache_mode="PA")


# ---- npu_scatter_nd_update(_) -----------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_scatter_nd_update(device):
    torch.manual_seed(5)
    cache = torch.randn(6, 4, 3)
    idx = torch.tensor([[4], [1]], dtype=torch.int32)   # rows, as vllm-ascend's slot scatter
    upd = torch.randn(2, 4, 3)
    ref = cache.clone()
    ref[4], ref[1] = upd[0], upd[1]
    out = torch_npu.npu_scatter_nd_update(cache.to(device), idx.to(device), upd.to(device))
    assert torch.equal(out.cpu(), ref)
    idx2 = torch.tensor([[0, 1], [5, 3]])            # depth 2
    upd2 = torch.randn(2, 3)
    ref2 = cache.clone()
    ref2[0, 1], ref2[5, 3] = upd2[0], upd2[1]
    target = cache.clone().to(device)
    r = torch_npu.npu_scatter_nd_update_(target, idx2.to(device), upd2.to(device))
    assert r is target and torch.equal(target.cpu(), ref2)
    assert target._version == 1  # as aten's in-place ops
    # a view of a larger cache (kv_cache.view(-1, D)), updated in place
    big = torch.zeros(2, 6, 8).to(device)
    torch_npu.npu_scatter_nd_update_(big.view(-1, 8), torch.tensor([[7]]).to(device), torch.ones(1, 8).to(device))
    assert big.cpu()[1, 1].sum() == 8 and big.cpu().sum() == 8


def test_scatter_nd_update_errors():
    x = torch.zeros(4, 3).npu()
    with pytest.raises(RuntimeError, match=r"updates must have shape indices.shape\[:-1\] \+ self.shape\[1:\]"):
        torch_npu.npu_scatter_nd_update(x, torch.tensor([[1]]).npu(), torch.ones(1, 4).npu())
    with pytest.raises(RuntimeError, match=r"indices\[0\]\[0\] = 9 is outside self's dim 0"):
        torch_npu.npu_scatter_nd_update_(x, torch.tensor([[9]]).npu(), torch.ones(1, 3).npu())
    with pytest.raises(RuntimeError, match="indices must be int32 or int64"):
        torch_npu.npu_scatter_nd_update(x, torch.tensor([[1.0]]).npu(), torch.ones(1, 3).npu())


# ---- atb::_npu_paged_attention --------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_paged_attention_matches_sdpa(device, dtype):
    torch.manual_seed(6)
    T, H, KVH, D, blocks, bs = 3, 4, 2, 16, 10, 4
    q = torch.randn(T, H, D).to(dtype)
    kc, vc = torch.randn(blocks, bs, KVH, D).to(dtype), torch.randn(blocks, bs, KVH, D).to(dtype)
    table = torch.tensor([[3, 7, 1], [0, 0, 0], [9, 2, 5]], dtype=torch.int32)
    lens = torch.tensor([10, 1, 12], dtype=torch.int32)  # host tensor, as vllm-ascend passes it
    out = torch.empty(T, H, D, dtype=dtype).to(device)
    scale = 1 / math.sqrt(D)
    torch_npu._npu_paged_attention(q.to(device), kc.to(device), vc.to(device), KVH, H, scale,
                                   table.to(device), lens, out)
    for i in range(T):
        ids = table[i].long()
        k = kc[ids].reshape(-1, KVH, D)[:lens[i]].float().transpose(0, 1).repeat_interleave(H // KVH, 0)
        v = vc[ids].reshape(-1, KVH, D)[:lens[i]].float().transpose(0, 1).repeat_interleave(H // KVH, 0)
        ref = F.scaled_dot_product_attention(q[i].float().unsqueeze(1), k, v, scale=scale).squeeze(1)
        close(out[i], ref, dtype)
    ws = torch_npu._npu_paged_attention_get_workspace(q.to(device), kc.to(device), vc.to(device), KVH, H, scale,
                                                      table.to(device), lens, out)
    assert ws.dtype == torch.uint8
    torch_npu._npu_paged_attention(q.to(device), kc.to(device), vc.to(device), KVH, H, scale, table.to(device),
                                   lens.to(device), out, workspace=ws)  # context_lens on the device too


@pytest.mark.parametrize("device", DEVICES)
def test_paged_attention_transposed_block_table(device):
    # a dense non-contiguous table (the transpose of a (max_blocks, T) int32 tensor), -1 past each row's
    # blocks: its rows are read (not its memory in order, which puts -1 among row 2's blocks)
    torch.manual_seed(7)
    T, H, KVH, D, blocks, bs = 3, 2, 1, 8, 10, 4
    q = torch.randn(T, H, D)
    kc, vc = torch.randn(blocks, bs, KVH, D), torch.randn(blocks, bs, KVH, D)
    table = torch.tensor([[3, 7, -1], [0, -1, -1], [9, 2, 5]], dtype=torch.int32).t().contiguous().t()
    assert table.stride() == (1, 3)
    lens = torch.tensor([6, 2, 12], dtype=torch.int32)
    out = torch.empty(T, H, D).to(device)
    scale = 1 / math.sqrt(D)
    torch_npu._npu_paged_attention(q.to(device), kc.to(device), vc.to(device), KVH, H, scale,
                                   table.to(device), lens, out)
    for i in range(T):
        ids = table[i, :(int(lens[i]) + bs - 1) // bs].long()
        k = kc[ids].reshape(-1, KVH, D)[:lens[i]].transpose(0, 1).repeat_interleave(H // KVH, 0)
        v = vc[ids].reshape(-1, KVH, D)[:lens[i]].transpose(0, 1).repeat_interleave(H // KVH, 0)
        ref = F.scaled_dot_product_attention(q[i].unsqueeze(1), k, v, scale=scale).squeeze(1)
        close(out[i], ref, torch.float32)


def test_paged_attention_errors():
    q, kc = torch.randn(1, 4, 8).npu(), torch.randn(2, 4, 2, 8).npu()
    table, lens = torch.zeros(1, 2, dtype=torch.int32).npu(), torch.tensor([3], dtype=torch.int32)
    out = torch.empty(1, 4, 8).npu()
    with pytest.raises(RuntimeError, match=r"npu::_npu_paged_attention \(npu:0\): num_heads \(4\) must be a multiple"):
        torch_npu._npu_paged_attention(q, kc, kc, 3, 4, 1.0, table, lens, out)
    with pytest.raises(RuntimeError, match=r"context_lens\[0\] = 30 must be in \[0, max_blocks"):
        torch_npu._npu_paged_attention(q, kc, kc, 2, 4, 1.0, table, torch.tensor([30], dtype=torch.int32), out)
    with pytest.raises(RuntimeError, match="block_table must be int32"):
        torch_npu._npu_paged_attention(q, kc, kc, 2, 4, 1.0, table.long(), lens, out)


# ---- npu_attention_update ------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_update_merges_by_lse(device, dtype):
    torch.manual_seed(7)
    rows, d, sp = 6, 16, 3
    # split one softmax over 3 chunks of keys: the merge must equal attention over all keys
    q, k, v = torch.randn(rows, d), torch.randn(sp * 5, d), torch.randn(sp * 5, d)
    lse, outs = [], []
    for i in range(sp):
        s = q @ k[5 * i:5 * i + 5].t()
        lse.append(torch.logsumexp(s, -1))
        outs.append((torch.softmax(s, -1) @ v[5 * i:5 * i + 5]).to(dtype))
    full = torch.softmax(q @ k.t(), -1) @ v
    out, lse_out = torch_npu.npu_attention_update([t.to(device) for t in lse], [t.to(device) for t in outs], 1)
    assert out.dtype == dtype and lse_out.dtype == torch.float32
    close(out, full, dtype)
    close(lse_out, torch.logsumexp(q @ k.t(), -1), torch.float32, atol=1e-4, rtol=1e-4)
    out0, lse0 = torch_npu.npu_attention_update([t.to(device) for t in lse], [t.to(device) for t in outs], 0)
    close(out0, full, dtype)
    assert lse0.numel() == 0


def test_attention_update_errors():
    with pytest.raises(RuntimeError, match="head_dim must be a multiple of 8"):
        torch_npu.npu_attention_update([torch.zeros(4).npu()], [torch.zeros(4, 12).npu()], 0)
    with pytest.raises(RuntimeError, match=r"lse\[0\] must be float32"):
        torch_npu.npu_attention_update([torch.zeros(4).half().npu()], [torch.zeros(4, 8).npu()], 0)


# ---- npu_moe_finalize_routing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_moe_finalize_routing(device):
    torch.manual_seed(8)
    n, k, h, e = 5, 2, 8, 3
    rows = torch.randn(n * k, h)
    dst = torch.randperm(n * k).int()
    dst[3] = -1  # a dropped pair
    scales, skip1, skip2 = torch.rand(n, k), torch.randn(n, h), torch.randn(n, h)
    bias, experts = torch.randn(e, h), torch.randint(0, e, (n, k), dtype=torch.int32)
    ref = skip1 + skip2
    for i in range(n):  # the doc's loop
        for j in range(k):
            r = dst[j * n + i].item()
            if r >= 0:
                ref[i] += scales[i, j] * (rows[r] + bias[experts[i, j]])
    args = [t.to(device) for t in (rows, skip1, skip2, bias, scales, dst, experts)]
    out = torch_npu.npu_moe_finalize_routing(*args)
    close(out, ref, torch.float32)
    bare = torch_npu.npu_moe_finalize_routing(args[0], None, None, None, args[4], args[5], None)
    ref2 = torch.stack([sum(scales[i, j] * rows[dst[j * n + i]] for j in range(k) if dst[j * n + i] >= 0)
                        for i in range(n)])
    close(bare, ref2, torch.float32)
    with pytest.raises(RuntimeError, match="drop_pad_mode 1 .* not supported"):
        torch_npu.npu_moe_finalize_routing(*args, drop_pad_mode=1)
    with pytest.raises(RuntimeError, match="bias needs export_for_source_row"):
        torch_npu.npu_moe_finalize_routing(*args[:6], None)


# ---- npu_mla_prolog_v2 / v3 ------------------------------------------------------------------------------------

def mla_inputs(dt=torch.bfloat16, T=3):
    torch.manual_seed(9)
    He, Hcq, N, D, Dr, Hckv = 32, 24, 2, 8, 8, 16
    w = lambda *s: (torch.randn(*s) / math.sqrt(s[-2] if len(s) > 1 else 1)).to(dt)  # noqa: E731
    return dict(token_x=torch.randn(T, He).to(dt), weight_dq=w(He, Hcq), weight_uq_qr=w(Hcq, N * (D + Dr)),
                weight_uk=w(N, D, Hckv), weight_dkv_kr=w(He, Hckv + Dr), rmsnorm_gamma_cq=(torch.rand(Hcq) + .5).to(dt),
                rmsnorm_gamma_ckv=(torch.rand(Hckv) + .5).to(dt), rope_sin=torch.rand(T, Dr).to(dt),
                rope_cos=torch.rand(T, Dr).to(dt)), (N, D, Dr, Hckv)


def mla_ref(i, dims, eps=1e-5):
    N, D, Dr, Hckv = dims
    dt = i["token_x"].dtype
    f = lambda t: t.float()  # noqa: E731
    r = lambda t: t.to(dt).float()  # noqa: E731
    x = f(i["token_x"])
    cq = r(rms_ref(r(x @ f(i["weight_dq"])), f(i["rmsnorm_gamma_cq"]), eps))
    qcr = r(cq @ f(i["weight_uq_qr"])).view(-1, N, D + Dr)
    qn = torch.einsum("tnd,ndh->tnh", qcr[..., :D], f(i["weight_uk"]))
    qr = mla_rope_ref(qcr[..., D:], f(i["rope_cos"]).unsqueeze(1), f(i["rope_sin"]).unsqueeze(1))
    kvkr = r(x @ f(i["weight_dkv_kr"]))
    kc = rms_ref(kvkr[:, :Hckv], f(i["rmsnorm_gamma_ckv"]), eps)
    kr = mla_rope_ref(kvkr[:, Hckv:], f(i["rope_cos"]), f(i["rope_sin"]))
    return qn, qr, kc, kr, cq


@pytest.mark.parametrize("device", DEVICES)
def test_mla_prolog_v2_and_v3(device):
    i, dims = mla_inputs()
    N, D, Dr, Hckv = dims
    qn, qr, kc, kr, cq = mla_ref(i, dims)
    args = [t.to(device) for t in i.values()]
    slots = torch.tensor([5, 0, 9])
    kv = torch.zeros(3, 4, 1, Hckv, dtype=torch.bfloat16).to(device)
    krc = torch.zeros(3, 4, 1, Dr, dtype=torch.bfloat16).to(device)
    q, q_rope, kv_out, kr_out, dq = torch_npu.npu_mla_prolog_v2(*args, slots.to(device), kv, krc)
    assert kv_out is kv and kr_out is krc and q.shape == (3, N, Hckv) and q_rope.shape == (3, N, Dr)
    close(q, qn, torch.bfloat16)
    close(q_rope, qr, torch.bfloat16)
    for t, s in enumerate(slots.tolist()):
        close(kv[s // 4, s % 4, 0], kc[t], torch.bfloat16)
        close(krc[s // 4, s % 4, 0], kr[t], torch.bfloat16)
    kv3, kr3 = torch.zeros_like(kv), torch.zeros_like(krc)
    q3, qr3, dq3, qnorm, dqn = torch_npu.npu_mla_prolog_v3(*args, kv3, kr3, cache_index=slots.to(device),
                                                           query_norm_flag=True)
    assert torch.equal(q3.cpu(), q.cpu()) and torch.equal(kv3.cpu(), kv.cpu()) and torch.equal(kr3.cpu(), krc.cpu())
    close(qnorm, cq, torch.bfloat16)
    kv4, kr4 = torch.zeros_like(kv), torch.zeros_like(krc)
    outs = torch_npu.npu_mla_prolog_v3_functional(*args, kv4, kr4, cache_index=slots.to(device))
    assert len(outs) == 7 and kv4.abs().sum() == 0 and torch.equal(outs[5].cpu(), kv.cpu())


def test_mla_prolog_errors():
    i, _ = mla_inputs(T=2)
    args = [t.npu() for t in i.values()]
    kv, kr = torch.zeros(2, 4, 1, 16, dtype=torch.bfloat16).npu(), torch.zeros(2, 4, 1, 8, dtype=torch.bfloat16).npu()
    with pytest.raises(RuntimeError, match="dequant_scale_x belongs to the quantized MLA prolog"):
        torch_npu.npu_mla_prolog_v3(*args, kv, kr, dequant_scale_x=torch.ones(2, 1).npu())
    with pytest.raises(RuntimeError, match="kv_cache_quant_mode 1"):
        torch_npu.npu_mla_prolog_v3(*args, kv, kr, kv_cache_quant_mode=1)
    with pytest.raises(RuntimeError, match="cache_mode \"PA_NZ\" is not supported"):
        torch_npu.npu_mla_prolog_v3(*args, kv, kr, cache_mode="PA_NZ")
    with pytest.raises(RuntimeError, match="weight_uq_qr must be"):
        torch_npu.npu_mla_prolog_v3(*args[:2], args[2][:, :-1], *args[3:], kv, kr)


# ---- meta shapes, fake tensors, torch.compile -----------------------------------------------------------------

def test_meta_shapes():
    m = dict(device="meta")
    y = ops.npu_weight_quant_batchmatmul(torch.empty(3, 64, dtype=torch.half, **m),
                                         torch.empty(64, 4, dtype=torch.int32, **m),
                                         torch.empty(32, dtype=torch.half, **m))
    assert y.shape == (3, 32) and y.dtype == torch.half
    y, s = ops.npu_dynamic_mx_quant(torch.empty(2, 5, 200, dtype=torch.bfloat16, **m), axis=1)
    assert y.shape == (2, 5, 100) and y.dtype == torch.float4_e2m1fn_x2
    assert s.shape == (2, 1, 200, 2) and s.dtype == torch.float8_e8m0fnu
    y, s = ops.npu_dynamic_mx_quant(torch.empty(4, 160, dtype=torch.half, **m), dst_type=torch.float8_e5m2)
    assert y.shape == (4, 160) and s.shape == (4, 3, 2)
    out, lse = ops.npu_attention_update([torch.empty(6, **m)] * 2, [torch.empty(6, 16, **m)] * 2, 1)
    assert out.shape == (6, 16) and lse.shape == (6,)
    r = ops.npu_moe_finalize_routing(torch.empty(8, 4, **m), None, None, None, torch.empty(4, 2, **m),
                                     torch.empty(8, dtype=torch.int32, **m), None)
    assert r.shape == (4, 4)
    i, (N, D, Dr, Hckv) = mla_inputs()
    outs = ops.npu_mla_prolog_v3(*[t.to("meta") for t in i.values()],
                                 torch.empty(2, 4, 1, Hckv, dtype=torch.bfloat16, **m),
                                 torch.empty(2, 4, 1, Dr, dtype=torch.bfloat16, **m))
    assert [tuple(o.shape) for o in outs] == [(3, N, Hckv), (3, N, Dr), (0,), (0,), (0,)]
    with pytest.raises(RuntimeError, match=r"npu::npu_scatter_nd_update \(meta\)"):
        ops.npu_scatter_nd_update(torch.empty(4, 3, **m), torch.empty(2, 1, dtype=torch.long, **m),
                                  torch.empty(2, 4, **m))


def compile_cases():
    torch.manual_seed(0)
    x, s = torch.randn(4, 32).half().npu(), torch.rand(8).half().npu()
    w = torch.randint(-8, 8, (32, 8), dtype=torch.int8).npu()
    cache = torch.zeros(6, 8).npu()
    q, kc = torch.randn(2, 4, 8).npu(), torch.randn(4, 4, 2, 8).npu()
    table, lens = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32).npu(), torch.tensor([5, 8], dtype=torch.int32).npu()

    def scatter_inplace():
        c = cache.clone()
        torch_npu.npu_scatter_nd_update_(c, torch.tensor([[2]]).npu(), torch.ones(1, 8).npu())
        return c

    def paged():
        out = torch.empty(2, 4, 8).npu()
        torch_npu._npu_paged_attention(q, kc, kc, 2, 4, 0.5, table, lens, out)
        return out

    kv, c = torch.randn(1, 1, 2, 48).npu(), torch.rand(1, 1, 2, 16).npu()

    def kv_cache():  # the caches' update survives functionalization
        kcache, ccache = torch.zeros(2, 4, 1, 16).npu(), torch.zeros(2, 4, 1, 32).npu()
        outs = torch_npu.npu_kv_rmsnorm_rope_cache(kv, torch.ones(32).npu(), c, c, torch.tensor([1, 6]).npu(),
                                                   kcache, ccache, cache_mode="PA")
        return kcache + 0, ccache + 0, outs[2], outs[3]

    return {
        "wqbmm": lambda: torch_npu.npu_weight_quant_batchmatmul(x, w, s),
        "mx_quant": lambda: torch_npu.npu_dynamic_mx_quant(x, dst_type=torch.float8_e4m3fn),
        "scatter": lambda: torch_npu.npu_scatter_nd_update(cache, torch.tensor([[1]]).npu(), torch.ones(1, 8).npu()),
        "scatter_inplace": scatter_inplace,
        "paged": paged,
        "update": lambda: torch_npu.npu_attention_update([s.float()[:4]] * 2, [x.float()[:, :8]] * 2, 1),
        "kv_cache": kv_cache,
    }


@pytest.mark.parametrize("name", ["wqbmm", "mx_quant", "scatter", "scatter_inplace", "paged", "update", "kv_cache"])
def test_compile_traces_and_matches_eager(name):
    call = compile_cases()[name]
    torch._dynamo.reset()
    eager = call()
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)()
    flat_e = eager if isinstance(eager, (tuple, list)) else [eager]
    flat_c = compiled if isinstance(compiled, (tuple, list)) else [compiled]
    for e, c in zip(flat_e, flat_c):
        assert e.shape == c.shape and e.dtype == c.dtype
        assert torch.equal(e.cpu().view(torch.uint8) if e.element_size() == 1 else e.cpu(),
                           c.cpu().view(torch.uint8) if c.element_size() == 1 else c.cpu())
    if name in ("kv_cache", "scatter_inplace"):  # the in-place update is in the compiled graph
        assert flat_c[0].abs().sum() > 0


def test_opcheck_fake_tensors():
    x, s = torch.randn(4, 32).half().npu(), torch.rand(8).half().npu()
    w = torch.randint(-8, 8, (32, 8), dtype=torch.int8).npu()
    q, kc = torch.randn(2, 4, 8).npu(), torch.randn(4, 4, 2, 8).npu()
    table, lens = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32).npu(), torch.tensor([5, 8], dtype=torch.int32)
    i, (N, D, Dr, Hckv) = mla_inputs()
    mla = [t.npu() for t in i.values()] + [torch.zeros(2, 4, 1, Hckv, dtype=torch.bfloat16).npu(),
                                           torch.zeros(2, 4, 1, Dr, dtype=torch.bfloat16).npu()]
    cases = [
        (ops.npu_weight_quant_batchmatmul.default, (x, w, s), {}),
        (ops.npu_dynamic_mx_quant.default, (x,), dict(dst_type=296)),
        (ops.npu_scatter_nd_update.default, (torch.zeros(6, 8).npu(), torch.tensor([[1]]).npu(),
                                             torch.ones(1, 8).npu()), {}),
        (ops._npu_scatter_nd_update_inplace.default, (torch.zeros(6, 8).npu(), torch.tensor([[1]]).npu(),
                                                      torch.ones(1, 8).npu()), {}),
        (torch.ops.atb._npu_paged_attention.default, (q, kc, kc, 2, 4, 0.5, table, lens, torch.empty(2, 4, 8).npu()),
         {}),
        (ops.npu_attention_update.default, ([torch.randn(4).npu()] * 2, [torch.randn(4, 8).npu()] * 2, 1), {}),
        (ops.npu_moe_finalize_routing.default, (torch.randn(8, 4).npu(), None, None, None, torch.rand(4, 2).npu(),
                                                torch.randperm(8).int().npu(), None), {}),
        (ops.npu_mla_prolog_v3.default, tuple(mla), dict(cache_index=torch.tensor([0, 3, 6]).npu())),
        (ops._npu_kv_rmsnorm_rope_cache_inplace.default,
         (torch.randn(1, 1, 2, 48).npu(), torch.ones(32).npu(), torch.rand(1, 1, 2, 16).npu(),
          torch.rand(1, 1, 2, 16).npu(), torch.tensor([1, 6]).npu(), torch.zeros(2, 4, 1, 16).npu(),
          torch.zeros(2, 4, 1, 32).npu(), None, None, None, None, None, 1e-5, "PA", False), {}),
    ]
    for op, args, kwargs in cases:
        result = torch.library.opcheck(op, args, kwargs, test_utils=("test_schema", "test_faketensor"))
        assert set(result.values()) == {"SUCCESS"}, (op, result)
