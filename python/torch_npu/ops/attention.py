"""The attention operators of LLM serving, with the Ascend adapter's signatures.

Code written for the Ascend adapter (vllm-ascend, MindSpeed) calls them directly;
here they are C++ operators (csrc/ops/fused/attention.cpp) for npu and cpu
tensors, ``torch.ops.npu.<name>``, with meta kernels so torch.compile traces them.
``torch_npu.<name>`` calls the operator. They compute in float32 and take the
layouts, masks, sparse modes, GQA and paged KV caches the Ascend operators take;
quantization options are refused by name. None has a backward (inference
operators), except ``npu_fusion_attention_grad``, which is one.

``npu_fusion_attention``, the Ascend adapter's fused attention for training, is here
too (its schema is in fused.cpp, its backward ``npu_fusion_attention_grad`` in
attention.cpp): transformers (``integrations/npu_flash_attention.py``) and other
libraries call it when they see a package named torch_npu. It runs the flash attention
kernel the npu shares with the cpu (``_scaled_dot_product_flash_attention_for_cpu``,
tiled, no full score matrix), with its autograd, for the Ascend layouts and sparse
modes those libraries use: a CompositeImplicitAutograd kernel of the operator
``torch.ops.npu.npu_fusion_attention`` (the last section of this module), which
``torch_npu.npu_fusion_attention`` calls.

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
from typing import Optional, Sequence

import torch

from .formats import Format, get_npu_format

__all__ = [
    "npu_fusion_attention",
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


# ---- npu_fusion_attention: composed from the flash kernel ------------------------------

_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
# Ascend's sparse_mode: 0 the given atten_mask (with the pre/next token band),
# 1 all-masked-by-atten_mask, 2 causal aligned top-left, 3 causal aligned
# bottom-right (the last query sees every key), 4 the band of pre/next tokens
# aligned bottom-right (sliding-window attention). 2-4 take the compressed
# 2048x2048 pattern as atten_mask: the mode's geometry replaces its content.
_SPARSE_MODES = (0, 1, 2, 3, 4)
_NO_BAND = 2147483647


def _to_bnsd(t: torch.Tensor, layout: str, heads: Optional[int]) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        b, s, h = t.shape
        return t.reshape(b, s, heads, h // heads).transpose(1, 2)
    if layout == "SBH":
        s, b, h = t.shape
        return t.reshape(s, b, heads, h // heads).permute(1, 2, 0, 3)
    raise AssertionError(layout)


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    b, n, s, d = t.shape
    if layout == "BSH":
        return t.transpose(1, 2).reshape(b, s, n * d)
    return t.permute(2, 0, 1, 3).reshape(s, b, n * d)  # SBH


def _keep_mask(sq: int, skv: int, atten_mask, sparse_mode: int, pre: int, nxt: int, device):
    """Boolean mask, True where a query attends a key (Ascend's atten_mask is the opposite)."""
    if sparse_mode in (2, 3):
        # atten_mask is then the compressed 2048x2048 causal pattern; the alignment decides.
        diagonal = 0 if sparse_mode == 2 else skv - sq
        return torch.ones(sq, skv, dtype=torch.bool, device=device).tril(diagonal)
    if sparse_mode == 4:
        # The band counted from the bottom-right corner: query i keeps keys j with
        # -pre <= (j - i) - (skv - sq) <= next.
        rows = torch.arange(sq, device=device).unsqueeze(1)
        cols = torch.arange(skv, device=device).unsqueeze(0)
        offset = cols - rows - (skv - sq)
        return (offset >= -pre) & (offset <= nxt)
    keep = None if atten_mask is None else ~atten_mask.to(torch.bool)
    if sparse_mode == 0 and (pre < _NO_BAND or nxt < _NO_BAND):  # the band applies in mode 0 only
        rows = torch.arange(sq, device=device).unsqueeze(1)
        cols = torch.arange(skv, device=device).unsqueeze(0)
        band = (cols >= rows - pre) & (cols <= rows + nxt)
        keep = band if keep is None else keep & band
    return keep


def _attend(q, k, v, keep, pse, scale: float, keep_prob: float):
    """q, k, v in BNSD -> (out, logsumexp [B, N, Sq]); k/v may have fewer heads (GQA)."""
    if k.size(1) != q.size(1):
        if q.size(1) % k.size(1) != 0:
            raise ValueError(f"npu_fusion_attention: {q.size(1)} query heads are not a multiple of "
                             f"{k.size(1)} key/value heads")
        repeat = q.size(1) // k.size(1)
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    bias = None
    if keep is not None:
        bias = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill(~keep, float("-inf"))
    if pse is not None:
        # Ascend's formula: softmax(scale * (q k^T + pse)); sdpa adds the bias to the scaled scores.
        scaled = pse.to(q.dtype) * scale
        bias = scaled if bias is None else bias + scaled
    if keep_prob >= 1.0 and not (pse is not None and pse.requires_grad):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=bias, scale=scale)
    # Dropout, or a pse to differentiate: the unfused path (the flash kernel has neither);
    # the statistics from the scores.
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=1.0 - keep_prob,
                                                           scale=scale)
    with torch.no_grad():
        scores = (q @ k.transpose(-2, -1)) * scale
        if bias is not None:
            scores = scores + bias
        lse = torch.logsumexp(scores.float(), dim=-1)
    return out, lse


def npu_fusion_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int,
                         input_layout: str, pse: Optional[torch.Tensor] = None,
                         padding_mask: Optional[torch.Tensor] = None, atten_mask: Optional[torch.Tensor] = None,
                         scale: float = 1.0, keep_prob: float = 1.0, pre_tockens: int = _NO_BAND,
                         next_tockens: int = _NO_BAND, inner_precise: int = 0, prefix=None,
                         actual_seq_qlen: Optional[Sequence[int]] = None,
                         actual_seq_kvlen: Optional[Sequence[int]] = None, sparse_mode: int = 0,
                         gen_mask_parallel: bool = True, sync: bool = False):
    """Attention with the Ascend adapter's signature and result tuple: ``torch.ops.npu.npu_fusion_attention``.

    ``input_layout``: "BSH", "SBH", "BSND", "BNSD", or "TND" (variable-length
    sequences packed along T, ``actual_seq_qlen``/``actual_seq_kvlen`` their
    cumulative ends). ``atten_mask``: True where attention is *not* allowed.
    ``sparse_mode``: 0 the given mask (and the ``pre_tockens``/``next_tockens``
    band), 1 the same (the full mask), 2 causal aligned top-left, 3 causal
    aligned bottom-right, 4 the band of ``pre_tockens`` before and ``next_tockens``
    after the diagonal aligned bottom-right (sliding window); 2-4 take the
    compressed 2048x2048 pattern as ``atten_mask``. ``scale`` multiplies the scores; ``keep_prob`` < 1
    applies dropout.

    Returns ``(attention_out, softmax_max, softmax_sum, softmax_out, seed,
    offset, numels)`` like Ascend's. The softmax statistics are given as the
    pair (logsumexp, 1), shaped [B, N, Sq, 8]: exp(score - max) / sum is the
    softmax, as Ascend's backward uses it, but ``softmax_max`` is the
    logsumexp, not the row maximum. ``softmax_out`` is empty (reserved on
    Ascend too).
    """
    return torch.ops.npu.npu_fusion_attention(
        query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask, atten_mask=atten_mask,
        scale=scale, keep_prob=keep_prob, pre_tockens=pre_tockens, next_tockens=next_tockens,
        inner_precise=inner_precise, prefix=prefix, actual_seq_qlen=actual_seq_qlen,
        actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode, gen_mask_parallel=gen_mask_parallel, sync=sync)


# The operator's kernel for CompositeImplicitAutograd: autograd differentiates the
# composition (the flash kernel's own backward), and fake tensors trace through it.
@torch.library.impl("npu::npu_fusion_attention", "CompositeImplicitAutograd")
def _composed(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None, scale=1.0,
              keep_prob=1.0, pre_tockens=_NO_BAND, next_tockens=_NO_BAND, inner_precise=0, prefix=None,
              actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False):
    if input_layout not in _LAYOUTS:
        raise ValueError(f"npu_fusion_attention: input_layout must be one of {_LAYOUTS}, got {input_layout!r}")
    if sparse_mode not in _SPARSE_MODES:
        raise ValueError(f"npu_fusion_attention: sparse_mode {sparse_mode} is not supported on this device; "
                         f"supported: {_SPARSE_MODES} (0/1 explicit mask, 2 top-left causal, 3 bottom-right causal, "
                         f"4 bottom-right band)")
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"npu_fusion_attention: keep_prob must be in (0, 1], got {keep_prob}")
    if padding_mask is not None or prefix is not None:
        raise ValueError("npu_fusion_attention: padding_mask and prefix are reserved (unused) arguments; pass None")

    if input_layout == "TND":
        if pse is not None or (atten_mask is not None and sparse_mode not in (2, 3, 4)):
            raise ValueError("npu_fusion_attention: layout 'TND' takes atten_mask only as the compressed pattern "
                             "of sparse modes 2, 3 and 4 (or no mask) on this device, without pse")
        if actual_seq_qlen is None or actual_seq_kvlen is None:
            raise ValueError("npu_fusion_attention: layout 'TND' needs actual_seq_qlen and actual_seq_kvlen "
                             "(the cumulative end of each sequence)")
        outs, lses = [], []
        q_begin = kv_begin = 0
        numels = 0
        for q_end, kv_end in zip(actual_seq_qlen, actual_seq_kvlen):
            q = query[q_begin:q_end].transpose(0, 1).unsqueeze(0)     # [1, N, s, D]
            k = key[kv_begin:kv_end].transpose(0, 1).unsqueeze(0)
            v = value[kv_begin:kv_end].transpose(0, 1).unsqueeze(0)
            keep = _keep_mask(q.size(2), k.size(2), None if sparse_mode in (2, 3, 4) else atten_mask, sparse_mode,
                              pre_tockens, next_tockens, query.device)
            out, lse = _attend(q, k, v, keep, None, scale, keep_prob)
            numels += q.size(1) * q.size(2) * k.size(2)
            outs.append(out.squeeze(0).transpose(0, 1))
            lses.append(lse.squeeze(0).transpose(0, 1))                # [s, N]
            q_begin, kv_begin = q_end, kv_end
        attention_out = torch.cat(outs)
        lse = torch.cat(lses)                                           # [T, N]
        stats = lse.unsqueeze(-1).expand(*lse.shape, 8).contiguous()
    else:
        q = _to_bnsd(query, input_layout, head_num)
        kv_heads = None
        if input_layout in ("BSH", "SBH"):
            d = q.size(-1)
            kv_heads = key.size(-1) // d
        k, v = _to_bnsd(key, input_layout, kv_heads), _to_bnsd(value, input_layout, kv_heads)
        keep = _keep_mask(q.size(2), k.size(2), atten_mask, sparse_mode, pre_tockens, next_tockens, query.device)
        out, lse = _attend(q, k, v, keep, pse, scale, keep_prob)
        attention_out = _from_bnsd(out, input_layout)
        numels = q.size(0) * q.size(1) * q.size(2) * k.size(2)
        stats = lse.unsqueeze(-1).expand(*lse.shape, 8).contiguous()    # [B, N, Sq, 8]
    softmax_max = stats.float()
    softmax_sum = torch.ones_like(softmax_max)
    softmax_out = torch.empty(0, dtype=query.dtype, device=query.device)
    # seed, offset: the dropout's generator state on Ascend; numels: its mask's elements.
    return attention_out, softmax_max, softmax_sum, softmax_out, 0, 0, int(numels)
