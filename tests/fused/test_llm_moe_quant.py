"""The MoE and quantization npu_* ops of LLM serving and training (csrc/ops/fused/moe_quant.cpp)
against their reference compositions: float32, float16, bfloat16 (int8 for the quantized ones),
npu and cpu tensors, gradients, torch.compile, the errors; end to end, a MoE layer trained
beside the dense expert loop and a W8A8 linear layer (examples/moe_w8a8.py)."""
import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_npu
from helpers import REPO_ROOT, last_line, run_python

sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
import moe_w8a8  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICES = ["npu", "cpu"]
ops = torch.ops.npu


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def distinct_logits(rows, experts, dtype):
    """Router logits without ties in any dtype (top-k order is then unique)."""
    base = torch.stack([torch.randperm(experts) for _ in range(rows)]).float() * 0.25
    return (base - 1 + 0.01 * torch.rand(rows, 1)).to(dtype)


# ---- npu_moe_gating_top_k_softmax -----------------------------------------------------

def gating_ref(x, k, finished=None):
    p = torch.softmax(x.float(), dim=-1)
    values, idx = p.topk(k, dim=-1)
    rows = x.numel() // x.shape[-1]
    row_idx = torch.arange(rows * k).view(k, rows).t().reshape(*x.shape[:-1], k)
    if finished is not None:
        idx = torch.where(finished.unsqueeze(-1), torch.full_like(idx, x.shape[-1]), idx)
    return values, idx.int(), row_idx.int()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_gating_top_k_softmax(dtype, device):
    torch.manual_seed(0)
    x = distinct_logits(12, 8, dtype)
    finished = torch.zeros(12, dtype=torch.bool)
    finished[[2, 7]] = True
    for inputs, fin in ((x, None), (x, finished), (x.view(3, 4, 8), finished.view(3, 4))):
        y, idx, row_idx = torch_npu.npu_moe_gating_top_k_softmax(
            inputs.to(device), None if fin is None else fin.to(device), k=2)
        ey, eidx, erow = gating_ref(inputs, 2, fin)
        assert y.dtype == dtype and idx.dtype == torch.int32 and row_idx.dtype == torch.int32
        assert y.device.type == device
        torch.testing.assert_close(y.float().cpu(), ey, **tol(dtype))
        assert torch.equal(idx.cpu(), eidx) and torch.equal(row_idx.cpu(), erow)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gating_gradient_is_the_softmax_topk_gradient(dtype):
    torch.manual_seed(0)
    x = distinct_logits(10, 8, dtype)
    finished = torch.tensor([False, True] * 5)
    xn = x.npu().requires_grad_()
    xr = x.float().requires_grad_()
    y, _, _ = torch_npu.npu_moe_gating_top_k_softmax(xn, finished.npu(), k=3)
    ey = torch.softmax(xr, -1).topk(3, -1).values
    w = torch.randn(10, 3)
    (y.float() * w.npu()).sum().backward()
    (ey * w).sum().backward()
    assert xn.grad.dtype == dtype
    torch.testing.assert_close(xn.grad.float().cpu(), xr.grad, **tol(dtype))


def test_gating_with_a_large_k():
    x = distinct_logits(6, 64, torch.float32)
    y, idx, _ = torch_npu.npu_moe_gating_top_k_softmax(x.npu(), k=20)  # past the insertion path's 16
    ey, eidx, _ = gating_ref(x, 20)
    torch.testing.assert_close(y.cpu(), ey)
    assert torch.equal(idx.cpu(), eidx)


def test_gating_with_masked_experts_and_ties():
    x = torch.tensor([[0.5, float("-inf"), 0.5, -1.0], [float("-inf"), float("-inf"), 2.0, float("-inf")]])
    y, idx, _ = torch_npu.npu_moe_gating_top_k_softmax(x.npu(), k=3)
    torch.testing.assert_close(y.cpu(), torch.softmax(x, -1).sort(-1, descending=True).values[:, :3])
    assert idx.cpu().tolist()[0] == [0, 2, 3]  # equal probabilities: the lower expert first
    assert y.cpu()[1, 1:].eq(0).all()          # a masked expert has probability exactly 0


def test_gating_checks():
    x = torch.randn(4, 8).npu()
    with pytest.raises(RuntimeError, match=r"npu::npu_moe_gating_top_k_softmax \(npu:0\): k must be in \[1, "):
        torch_npu.npu_moe_gating_top_k_softmax(x, k=9)
    with pytest.raises(RuntimeError, match="x must be float16, bfloat16 or float32, got int32"):
        torch_npu.npu_moe_gating_top_k_softmax(x.int(), k=2)
    with pytest.raises(RuntimeError, match="x must be 2-d"):
        torch_npu.npu_moe_gating_top_k_softmax(x.view(-1), k=2)
    with pytest.raises(RuntimeError, match="finished must be bool"):
        torch_npu.npu_moe_gating_top_k_softmax(x, torch.zeros(4).npu(), k=2)
    with pytest.raises(RuntimeError, match=r"finished must have shape x.shape\[:-1\]"):
        torch_npu.npu_moe_gating_top_k_softmax(x, torch.zeros(3, dtype=torch.bool).npu(), k=2)


# ---- npu_moe_init_routing_v2 ----------------------------------------------------------

def routing_ref(x, expert_idx, *, scale=None, active_num=-1, expert_num=-1, expert_tokens_num_type=0,
                expert_tokens_num_flag=False, active_expert_range=(), row_idx_type=0, quant_mode=-1,
                smooth=None):
    """Dropless MoeInitRoutingV2 in torch ops (the Ascend documentation's formulas)."""
    tokens, k = expert_idx.shape
    start, end = active_expert_range or (0, expert_num if expert_num > 0 else 2**31 - 1)
    flat = expert_idx.flatten().long()
    keys = torch.where(flat < start, torch.full_like(flat, 2**40), flat)
    order = torch.argsort(keys, stable=True)
    routed = int(((flat >= start) & (flat < end)).sum())
    rows_out = tokens * k if active_num <= 0 else min(active_num, tokens * k)
    active = routed if active_num <= 0 else min(active_num, routed)
    expanded = torch.zeros(rows_out, x.shape[1], dtype=x.dtype)
    expanded[:active] = x[order[:active] // k]
    if row_idx_type == 0:
        row_idx = torch.full((tokens * k,), -1, dtype=torch.int32)
        row_idx[order[:routed]] = torch.arange(routed, dtype=torch.int32)
    else:
        row_idx = order.int()
    counts = torch.bincount(flat[order[:routed]] - start, minlength=end - start) if expert_tokens_num_flag else None
    if counts is not None and expert_tokens_num_type == 0:
        counts = counts.cumsum(0)
    if counts is not None and expert_tokens_num_type == 2:
        pairs = torch.zeros(expert_num, 2, dtype=torch.int64)
        nonzero = counts.nonzero().flatten()
        pairs[:len(nonzero), 0], pairs[:len(nonzero), 1] = nonzero + start, counts[nonzero]
        counts = pairs
    escale = torch.zeros(rows_out)
    if scale is not None:
        escale[:active] = scale[order[:active] // k]
    if quant_mode == 1:
        v = expanded.float()
        if smooth is not None:
            sm = smooth if smooth.shape[0] == 1 else torch.zeros(rows_out, x.shape[1])
            if smooth.shape[0] > 1:
                sm[:active] = smooth[flat[order[:active]] - start]
            v = v * sm
        escale = v.abs().amax(-1) / 127
        q = torch.where(escale[:, None] > 0, torch.round(v / escale[:, None]), torch.zeros_like(v))
        expanded = q.clamp(-128, 127).to(torch.int8)
    return expanded, row_idx, counts, escale


def check_routing(expected, actual, *, counts=True):
    ex, eri, ecount, escale = expected
    ax, ari, acount, ascale = [t.cpu() for t in actual]
    assert ax.dtype == ex.dtype and ari.dtype == torch.int32
    torch.testing.assert_close(ax, ex, rtol=0, atol=0)
    assert torch.equal(ari, eri)
    if counts and ecount is not None:
        assert acount.dtype == torch.int64 and torch.equal(acount, ecount)
    torch.testing.assert_close(ascale, escale)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int8])
@pytest.mark.parametrize("device", DEVICES)
def test_init_routing_v2_dropless(dtype, device):
    torch.manual_seed(0)
    tokens, k, experts = 16, 2, 8
    x = (torch.randn(tokens, 64) * 20).to(dtype)
    _, expert_idx, _ = gating_ref(distinct_logits(tokens, experts, torch.float32), k)
    scale = torch.rand(tokens)
    cases = [dict(expert_num=experts, expert_tokens_num_flag=True, expert_tokens_num_type=1),
             dict(expert_num=experts, expert_tokens_num_flag=True, expert_tokens_num_type=0, row_idx_type=1),
             dict(expert_num=experts, expert_tokens_num_flag=True, expert_tokens_num_type=2, scale=scale),
             dict(expert_num=experts, active_num=20, scale=scale),                     # active: 20 of 32 rows
             dict(expert_num=experts, active_expert_range=[2, 6], expert_tokens_num_flag=True,
                  expert_tokens_num_type=1),                                         # expert parallel
             dict(expert_num=experts, active_expert_range=[2, 6], row_idx_type=1)]
    for case in cases:
        npu_case = {key: (v.to(device) if isinstance(v, torch.Tensor) else v) for key, v in case.items()}
        actual = torch_npu.npu_moe_init_routing_v2(x.to(device), expert_idx.to(device), quant_mode=-1, **npu_case)
        assert actual[0].device.type == device
        expected = routing_ref(x, expert_idx, **case)
        check_routing(expected, actual)


def test_init_routing_v2_drop_pad():
    torch.manual_seed(0)
    tokens, k, experts, capacity = 12, 2, 4, 3
    x = torch.randn(tokens, 16)
    expert_idx = torch.randint(0, experts, (tokens, k), dtype=torch.int32)
    expanded, row_idx, counts, _ = torch_npu.npu_moe_init_routing_v2(
        x.npu(), expert_idx.npu(), expert_capacity=capacity, expert_num=experts, drop_pad_mode=1,
        expert_tokens_num_flag=True, expert_tokens_num_type=1, quant_mode=-1)
    assert expanded.shape == (experts, capacity, 16)
    flat = expert_idx.flatten().long()
    expected = torch.zeros(experts, capacity, 16)
    expected_rows = torch.full((tokens * k,), -1, dtype=torch.int32)
    filled = [0] * experts
    for pair in torch.argsort(flat, stable=True).tolist():  # by expert, then token order
        e = int(flat[pair])
        if filled[e] < capacity:
            expected[e, filled[e]] = x[pair // k]
            expected_rows[pair] = e * capacity + filled[e]
            filled[e] += 1
    torch.testing.assert_close(expanded.cpu(), expected, rtol=0, atol=0)
    assert torch.equal(row_idx.cpu(), expected_rows)
    assert torch.equal(counts.cpu(), torch.bincount(flat, minlength=experts))  # counted before the drop
    # the gradient reaches the tokens that kept a slot, not the dropped ones
    xn = x.npu().requires_grad_()
    expanded = torch_npu.npu_moe_init_routing_v2(xn, expert_idx.npu(), expert_capacity=capacity, expert_num=experts,
                                                 drop_pad_mode=1, quant_mode=-1)[0]
    (expanded * torch.arange(1.0, 17.0).npu()).sum().backward()
    expected_grad = torch.zeros(tokens, 16)
    for pair, slot in enumerate(expected_rows.tolist()):
        if slot >= 0:
            expected_grad[pair // k] += torch.arange(1.0, 17.0)
    torch.testing.assert_close(xn.grad.cpu(), expected_grad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_init_routing_v2_quantized(dtype):
    torch.manual_seed(0)
    tokens, k, experts = 8, 2, 4
    x = torch.randn(tokens, 32).to(dtype)
    _, expert_idx, _ = gating_ref(distinct_logits(tokens, experts, torch.float32), k)
    for smooth in (None, torch.rand(1, 32) + 0.5, torch.rand(experts, 32) + 0.5):
        actual = torch_npu.npu_moe_init_routing_v2(
            x.npu(), expert_idx.npu(), scale=None if smooth is None else smooth.npu(), expert_num=experts,
            quant_mode=1)
        expected = routing_ref(x, expert_idx, expert_num=experts, quant_mode=1, smooth=smooth)
        assert actual[0].dtype == torch.int8
        torch.testing.assert_close(actual[3].cpu(), expected[3])
        # one level of int8 rounding apart at most (the division rounds at a .5 boundary otherwise)
        assert (actual[0].cpu().int() - expected[0].int()).abs().max() <= 1
        assert torch.equal(actual[1].cpu(), expected[1])
    # static: round(x * scale + offset), saturated
    # (quant_mode's default, 0, as on Ascend: scale and offset alone give int8 rows)
    s, o = torch.tensor([30.0]), torch.tensor([2.0])
    static = torch_npu.npu_moe_init_routing_v2(x.npu(), expert_idx.npu(), scale=s.npu(), offset=o.npu(),
                                               expert_num=experts)
    rows = routing_ref(x, expert_idx, expert_num=experts)[0]
    assert static[3].shape == ()
    assert torch.equal(static[0].cpu(), torch.round(rows.float() * 30 + 2).clamp(-128, 127).to(torch.int8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row_idx_type", [0, 1])
def test_init_routing_v2_gradient_is_the_gather_gradient(dtype, row_idx_type):
    torch.manual_seed(0)
    x = torch.randn(8, 16).to(dtype)
    expert_idx = torch.randint(0, 4, (8, 2), dtype=torch.int32)
    xn, xr = x.npu().requires_grad_(), x.clone().requires_grad_()
    expanded, row_idx, _, _ = torch_npu.npu_moe_init_routing_v2(xn, expert_idx.npu(), expert_num=4,
                                                                active_num=12, row_idx_type=row_idx_type,
                                                                quant_mode=-1)
    order = torch.argsort(expert_idx.flatten().long(), stable=True)
    reference = xr[order[:12] // 2]
    g = torch.randn(12, 16).to(dtype)
    (expanded * g.npu()).sum().backward()
    (reference * g).sum().backward()
    torch.testing.assert_close(xn.grad.float().cpu(), xr.grad.float(), **tol(dtype))


def test_init_routing_v2_gradient_compiles_and_reaches_scale():
    torch.manual_seed(0)
    x, scale = torch.randn(8, 16), torch.rand(8)
    expert_idx = torch.randint(0, 4, (8, 2), dtype=torch.int32)

    def routed(a, s, idx):
        expanded, _, _, expanded_scale = torch_npu.npu_moe_init_routing_v2(
            a, idx, scale=s, expert_num=4, active_num=12, row_idx_type=1, quant_mode=-1)
        return (expanded * expanded_scale.unsqueeze(-1)).sum()

    grads = []
    for fn in (routed, torch.compile(routed, backend="aot_eager", fullgraph=True)):
        torch._dynamo.reset()
        xn, sn = x.npu().requires_grad_(), scale.npu().requires_grad_()
        fn(xn, sn, expert_idx.npu()).backward()
        grads.append((xn.grad.cpu(), sn.grad.cpu()))
    xr, sr = x.clone().requires_grad_(), scale.clone().requires_grad_()
    order = torch.argsort(expert_idx.flatten().long(), stable=True)[:12] // 2
    (xr[order] * sr[order].unsqueeze(-1)).sum().backward()
    for gx, gs in grads:
        torch.testing.assert_close(gx, xr.grad)
        torch.testing.assert_close(gs, sr.grad)


def test_init_routing_v2_checks():
    x, idx = torch.randn(4, 8).npu(), torch.zeros(4, 2, dtype=torch.int32).npu()
    with pytest.raises(RuntimeError, match=r"npu::npu_moe_init_routing_v2 \(npu:0\): expert_idx must be int32"):
        torch_npu.npu_moe_init_routing_v2(x, idx.long(), quant_mode=-1)
    with pytest.raises(RuntimeError, match="quant_mode 2 .* not supported on this npu"):
        torch_npu.npu_moe_init_routing_v2(x, idx, expert_num=4, quant_mode=2)
    with pytest.raises(RuntimeError, match="expert_num must be given"):
        torch_npu.npu_moe_init_routing_v2(x, idx, expert_tokens_num_flag=True, quant_mode=-1)
    with pytest.raises(RuntimeError, match="drop/pad mode needs 0 < expert_capacity"):
        torch_npu.npu_moe_init_routing_v2(x, idx, expert_num=4, drop_pad_mode=1, quant_mode=-1)
    with pytest.raises(RuntimeError, match=r"static quantization \(quant_mode=0, the default, as on Ascend\) needs "
                                           r"scale and offset.*pass quant_mode=-1 to route without quantization"):
        torch_npu.npu_moe_init_routing_v2(x, idx, expert_num=4)
    with pytest.raises(RuntimeError, match="needs a float16, bfloat16 or float32 x, got int8"):
        torch_npu.npu_moe_init_routing_v2(x.to(torch.int8), idx, expert_num=4, quant_mode=1)


# ---- npu_grouped_matmul -----------------------------------------------------------------

def gmm_ref(x, weights, sizes, bias=None):
    out, row = [], 0
    for e, size in enumerate(sizes):
        y = x[row:row + size].float() @ weights[e].float()
        out.append(y + bias[e].float() if bias is not None else y)
        row += size
    out.append(torch.zeros(x.shape[0] - row, weights[0].shape[1]))
    return torch.cat(out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_grouped_matmul_one_x_grouped_along_m(dtype, device):
    torch.manual_seed(0)
    experts, sizes = 8, [3, 0, 5, 2, 4, 1, 0, 3]
    x, w = torch.randn(20, 64).to(dtype), (torch.randn(experts, 64, 32) * 0.2).to(dtype)
    counts = torch.tensor(sizes)
    expected = gmm_ref(x, w, sizes)
    for group_list, list_type in ((counts.cumsum(0), 0), (counts, 1)):  # 2 rows belong to no group
        y = torch_npu.npu_grouped_matmul([x.to(device)], [w.to(device)], group_list=group_list.to(device),
                                         group_list_type=list_type, group_type=0, split_item=2)
        assert isinstance(y, list) and len(y) == 1 and y[0].dtype == dtype and y[0].device.type == device
        torch.testing.assert_close(y[0].float().cpu(), expected, **tol(dtype))
        # the weights as a list of tensors give the same
        y = torch_npu.npu_grouped_matmul([x.to(device)], list(w.to(device).unbind(0)), group_list=group_list.to(device),
                                         group_list_type=list_type, group_type=0, split_item=3)
        torch.testing.assert_close(y[0].float().cpu(), expected, **tol(dtype))
    # group_list as ints: one result per group
    y = torch_npu.npu_grouped_matmul([x.to(device)], list(w.to(device).unbind(0)),
                                     group_list=counts.cumsum(0).tolist(), split_item=0)
    assert [t.shape[0] for t in y] == sizes
    torch.testing.assert_close(torch.cat(y).float().cpu(), expected[:18], **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_matmul_lists_with_bias(dtype):
    torch.manual_seed(0)
    xs = [torch.randn(3, 16).to(dtype), torch.randn(2, 4, 8).to(dtype)]
    ws = [torch.randn(16, 8).to(dtype), torch.randn(8, 5).to(dtype)]
    bias_dtype = torch.float16 if dtype == torch.float16 else torch.float32  # Ascend's bias rule
    bs = [torch.randn(8).to(bias_dtype), torch.randn(5).to(bias_dtype)]
    ys = torch_npu.npu_grouped_matmul([t.npu() for t in xs], [t.npu() for t in ws], bias=[t.npu() for t in bs],
                                      group_type=-1)
    for x, w, b, y in zip(xs, ws, bs, ys):
        assert y.shape == (*x.shape[:-1], w.shape[1])
        torch.testing.assert_close(y.float().cpu(), x.float() @ w.float() + b.float(), **tol(dtype))
    # several x, results stacked (split_item 2)
    xs2 = [torch.randn(3, 16).to(dtype), torch.randn(4, 16).to(dtype)]
    ws2 = [torch.randn(16, 8).to(dtype), torch.randn(16, 8).to(dtype)]
    y = torch_npu.npu_grouped_matmul([t.npu() for t in xs2], [t.npu() for t in ws2], split_item=2, group_type=0)[0]
    torch.testing.assert_close(y.float().cpu(), torch.cat([a.float() @ b.float() for a, b in zip(xs2, ws2)]),
                               **tol(dtype))


def test_grouped_matmul_with_bias_compiles_forward_and_backward():
    torch.manual_seed(0)
    x, w, b = torch.randn(10, 8), torch.randn(3, 8, 4), torch.randn(3, 4)
    counts = torch.tensor([3, 0, 5]).npu()  # two rows in no group

    def layer(a, wt, bias):
        return torch_npu.npu_grouped_matmul([a], [wt], bias=[bias], group_list=counts, group_list_type=1,
                                            group_type=0, split_item=3)[0].square().sum()

    results = []
    for fn in (layer, torch.compile(layer, backend="aot_eager", fullgraph=True)):
        torch._dynamo.reset()
        leaves = [t.npu().requires_grad_() for t in (x, w, b)]
        fn(*leaves).backward()
        results.append([t.grad.cpu() for t in leaves])
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    gmm_ref(leaves[0], leaves[1], [3, 0, 5], leaves[2]).square().sum().backward()
    for grads in results:
        for got, expected in zip(grads, leaves):
            torch.testing.assert_close(got, expected.grad)


def test_grouped_matmul_along_k():
    torch.manual_seed(0)
    x, w = torch.randn(6, 10), torch.randn(10, 4)
    y = torch_npu.npu_grouped_matmul([x.npu()], [w.npu()], group_list=torch.tensor([3, 3, 10]).npu(),
                                     group_type=2, split_item=3)[0]
    expected = torch.stack([x[:, :3] @ w[:3], torch.zeros(6, 4), x[:, 3:] @ w[3:]])
    torch.testing.assert_close(y.cpu(), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_matmul_gradients(dtype):
    torch.manual_seed(0)
    sizes = [3, 0, 4, 2]
    x, w = torch.randn(10, 16).to(dtype), (torch.randn(4, 16, 8) * 0.3).to(dtype)
    b = torch.randn(4, 8)
    g = torch.randn(10, 8)
    xr, wr = x.float().clone().requires_grad_(), w.float().clone().requires_grad_()
    br = b.clone().requires_grad_() if dtype != torch.float16 else None
    (gmm_ref(xr, wr, sizes, br) * g).sum().backward()
    # one 3-d weight (bias only where Ascend allows a float32 bias: bfloat16 and float32 x)
    xn, wn = x.npu().requires_grad_(), w.npu().requires_grad_()
    bn = b.npu().requires_grad_() if br is not None else None
    y = torch_npu.npu_grouped_matmul([xn], [wn], bias=None if bn is None else [bn],
                                     group_list=torch.tensor(sizes).cumsum(0).npu(), group_type=0, split_item=3)[0]
    (y.float() * g.npu()).sum().backward()
    torch.testing.assert_close(xn.grad.float().cpu(), xr.grad, **tol(dtype))
    torch.testing.assert_close(wn.grad.float().cpu(), wr.grad, **tol(dtype))
    if bn is not None:
        torch.testing.assert_close(bn.grad.cpu(), br.grad, **tol(dtype))
    # weights as a list, results per group (group_list as ints)
    xn = x.npu().requires_grad_()
    wl = [t.npu().requires_grad_() for t in w.unbind(0)]
    ys = torch_npu.npu_grouped_matmul([xn], wl, group_list=torch.tensor(sizes).cumsum(0).tolist(), split_item=0)
    (torch.cat(ys).float() * g[:9].npu()).sum().backward()
    xr.grad, wr.grad = None, None
    (gmm_ref(xr, wr, sizes)[:9] * g[:9]).sum().backward()
    torch.testing.assert_close(xn.grad.float().cpu(), xr.grad, **tol(dtype))
    torch.testing.assert_close(torch.stack([t.grad for t in wl]).float().cpu(), wr.grad, **tol(dtype))


def test_grouped_matmul_int8_per_token_and_antiquant():
    torch.manual_seed(0)
    sizes = [4, 2, 0, 3]
    x = torch.randint(-128, 128, (9, 32), dtype=torch.int8)
    w = torch.randint(-128, 128, (4, 32, 16), dtype=torch.int8)
    scale, pts = torch.rand(4, 16) * 1e-3, torch.rand(9) + 0.5
    group_list = torch.tensor(sizes).cumsum(0)
    exact = gmm_ref(x.double(), w.double(), sizes).double()
    rows = torch.repeat_interleave(torch.arange(4), torch.tensor(sizes))
    dequant = exact * scale.double()[rows] * pts.double()[:, None]
    for out_dtype in (torch.bfloat16, torch.float16):
        y = torch_npu.npu_grouped_matmul([x.npu()], [w.npu()], scale=[scale.npu()], per_token_scale=[pts.npu()],
                                         group_list=group_list.npu(), group_type=0, split_item=2,
                                         output_dtype=out_dtype)[0]
        assert y.dtype == out_dtype
        torch.testing.assert_close(y.double().cpu(), dequant, rtol=1e-2, atol=1e-2)
    # int32 accumulators, no dequantization; [group, count] pairs as group_list
    pairs = torch.tensor([[0, 4], [1, 2], [3, 3]])
    y = torch_npu.npu_grouped_matmul([x.npu()], [w.npu()], group_list=pairs.npu(), group_list_type=2, group_type=0,
                                     split_item=3, output_dtype=torch.int32)[0]
    assert y.dtype == torch.int32 and torch.equal(y.cpu().double(), exact)
    # with silu (act_type 5) after the dequantization
    y = torch_npu.npu_grouped_matmul([x.npu()], [w.npu()], scale=[scale.npu()], per_token_scale=[pts.npu()],
                                     group_list=group_list.npu(), group_type=0, split_item=2,
                                     output_dtype=torch.bfloat16, act_type=5)[0]
    torch.testing.assert_close(y.double().cpu(), F.silu(dequant), rtol=1e-2, atol=1e-2)
    # weight-only int8 (antiquant): x @ ((w + offset) * scale)
    xf = torch.randn(9, 32).half()
    aq_scale, aq_offset = (torch.rand(4, 16) * 0.01).half(), torch.randn(4, 16).half()
    y = torch_npu.npu_grouped_matmul([xf.npu()], [w.npu()], antiquant_scale=[aq_scale.npu()],
                                     antiquant_offset=[aq_offset.npu()], group_list=group_list.npu(),
                                     group_type=0, split_item=2)[0]
    wd = ((w.half() + aq_offset[:, None]) * aq_scale[:, None])
    torch.testing.assert_close(y.float().cpu(), gmm_ref(xf, wd, sizes), rtol=2e-2, atol=2e-2)


def test_grouped_matmul_checks():
    x, w = torch.randn(4, 8).npu(), torch.randn(2, 8, 3).npu()
    gl = torch.tensor([2, 4]).npu()
    with pytest.raises(RuntimeError, match=r"npu::npu_grouped_matmul \(npu:0\): group_list must be int64"):
        torch_npu.npu_grouped_matmul([x], [w], group_list=gl.int(), group_type=0, split_item=3)
    with pytest.raises(RuntimeError, match="split_item must be 2 or 3"):
        torch_npu.npu_grouped_matmul([x], [w], group_list=gl, group_type=0, split_item=0)
    with pytest.raises(RuntimeError, match="bias must be float32 for bfloat16 x"):
        torch_npu.npu_grouped_matmul([x.bfloat16()], [w.bfloat16()], bias=[torch.randn(2, 3).bfloat16().npu()],
                                     group_list=gl, group_type=0, split_item=3)
    with pytest.raises(RuntimeError, match="int4 operands .* not supported"):
        torch_npu.npu_grouped_matmul([x.int()], [w.int()], group_list=gl, group_type=0, split_item=3)
    with pytest.raises(RuntimeError, match="group_list covers 5 rows of x, which has 4"):
        torch_npu.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 5]).npu(), group_type=0, split_item=3)
    with pytest.raises(RuntimeError, match="need scale"):
        torch_npu.npu_grouped_matmul([x.to(torch.int8)], [w.to(torch.int8)], group_list=gl, group_type=0,
                                     split_item=3)
    with pytest.raises(RuntimeError, match="act_type is only supported with per-token"):
        torch_npu.npu_grouped_matmul([x], [w], group_list=gl, group_type=0, split_item=3, act_type=1)


# ---- npu_moe_token_permute --------------------------------------------------------------

def permute_ref(tokens, indices, num_out=None):
    """Ascend's formulas, pair by pair: pairs ordered by expert, ties in pair order."""
    topk = 1 if indices.dim() == 1 else indices.shape[1]
    flat = indices.flatten().tolist()
    order = sorted(range(len(flat)), key=lambda pair: (flat[pair], pair))
    landed = [0] * len(flat)
    for row, pair in enumerate(order):
        landed[pair] = row
    rows = order[:num_out] if num_out else order
    return tokens[[pair // topk for pair in rows]], torch.tensor(landed, dtype=torch.int32)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int8])
@pytest.mark.parametrize("device", DEVICES)
def test_token_permute_orders_pairs_by_expert(dtype, device):
    torch.manual_seed(0)
    tokens = (torch.randn(12, 16) * 20).to(dtype)
    for indices, num_out in [(torch.randint(0, 4, (12, 3)), None), (torch.randint(0, 4, (12, 3), dtype=torch.int32), 0),
                             (torch.randint(0, 6, (12,)), 7), (torch.randint(0, 4, (12, 2)), -5)]:
        permuted, sorted_indices = torch_npu.npu_moe_token_permute(tokens.to(device), indices.to(device), num_out)
        expected, expected_indices = permute_ref(tokens, indices, num_out)
        assert permuted.device.type == device and sorted_indices.dtype == torch.int32
        assert torch.equal(permuted.cpu(), expected) and torch.equal(sorted_indices.cpu(), expected_indices)


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_permute_then_unpermute_and_the_gradient(dtype):
    torch.manual_seed(0)
    tokens, indices, probs = torch.randn(8, 16).to(dtype), torch.randint(0, 4, (8, 2)), torch.rand(8, 2).to(dtype)
    tn, tr = tokens.npu().requires_grad_(), tokens.float().clone().requires_grad_()
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(tn, indices.npu())
    restored = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs.npu())
    torch.testing.assert_close(restored.float().cpu(), tokens.float() * probs.float().sum(1, keepdim=True),
                               **tol(dtype))
    g = torch.randn(16, 16)                        # 16 = the rows kept of 8 * 2
    (permuted.float() * g.npu()).sum().backward()
    (permute_ref(tr, indices)[0] * g).sum().backward()
    torch.testing.assert_close(tn.grad.float().cpu(), tr.grad, **tol(dtype))


def test_token_permute_checks():
    tokens, idx = torch.randn(4, 8).npu(), torch.zeros(4, 2, dtype=torch.int64).npu()
    with pytest.raises(RuntimeError, match=r"npu::npu_moe_token_permute \(npu:0\): padded_mode=True"):
        torch_npu.npu_moe_token_permute(tokens, idx, padded_mode=True)
    with pytest.raises(RuntimeError, match="indices must be int32 or int64 of shape \\[4\\] or \\[4, topk\\]"):
        torch_npu.npu_moe_token_permute(tokens, idx.float())
    with pytest.raises(RuntimeError, match="tokens must be float16, bfloat16, float32 or int8"):
        torch_npu.npu_moe_token_permute(tokens.double(), idx)
    with pytest.raises(RuntimeError, match=r"topk \(indices.size\(1\)\) must be in \[1, 512\], got 600"):
        torch_npu.npu_moe_token_permute(tokens, torch.zeros(4, 600, dtype=torch.int64).npu())


# ---- npu_moe_token_unpermute ------------------------------------------------------------

def unpermute_ref(permuted, sorted_indices, probs):
    topk = 1 if probs is None else probs.shape[1]
    rows = permuted.float()[sorted_indices.long()].view(-1, topk, permuted.shape[1])
    if probs is not None:
        rows = rows * probs.float().unsqueeze(-1)
    return rows.sum(1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_token_unpermute_and_its_gradient(dtype, device):
    torch.manual_seed(0)
    tokens, k, h = 16, 2, 64
    permuted = torch.randn(tokens * k, h).to(dtype)
    sorted_indices = torch.randperm(tokens * k).int()
    probs = torch.rand(tokens, k).to(dtype)
    for p in (probs, None):
        pn = permuted.clone().to(device).requires_grad_()
        prn = p.clone().to(device).requires_grad_() if p is not None else None
        out = torch_npu.npu_moe_token_unpermute(pn, sorted_indices.to(device), prn)
        pr = permuted.float().clone().requires_grad_()
        prr = p.float().clone().requires_grad_() if p is not None else None
        expected = unpermute_ref(pr, sorted_indices, prr)
        assert out.dtype == dtype and out.device.type == device
        torch.testing.assert_close(out.float().cpu(), expected, **tol(dtype))
        g = torch.randn_like(expected)
        (out.float() * g.to(device)).sum().backward()
        (expected * g).sum().backward()
        torch.testing.assert_close(pn.grad.float().cpu(), pr.grad, **tol(dtype))
        if p is not None:
            torch.testing.assert_close(prn.grad.float().cpu(), prr.grad, **tol(dtype))


def test_token_unpermute_repeated_and_unused_rows():
    permuted = torch.randn(6, 4)
    sorted_indices = torch.tensor([0, 0, 2, 5], dtype=torch.int32)  # row 0 twice, rows 1, 3, 4 unused
    probs = torch.rand(2, 2)
    pn = permuted.npu().requires_grad_()
    pr = permuted.clone().requires_grad_()
    torch_npu.npu_moe_token_unpermute(pn, sorted_indices.npu(), probs.npu()).sum().backward()
    unpermute_ref(pr, sorted_indices, probs).sum().backward()
    torch.testing.assert_close(pn.grad.cpu(), pr.grad)


def test_token_unpermute_checks():
    permuted, idx = torch.randn(4, 8).npu(), torch.arange(4, dtype=torch.int32).npu()
    with pytest.raises(RuntimeError, match=r"npu::npu_moe_token_unpermute \(npu:0\): padded_mode=True"):
        torch_npu.npu_moe_token_unpermute(permuted, idx, padded_mode=True)
    with pytest.raises(RuntimeError, match="sorted_indices must be 1-d int32"):
        torch_npu.npu_moe_token_unpermute(permuted, idx.long())
    with pytest.raises(RuntimeError, match=r"sorted_indices\[3\] = 9 is not a row of permuted_tokens"):
        torch_npu.npu_moe_token_unpermute(permuted, torch.tensor([0, 1, 2, 9], dtype=torch.int32).npu())
    with pytest.raises(RuntimeError, match=r"topk \(probs.size\(1\)\) must be in \[1, 512\], got 0"):
        torch_npu.npu_moe_token_unpermute(permuted[:0], idx[:0], torch.rand(3, 0).npu())
    with pytest.raises(RuntimeError, match="probs must have permuted_tokens' dtype"):
        torch_npu.npu_moe_token_unpermute(permuted, idx, torch.rand(2, 2).half().npu())


# ---- npu_dynamic_quant ------------------------------------------------------------------

def dynamic_quant_ref(x, smooth=None, qmax=127):
    v = x.float() * (smooth.float() if smooth is not None else 1)
    scale = v.abs().amax(-1) / qmax
    return torch.round(v / scale.unsqueeze(-1)).clamp(-qmax - 1, qmax), scale


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_quant(dtype, device):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 64).to(dtype)
    smooth = (torch.rand(64) + 0.5).to(dtype)
    for sm in (None, smooth):
        y, scale = torch_npu.npu_dynamic_quant(x.to(device), smooth_scales=None if sm is None else sm.to(device))
        ey, escale = dynamic_quant_ref(x, sm)
        assert y.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (2, 8)
        torch.testing.assert_close(scale.cpu(), escale)
        assert (y.cpu().float() - ey).abs().max() <= 1  # one rounding step at a .5 boundary
        assert (y.cpu().float() == ey).float().mean() > 0.99
    # per-expert smooth scales over groups of rows
    groups = (torch.rand(3, 64) + 0.5).to(dtype)
    group_index = torch.tensor([5, 5, 16], dtype=torch.int32)
    y, scale = torch_npu.npu_dynamic_quant(x.to(device), smooth_scales=groups.to(device),
                                           group_index=group_index.to(device))
    rows = x.view(16, 64)
    per_row = torch.cat([groups[0].expand(5, 64), groups[2].expand(11, 64)])
    ey, escale = dynamic_quant_ref(rows, per_row)
    torch.testing.assert_close(scale.cpu().view(16), escale)


def test_dynamic_quant_int4_and_per_tensor():
    torch.manual_seed(0)
    x = torch.randn(4, 16).half()
    packed, scale = torch_npu.npu_dynamic_quant(x.npu(), dst_type=torch.quint4x2)
    assert packed.dtype == torch.int32 and packed.shape == (4, 2)
    ey, escale = dynamic_quant_ref(x, qmax=7)
    torch.testing.assert_close(scale.cpu(), escale)
    # unpacked, the int4 values are the int8 reference at 7 levels
    words = packed.cpu().view(-1, 1).long() & 0xFFFFFFFF
    nibbles = (words >> (4 * torch.arange(8))) & 0xF
    values = torch.where(nibbles >= 8, nibbles - 16, nibbles).view(4, 16).float()
    assert (values - ey).abs().max() <= 1
    y, scale = torch_npu.npu_dynamic_quant(x.npu(), quant_mode="pertensor")
    assert scale.shape == (1,)
    torch.testing.assert_close(scale.cpu(), x.float().abs().amax().view(1) / 127)


def test_dynamic_quant_checks():
    x = torch.randn(4, 8).npu()
    with pytest.raises(RuntimeError, match=r"npu::npu_dynamic_quant \(npu:0\): x must be float16 or bfloat16 "
                                           r"\(Ascend's kernel takes no float32\), got float32; cast it"):
        torch_npu.npu_dynamic_quant(x)
    with pytest.raises(RuntimeError, match="dst_type must be torch.int8 or torch.quint4x2"):
        torch_npu.npu_dynamic_quant(x.half(), dst_type=torch.uint8)
    with pytest.raises(RuntimeError, match="smooth_scales must be \\[8\\]"):
        torch_npu.npu_dynamic_quant(x.half(), smooth_scales=torch.ones(4).half().npu())
    with pytest.raises(RuntimeError, match="group_index's last entry"):
        torch_npu.npu_dynamic_quant(x.half(), smooth_scales=torch.ones(2, 8).half().npu(),
                                    group_index=torch.tensor([1, 3], dtype=torch.int32).npu())


# ---- npu_quant_matmul and npu_convert_weight_to_int4pack ------------------------------------

def int8_pair(m, k, n, seed=0):
    torch.manual_seed(seed)
    return (torch.randint(-128, 128, (m, k), dtype=torch.int8), torch.randint(-128, 128, (k, n), dtype=torch.int8))


@pytest.mark.parametrize("device", DEVICES)
def test_quant_matmul_int8_results(device):
    x1, x2 = int8_pair(8, 64, 16)
    exact = x1.double() @ x2.double()
    scale, offset = torch.rand(16) * 1e-3, torch.randn(16)
    # int8 result (the default): round(acc * scale + offset), saturated
    y = torch_npu.npu_quant_matmul(x1.to(device), x2.to(device), scale.to(device), offset=offset.to(device))
    assert y.dtype == torch.int8 and y.device.type == device
    expected = torch.round(exact * scale.double() + offset.double()).clamp(-128, 127)
    assert (y.cpu().double() - expected).abs().max() <= 1 and (y.cpu().double() == expected).float().mean() > 0.99
    # int32 accumulators, with an int32 bias
    bias = torch.randint(-1000, 1000, (16,), dtype=torch.int32)
    y = torch_npu.npu_quant_matmul(x1.to(device), x2.to(device), scale.to(device), bias=bias.to(device),
                                   output_dtype=torch.int32)
    assert y.dtype == torch.int32 and torch.equal(y.cpu().double(), exact + bias.double())


def test_quant_matmul_exact_for_long_k():
    x1, x2 = int8_pair(4, 4096, 8)  # partial sums past 2^24: still exact in int32
    y = torch_npu.npu_quant_matmul(x1.npu(), x2.npu(), torch.ones(1).npu(), output_dtype=torch.int32)
    assert torch.equal(y.cpu().long(), x1.long() @ x2.long())


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_quant_matmul_per_token_float_results(out_dtype):
    x1, x2 = int8_pair(2 * 8, 32, 16)
    x1 = x1.view(2, 8, 32)
    scale, pts = torch.rand(16) * 1e-3, torch.rand(8) + 0.5
    bias = torch.randn(2, 1, 16).to(torch.bfloat16) if out_dtype == torch.bfloat16 else torch.randn(16)
    y = torch_npu.npu_quant_matmul(x1.npu(), x2.npu(), scale.npu(), pertoken_scale=pts.npu(), bias=bias.npu(),
                                   output_dtype=out_dtype)
    assert y.dtype == out_dtype and y.shape == (2, 8, 16)
    expected = (x1.double() @ x2.double()) * scale.double() * pts.double()[:, None] + bias.double()
    torch.testing.assert_close(y.double().cpu(), expected, rtol=1e-2, atol=1e-2)
    # an int64 scale (npu_trans_quant_param's form) holds the float32's bits
    as_int64 = scale.view(torch.int32).long() & 0xFFFFFFFF
    y2 = torch_npu.npu_quant_matmul(x1[0].npu(), x2.npu(), as_int64.npu(), output_dtype=torch.float16)
    torch.testing.assert_close(y2.double().cpu(), (x1[0].double() @ x2.double()) * scale.double(), rtol=1e-2,
                               atol=1e-2)


def test_trans_quant_param_and_its_int64_scales():
    scale, offset = torch.rand(16) * 1e-2, torch.randn(16) * 3
    packed = torch_npu.npu_trans_quant_param(scale.npu(), offset.npu())
    assert packed.dtype == torch.int64 and packed.shape == (16,)
    bits = scale.view(torch.int32).long() & 0xFFFFE000
    expected = bits | (1 << 46) | ((torch.round(offset).clamp(-256, 255).long() & 0x1FF) << 37)
    assert torch.equal(packed.cpu(), expected)
    # npu_quant_matmul reads the FP19 scale and, for int8 results, the embedded offset
    x1, x2 = int8_pair(8, 32, 16)
    y = torch_npu.npu_quant_matmul(x1.npu(), x2.npu(), packed)
    cut = (bits & 0xFFFFFFFF).int().view(torch.float32).double()
    exact = torch.round((x1.double() @ x2.double()) * cut + torch.round(offset).double()).clamp(-128, 127)
    assert (y.cpu().double() - exact).abs().max() <= 1 and (y.cpu().double() == exact).float().mean() > 0.99
    y = torch_npu.npu_quant_matmul(x1.npu(), x2.npu(), torch_npu.npu_trans_quant_param(scale.npu()),
                                   output_dtype=torch.float16)
    torch.testing.assert_close(y.double().cpu(), (x1.double() @ x2.double()) * cut, rtol=1e-3, atol=1e-2)
    with pytest.raises(RuntimeError, match="round_mode 1 .* not supported"):
        torch_npu.npu_trans_quant_param(scale.npu(), round_mode=1)


def test_int4_pack_and_int4_matmul():
    torch.manual_seed(0)
    w = torch.randint(-8, 8, (32, 16), dtype=torch.int32)
    packed = torch_npu.npu_convert_weight_to_int4pack(w.npu())
    assert packed.dtype == torch.int32 and packed.shape == (32, 2)
    expected = torch.zeros(32, 2, dtype=torch.int64)
    for j in range(8):
        expected |= (w[:, j::8].long() & 0xF) << (4 * j)
    assert torch.equal(packed.cpu().long() & 0xFFFFFFFF, expected)
    # int4 x int4: activations packed by npu_dynamic_quant, weights by the pack op
    x = torch.randn(4, 32).half()
    xq, x_scale = torch_npu.npu_dynamic_quant(x.npu(), dst_type=torch.quint4x2)
    scale = torch.rand(16) * 0.1
    y = torch_npu.npu_quant_matmul(xq, packed, scale.npu(), pertoken_scale=x_scale, output_dtype=torch.bfloat16)
    x_levels = dynamic_quant_ref(x, qmax=7)[0]
    ref = (x_levels.double() @ w.double()) * scale.double() * x_scale.cpu().double()[:, None]
    torch.testing.assert_close(y.double().cpu(), ref, rtol=2e-2, atol=2e-2)
    # the (n, k/8) packing of the transposed weight, passed transposed
    packed_t = torch_npu.npu_convert_weight_to_int4pack(w.t().contiguous().npu())
    y_t = torch_npu.npu_quant_matmul(xq, packed_t.t(), scale.npu(), pertoken_scale=x_scale,
                                     output_dtype=torch.bfloat16)
    assert torch.equal(y_t.cpu(), y.cpu())


def test_quant_matmul_checks():
    x1, x2 = int8_pair(4, 8, 4)
    x1, x2, s = x1.npu(), x2.npu(), torch.ones(4).npu()
    with pytest.raises(RuntimeError, match=r"npu::npu_quant_matmul \(npu:0\): x1 and x2 must both be int8"):
        torch_npu.npu_quant_matmul(x1.float(), x2.float(), s)
    with pytest.raises(RuntimeError, match="pertoken_scale needs a float16 or bfloat16 output_dtype"):
        torch_npu.npu_quant_matmul(x1, x2, s, pertoken_scale=torch.ones(4).npu())
    with pytest.raises(RuntimeError, match="offset is only for int8 results"):
        torch_npu.npu_quant_matmul(x1, x2, s, offset=s, output_dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="scale must be \\[1\\] or \\[n\\]"):
        torch_npu.npu_quant_matmul(x1, x2, torch.ones(3).npu())
    with pytest.raises(RuntimeError, match="x1's last dimension \\(8\\) must match"):
        torch_npu.npu_quant_matmul(x1, x2[:4], s)
    with pytest.raises(RuntimeError, match="outside int4's range"):
        torch_npu.npu_convert_weight_to_int4pack(torch.full((2, 8), 9, dtype=torch.int32).npu())
    with pytest.raises(RuntimeError, match="multiple of 8"):
        torch_npu.npu_convert_weight_to_int4pack(torch.zeros(2, 4, dtype=torch.int32).npu())


# ---- torch.compile and fake tensors ------------------------------------------------------

def compile_cases():
    torch.manual_seed(0)
    x = distinct_logits(8, 8, torch.float32).npu()
    idx = torch.randint(0, 8, (8, 2), dtype=torch.int32).npu()
    w = torch.randn(8, 8, 4).npu()
    gl = torch.tensor([2, 4, 6, 8, 10, 12, 14, 16]).npu()
    xq, s = torch_npu.npu_dynamic_quant(x.half())
    wq = torch.randint(-8, 8, (8, 16), dtype=torch.int32).npu()
    return [
        ("gating", lambda: torch_npu.npu_moe_gating_top_k_softmax(x, k=2)),
        ("routing", lambda: torch_npu.npu_moe_init_routing_v2(x, idx, expert_num=8, expert_tokens_num_flag=True,
                                                              expert_tokens_num_type=1, active_num=12,
                                                              quant_mode=-1)),
        ("gmm", lambda: torch_npu.npu_grouped_matmul([torch.cat([x, x])], [w], group_list=gl, group_type=0,
                                                     split_item=3)),
        ("gmm_list", lambda: torch_npu.npu_grouped_matmul([x, x], [w[0], w[1]], group_type=-1)),
        ("unpermute", lambda: torch_npu.npu_moe_token_unpermute(torch.cat([x, x]), torch.arange(16).int().npu(),
                                                                x[:, :2])),
        ("permute", lambda: torch_npu.npu_moe_token_permute(x, idx, 12)),
        ("dynamic_quant", lambda: torch_npu.npu_dynamic_quant(x.bfloat16())),
        ("quant_matmul", lambda: torch_npu.npu_quant_matmul(xq, xq.t(), s.bfloat16(), pertoken_scale=s,
                                                            output_dtype=torch.bfloat16)),
        ("int4pack", lambda: torch_npu.npu_convert_weight_to_int4pack(wq)),
        ("trans_quant_param", lambda: torch_npu.npu_trans_quant_param(s[:4], s[:4] * 100)),
    ]


COMPILE_CASES = ["gating", "routing", "gmm", "gmm_list", "unpermute", "permute", "dynamic_quant", "quant_matmul",
                 "int4pack", "trans_quant_param"]


@pytest.mark.parametrize("name", COMPILE_CASES)
def test_compile_traces_and_matches_eager(name):
    # The cases' npu tensors are made here, not at collection: they must not outlive the test.
    cases = dict(compile_cases())
    assert list(cases) == COMPILE_CASES
    call = cases[name]
    torch._dynamo.reset()
    eager = call()
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)()
    flat_e = eager if isinstance(eager, (tuple, list)) else [eager]
    flat_c = compiled if isinstance(compiled, (tuple, list)) else [compiled]
    for e, c in zip(flat_e, flat_c):
        assert e.shape == c.shape and e.dtype == c.dtype
        assert torch.equal(e.cpu(), c.cpu())


def test_compile_moe_layer_forward_and_backward():
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = moe_w8a8.MoE(hidden=16, ffn=32, experts=4).npu()
    x = torch.randn(8, 16).npu()
    eager = layer(x)
    eager.sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
    compiled.sum().backward()
    torch.testing.assert_close(compiled, eager)
    for p, g in zip(layer.parameters(), grads):
        torch.testing.assert_close(p.grad, g)


def test_opcheck_fake_tensors():
    x = torch.randn(6, 8).npu()
    idx = torch.randint(0, 4, (6, 2), dtype=torch.int32).npu()
    xq = torch.randint(-5, 5, (6, 8), dtype=torch.int8).npu()
    cases = [
        (ops.npu_moe_gating_top_k_softmax.default, (x, None, 2), {}),
        (ops.npu_moe_init_routing_v2.default, (x, idx), dict(expert_num=4, drop_pad_mode=1, expert_capacity=3,
                                                               expert_tokens_num_flag=True, expert_tokens_num_type=1,
                                                               quant_mode=-1)),
        (ops.npu_moe_token_unpermute.default, (torch.randn(12, 8).npu(), torch.randperm(12).int().npu(),
                                               torch.rand(6, 2).npu()), {}),
        (ops.npu_moe_token_permute.default, (x, idx, 10), {}),
        (ops.npu_dynamic_quant.default, (x.half(),), dict(dst_type=torch.quint4x2)),
        (ops.npu_quant_matmul.default, (xq, xq.t(), torch.rand(6).npu()), dict(output_dtype=torch.float16)),
    ]
    for op, args, kwargs in cases:
        result = torch.library.opcheck(op, args, kwargs, test_utils=("test_schema", "test_faketensor"))
        assert set(result.values()) == {"SUCCESS"}, (op, result)


PROJECTION_RUN = r"""
import json, torch, torch_npu
from torch_npu.profiler import ProfilerActivity, profile
from torch_npu.profiler._analyse import projections
x8 = torch.randint(-128, 128, (512, 1024), dtype=torch.int8).npu()
w8 = torch.randint(-128, 128, (1024, 1024), dtype=torch.int8).npu()
xf, w = torch.randn(512, 1024).half().npu(), torch.randn(4, 1024, 512).half().npu()
group_list = torch.tensor([128, 256, 384, 512]).npu()
torch.npu.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as prof:
    torch_npu.npu_quant_matmul(x8, w8, torch.rand(1024).npu(), output_dtype=torch.float16)
    torch_npu.npu_grouped_matmul([xf], [w], group_list=group_list, group_type=0, split_item=3)
    torch_npu.npu_dynamic_quant(xf)
    torch.npu.synchronize()
print(json.dumps({"cost": torch_npu._emu.profiles.active().cost,
                  "projected": {p.name: p.projected_ns for p in projections(prof)}}))
"""


def test_projected_times_under_a_chip_profile():
    """Under a chip profile the profiler projects the matmuls onto the cube unit (int8 at its
    int8 rate), the others as memory traffic."""
    out = json.loads(last_line(run_python(PROJECTION_RUN, env={"NPU_EMU_PROFILE": "ascend910b2"}, timeout=300)))
    cost, projected = out["cost"], out["projected"]
    launch_ns = cost["kernel_overhead_us"] * 1e3
    compute_ns = 2 * 512 * 1024 * 1024 / (cost["cube_int8_tops"] * 1e3)
    memory_ns = (512 * 1024 + 1024 * 1024 + 1024 * 4) / cost["memory_gbps"]
    assert compute_ns > memory_ns
    assert abs(projected["npu_quant_matmul"] - (launch_ns + compute_ns)) <= 1
    gmm_compute = 2 * 512 * 1024 * 512 / (cost["cube_fp16_tflops"] * 1e3)
    gmm_memory = (512 * 1024 * 2 + 4 * 1024 * 512 * 2 + 4 * 8) / cost["memory_gbps"]
    assert abs(projected["npu_grouped_matmul"] - (launch_ns + max(gmm_compute, gmm_memory))) <= 1
    assert projected["npu_dynamic_quant"] > launch_ns


# ---- end to end (examples/moe_w8a8.py) -----------------------------------------------------

def test_moe_layer_trains_like_the_dense_expert_loop():
    worst_out, worst_grad = moe_w8a8.train_moe(steps=3, tokens=16, log=lambda *_: None)
    assert worst_out < 1e-5 and worst_grad < 1e-5


def test_w8a8_linear_within_int8_rounding():
    vs_fake, vs_float = moe_w8a8.check_w8a8(tokens=16)
    assert vs_fake < 3e-2        # the fake-quant reference up to bfloat16 rounding of y
    assert vs_float <= 1.0       # the float layer within the int8 rounding bound
