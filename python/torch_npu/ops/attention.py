"""The attention operators of LLM serving, with the Ascend adapter's signatures.

Code written for the Ascend adapter (vllm-ascend, MindSpeed) calls them directly;
here they are C++ operators (csrc/ops/fused/attention_ops.cpp) for npu and cpu
tensors, ``torch.ops.npu.<name>``, with meta kernels so torch.compile traces them.
``torch_npu.<name>`` calls the operator. They compute in float32 and take the
layouts, masks, sparse modes, GQA and paged KV caches the Ascend operators take;
quantization options are refused by name. None has a backward (inference
operators), except ``npu_fusion_attention_grad``, which is one.

Conventions shared by the attention operators:

- ``input_layout``: "BSH" (H = heads * D), "BSND", "BNSD", "BNSD_BSND" (BNSD in,
  BSND out) or "TND" (sequences packed along T; the actual lengths are then their
  cumulative ends). ``num_heads`` / ``num_key_value_heads`` (0: as many as query):
  GQA, query heads ``n`` use kv head ``n // (num_heads // num_key_value_heads)``.
- ``atten_mask``: bool/int8/uint8, nonzero where a query must *not* see a key.
- ``sparse_mode``: 0 the mask (and, with a mask, the band of ``pre_tokens`` before
  and ``next_tokens`` after the diagonal), 1 the mask alone, 2 causal top-left,
  3 causal bottom-right, 4 the band aligned bottom-right; 2-4 take the compressed
  2048x2048 pattern as ``atten_mask``, as on Ascend.
- Paged KV cache: ``block_table`` [B, max blocks] int32 and ``block_size``; key and
  value are then the cache blocks, [blocks, block_size, H] (or [blocks, kv heads,
  block_size, D] with layout BNSD or TND), and the key/value lengths are required
  (per sequence, also with TND, where the query lengths are cumulative: vllm-ascend's call).
- A query row that sees no key (all masked, or past its actual length) is 0; its
  log-sum-exp is -inf.
"""
import torch

from .formats import Format, get_npu_format

__all__ = [
    "npu_prompt_flash_attention",
    "npu_incre_flash_attention",
    "npu_fused_infer_attention_score",
    "npu_fused_infer_attention_score_v2",
    "npu_fusion_attention_grad",
    "npu_scatter_pa_kv_cache",
    "npu_gather_pa_kv_cache",
    "_npu_fused_infer_attention_score_get_max_workspace",
    "_npu_fused_infer_attention_score_v2_get_max_workspace",
]

_ops = torch.ops.npu


def npu_prompt_flash_attention(query, key, value, **kwargs):
    """Prefill attention: ``softmax(scale_value * q k^T + mask) v`` -> Tensor shaped like query.

    Keywords as Ascend's: ``atten_mask``, ``pse_shift`` (added to the scaled scores),
    ``actual_seq_lengths`` / ``actual_seq_lengths_kv``, ``num_heads``, ``scale_value``,
    ``pre_tokens`` (2147483647), ``next_tokens`` (0), ``input_layout`` ("BSH"),
    ``num_key_value_heads``, ``sparse_mode``. float16/bfloat16.
    """
    return _ops.npu_prompt_flash_attention(query, key, value, **kwargs)


def npu_incre_flash_attention(query, key, value, **kwargs):
    """Decode attention, one query per sequence -> Tensor shaped like query.

    ``actual_seq_lengths`` are the key/value lengths here; ``block_table`` +
    ``block_size`` read key/value from a paged cache. ``atten_mask`` may be (B, KV_S).
    Layouts BSH, BSND, BNSD; float16/bfloat16.
    """
    return _ops.npu_incre_flash_attention(query, key, value, **kwargs)


def npu_fused_infer_attention_score(query, key, value, **kwargs):
    """Prefill or decode attention -> ``(attention_out, softmax_lse)``.

    ``softmax_lse``: float32 (B, N, S, 1) ((T, N, 1) for TND) when
    ``softmax_lse_flag=True``, else a (1,) zero tensor. With one query per sequence
    the sparse mode does not apply (as on Ascend).
    """
    return _ops.npu_fused_infer_attention_score(query, key, value, **kwargs)


def npu_fused_infer_attention_score_v2(query, key, value, **kwargs):
    """``npu_fused_infer_attention_score`` with the v2 names: ``num_query_heads``,
    ``softmax_scale``, ``actual_seq_qlen`` / ``actual_seq_kvlen``, ``return_softmax_lse``;
    ``learnable_sink`` (bfloat16, one logit per query head, layout TND) joins every row's softmax."""
    return _ops.npu_fused_infer_attention_score_v2(query, key, value, **kwargs)


def _out_form(overload):
    """``<op>.out(..., workspace=None, out=[attention_out, softmax_lse])``, as the Ascend
    adapter's binding takes it (vllm-ascend's graph mode): the results are written there."""
    def call(*args, workspace=None, out=None, **kwargs):
        if out is None or len(out) != 2:
            raise TypeError(f"torch_npu.{overload._schema.name.split('::')[-1]}.out: pass out=[attention_out, "
                            f"softmax_lse]")
        return overload(*args, workspace=workspace, attention_out=out[0], softmax_lse=out[1], **kwargs)
    return call


npu_fused_infer_attention_score.out = _out_form(_ops.npu_fused_infer_attention_score.out)
npu_fused_infer_attention_score_v2.out = _out_form(_ops.npu_fused_infer_attention_score_v2.out)


def _npu_fused_infer_attention_score_get_max_workspace(query, key, value, **kwargs):
    """The workspace ``npu_fused_infer_attention_score.out`` takes: empty (none is needed
    here); the call checks the arguments as the operator would."""
    return _ops._npu_fused_infer_attention_score_get_max_workspace(query, key, value, **kwargs)


def _npu_fused_infer_attention_score_v2_get_max_workspace(query, key, value, **kwargs):
    """The workspace of ``npu_fused_infer_attention_score_v2.out``: empty, as for v1."""
    return _ops._npu_fused_infer_attention_score_v2_get_max_workspace(query, key, value, **kwargs)


def npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, **kwargs):
    """The backward of ``npu_fusion_attention``: ``(dq, dk, dv, dpse, dsink)``.

    Pass the forward's ``softmax_max``, ``softmax_sum`` (its results 1 and 2) and
    ``attention_in`` (its output) to reuse them, or leave them out to recompute.
    ``dpse`` is None without ``pse``; ``dsink`` is an empty float32 tensor.
    ``keep_prob`` must be 1 (the dropout mask is not regenerated from seed/offset).
    """
    return _ops.npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, **kwargs)


def npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, **kwargs):
    """Writes token ``t`` of key/value [T, heads, head_size] into slot ``slot_mapping[t]``
    (block ``slot // block_size``, row ``slot % block_size``) of the caches, in place;
    a negative slot is skipped. ``cache_mode`` "PA_NZ" (the default): caches
    [blocks, H / last, block_size, last]; "Norm": [blocks, block_size, heads, head_size]."""
    return _ops.npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, **kwargs)


def npu_gather_pa_kv_cache(key_cache, value_cache, block_tables, seq_lens, key, value, **kwargs):
    """Reads each sequence of ``block_tables`` (``seq_lens`` tokens, from block
    ``seq_offset // block_size``) out of Norm caches [blocks, block_size, heads, head_size]
    into key/value [T, heads, head_size], one sequence after another, in place."""
    if key_cache.device.type == "npu" and get_npu_format(key_cache) == Format.FRACTAL_NZ:
        raise ValueError("torch_npu.npu_gather_pa_kv_cache: a FRACTAL_NZ (PA_NZ) cache is not supported on the npu "
                         "device; keep the cache in the ND layout [blocks, block_size, heads, head_size] "
                         "(npu_scatter_pa_kv_cache with cache_mode='Norm')")
    return _ops.npu_gather_pa_kv_cache(key_cache, value_cache, block_tables, seq_lens, key, value, **kwargs)
