"""``torch_npu.npu_fusion_attention``: the Ascend adapter's fused attention.

transformers (``integrations/npu_flash_attention.py``) and other libraries call
it when they see a package named torch_npu. Here it runs the flash attention
kernel the npu shares with the cpu (``_scaled_dot_product_flash_attention_for_cpu``,
tiled, no full score matrix), with its autograd, for the Ascend layouts and
sparse modes those libraries use. It is an operator, ``torch.ops.npu.npu_fusion_attention``,
as on Ascend; ``torch_npu.npu_fusion_attention`` calls it.
"""
import math
from typing import Optional, Sequence

import torch

__all__ = ["npu_fusion_attention"]

_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
# Ascend's sparse_mode: 0 the given atten_mask (with the pre/next token band),
# 1 all-masked-by-atten_mask, 2 causal aligned top-left, 3 causal aligned
# bottom-right (the last query sees every key).
_SPARSE_MODES = (0, 1, 2, 3)
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
    aligned bottom-right. ``scale`` multiplies the scores; ``keep_prob`` < 1
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
                         f"supported: {_SPARSE_MODES} (0/1 explicit mask, 2 top-left causal, 3 bottom-right causal)")
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"npu_fusion_attention: keep_prob must be in (0, 1], got {keep_prob}")
    if padding_mask is not None or prefix is not None:
        raise ValueError("npu_fusion_attention: padding_mask and prefix are reserved (unused) arguments; pass None")

    if input_layout == "TND":
        if pse is not None or (atten_mask is not None and sparse_mode not in (2, 3)):
            raise ValueError("npu_fusion_attention: layout 'TND' supports the causal sparse modes 2 and 3 "
                             "(or no mask) on this device, without pse")
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
            keep = _keep_mask(q.size(2), k.size(2), None if sparse_mode in (2, 3) else atten_mask, sparse_mode,
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
