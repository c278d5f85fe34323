"""The LLM-serving ops of vllm-ascend and MindSpeed: weight-only quantized matmul, MX quantization,
MLA's cache preparation, paged decode attention, the merge of partial attention and of MoE rows.

``torch_npu.<name>`` and ``torch.ops.npu.<name>`` (the paged attention: ``torch.ops.atb.<name>``,
as on Ascend) with the Ascend adapter's signatures, defaults and result tuples. The schemas, checks
and meta kernels are in csrc/ops/fused/inference.cpp, the kernels in
csrc/ops/host/fused/inference_kernels.cpp. None of these ops has a backward on Ascend; here neither.

Dtype arguments (``dst_type``, ``weight_dtype``) are ints in Ascend's schemas: a torch.dtype passes
as itself, and torch_npu's integer codes (256 + the ACL enum, e.g. 296 for float4_e2m1fn_x2) too.

- ``npu_weight_quant_batchmatmul``: ``x @ ((weight + antiquant_offset) * antiquant_scale) + bias``
  with an int8 (W8A16) or int32-packed int4 (W4A16) weight; per tensor, channel or group scales.
- ``npu_dynamic_mx_quant``: OCP MX blocks (float8 e4m3 / e5m2, float4 e2m1) with float8_e8m0
  scales. An Ascend 950 op: the A2/A3/310P/910 profiles refuse it, as those chips do.
- ``npu_kv_rmsnorm_rope_cache``: DeepSeek MLA's key prep, written to the caches in place.
- ``npu_scatter_nd_update`` / ``npu_scatter_nd_update_``: ``self[tuple(indices[i])] = updates[i]``.
- ``_npu_paged_attention``: decode attention over a paged KV cache into ``out``.
- ``npu_attention_update``: the merge of partial attention outputs by their log-sum-exp.
- ``npu_moe_finalize_routing``: the weighted sum of the experts' rows back to token order.
- ``npu_mla_prolog_v2`` / ``_v3`` / ``_v3_functional``: MLA's query and key preprocessing (float).
"""
import torch

__all__ = [
    "npu_weight_quant_batchmatmul",
    "npu_dynamic_mx_quant",
    "npu_kv_rmsnorm_rope_cache",
    "npu_scatter_nd_update",
    "npu_scatter_nd_update_",
    "_npu_paged_attention",
    "_npu_paged_attention_get_workspace",
    "npu_attention_update",
    "npu_moe_finalize_routing",
    "npu_mla_prolog_v2",
    "npu_mla_prolog_v3",
    "npu_mla_prolog_v3_functional",
]

_ops = torch.ops.npu
_atb = torch.ops.atb


def npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                 quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
                                 weight_dtype=None):
    """``x @ ((weight + antiquant_offset) * antiquant_scale) (+ bias)`` in x's dtype; with
    ``quant_scale``: ``round(y * quant_scale + quant_offset)`` as int8. ``weight`` is int8 (k, n) or
    int32 holding eight int4 values (``npu_convert_weight_to_int4pack``)."""
    return _ops.npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset, quant_scale,
                                             quant_offset, bias, antiquant_group_size, inner_precise,
                                             weight_dtype)


def npu_dynamic_mx_quant(input, *, axis=-1, round_mode="rint", dst_type=296, block_size=32, scale_alg=0,
                         dst_type_max=0.0, max_low_bound=0.0):
    """``(y, mxscale)``: blocks of ``block_size`` values along ``axis`` share the scale
    ``2^(floor(log2(amax)) - emax)`` (float8_e8m0fnu, pairs of blocks in the last dim);
    ``y = cast(x / scale)`` saturated. ``dst_type``: torch.float8_e4m3fn, torch.float8_e5m2 or
    296 (torch_npu.float4_e2m1fn_x2: two values per byte, the first in the low nibble)."""
    return _ops.npu_dynamic_mx_quant(input, axis=axis, round_mode=round_mode, dst_type=dst_type,
                                     block_size=block_size, scale_alg=scale_alg, dst_type_max=dst_type_max,
                                     max_low_bound=max_low_bound)


def npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                              c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5,
                              cache_mode="Norm", is_output_kv=False):
    """``(k_cache, ckv_cache, k_rope, c_kv)``: ``c_kv = RMSNorm(kv[..., :Dv]) * gamma`` and
    ``k_rope = RoPE(kv[..., Dv:])`` (MLA's de-interleaved rotate-half) written to the caches (updated
    in place) at ``index`` (-1 skips a token)."""
    return _ops.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                          k_rope_scale=k_rope_scale, c_kv_scale=c_kv_scale,
                                          k_rope_offset=k_rope_offset, c_kv_offset=c_kv_offset, v=v,
                                          epsilon=epsilon, cache_mode=cache_mode, is_output_kv=is_output_kv)


def npu_scatter_nd_update(self, indices, updates):
    """A copy of ``self`` with ``self[tuple(indices[i])] = updates[i]`` (TensorFlow's ScatterNdUpdate)."""
    return _ops.npu_scatter_nd_update(self, indices, updates)


def npu_scatter_nd_update_(self, indices, updates):
    """``self[tuple(indices[i])] = updates[i]`` in place; returns ``self``."""
    return _ops.npu_scatter_nd_update_(self, indices, updates)


def _npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                         context_lens, out, workspace=None):
    """Decode attention into ``out`` (tokens, heads, head_size_v): token ``i`` attends to the first
    ``context_lens[i]`` cached positions of its blocks ``block_table[i]``; query head h reads kv head
    ``h // (num_heads // num_kv_heads)``. ``context_lens`` is a host (cpu) int32 tensor, as on Ascend."""
    return _atb._npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                                     block_table, context_lens, out, workspace=workspace)


def _npu_paged_attention_get_workspace(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                                       block_table, context_lens, out):
    """The uint8 workspace ``_npu_paged_attention`` takes: empty here (the kernel needs none)."""
    return _atb._npu_paged_attention_get_workspace(query, key_cache, value_cache, num_kv_heads, num_heads,
                                                   scale_value, block_table, context_lens, out)


def npu_attention_update(lse, local_out, update_type):
    """``(out, lse_out)``: ``out = sum_i local_out[i] * exp(lse[i] - lse_out)`` with
    ``lse_out = logsumexp_i(lse[i])`` (float32; empty unless ``update_type == 1``)."""
    return _ops.npu_attention_update(list(lse), list(local_out), update_type)


def npu_moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                             export_for_source_row, drop_pad_mode=0, k=1):
    """``out[i] = skip1[i] + skip2[i] + sum_j scales[i, j] * (rows[dst[j * n + i]] + bias[expert[i, j]])``
    (a -1 destination contributes nothing)."""
    return _ops.npu_moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales,
                                         expanded_src_to_dst_row, export_for_source_row, drop_pad_mode, k)


def npu_mla_prolog_v2(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                      rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, **kwargs):
    """``(query, query_rope, kv_cache, kr_cache, dequant_scale_q_nope)``: MLA's preprocessing, the
    caches updated in place at ``cache_index``."""
    return _ops.npu_mla_prolog_v2(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                                  rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, **kwargs)


def npu_mla_prolog_v3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                      rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, **kwargs):
    """``(query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm)``; the caches
    updated in place at ``cache_index`` (keyword)."""
    return _ops.npu_mla_prolog_v3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                                  rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, **kwargs)


def npu_mla_prolog_v3_functional(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                                 rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, **kwargs):
    """v3's five results and the updated copies of the two caches (the inputs are left alone)."""
    return _ops.npu_mla_prolog_v3_functional(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr,
                                             rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache,
                                             kr_cache, **kwargs)
