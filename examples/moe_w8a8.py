"""A mixture-of-experts layer and a W8A8 linear layer, written with the Ascend adapter's npu_* ops.

1. MoE: the router's top-k softmax (npu_moe_gating_top_k_softmax), the tokens sorted by
   expert (npu_moe_init_routing_v2), each expert's FFN as grouped matmuls
   (npu_grouped_matmul), the weighted sum back in token order (npu_moe_token_unpermute).
   Trained for a few SGD steps beside the dense per-expert loop on the cpu: outputs and
   gradients agree at every step.
2. W8A8: activations quantized per token (npu_dynamic_quant), weights per channel, the
   int8 matmul dequantized in one op (npu_quant_matmul), against the fake-quantized float
   computation and the float layer.

    python examples/moe_w8a8.py [--steps 5] [--tokens 16]
"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_npu


class MoE(nn.Module):
    """top-k routed experts, each ``silu(x @ up) @ down``."""

    def __init__(self, hidden=64, ffn=128, experts=8, top_k=2):
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.up = nn.Parameter(torch.randn(experts, hidden, ffn) * hidden ** -0.5)
        self.down = nn.Parameter(torch.randn(experts, ffn, hidden) * ffn ** -0.5)

    def forward(self, x):
        """With the npu's fused MoE ops; x is [tokens, hidden]."""
        tokens = x.shape[0]
        weights, expert_idx, _ = torch_npu.npu_moe_gating_top_k_softmax(self.router(x), k=self.top_k)
        expanded, row_idx, counts, _ = torch_npu.npu_moe_init_routing_v2(
            x, expert_idx, active_num=tokens * self.top_k, expert_num=self.experts,
            expert_tokens_num_type=1, expert_tokens_num_flag=True, quant_mode=-1)
        h = torch_npu.npu_grouped_matmul([expanded], [self.up], group_list=counts, group_list_type=1,
                                         group_type=0, split_item=3)[0]
        y = torch_npu.npu_grouped_matmul([F.silu(h)], [self.down], group_list=counts, group_list_type=1,
                                         group_type=0, split_item=3)[0]
        return torch_npu.npu_moe_token_unpermute(y, row_idx, weights)

    def forward_dense(self, x):
        """The same layer as a loop over the experts, in plain PyTorch."""
        weights, expert_idx = torch.softmax(self.router(x), dim=-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(x)
        for e in range(self.experts):
            token, slot = (expert_idx == e).nonzero(as_tuple=True)
            y = F.silu(x[token] @ self.up[e]) @ self.down[e]
            out = out.index_add(0, token, y * weights[token, slot, None])
        return out


def train_moe(steps=5, tokens=16, lr=0.1, seed=0, log=print):
    """SGD on the fused layer (npu) and the dense loop (cpu) from the same weights; returns the
    largest differences of the outputs and of the gradients over the steps."""
    torch.manual_seed(seed)
    dense = MoE()
    fused = copy.deepcopy(dense).npu()
    opt_dense = torch.optim.SGD(dense.parameters(), lr=lr)
    opt_fused = torch.optim.SGD(fused.parameters(), lr=lr)
    worst_out = worst_grad = 0.0
    for step in range(steps):
        x, target = torch.randn(tokens, 64), torch.randn(tokens, 64)
        xn = x.npu().requires_grad_()
        x.requires_grad_()
        out_dense, out_fused = dense.forward_dense(x), fused(xn)
        loss_dense, loss_fused = F.mse_loss(out_dense, target), F.mse_loss(out_fused, target.npu())
        for opt in (opt_dense, opt_fused):
            opt.zero_grad()
        loss_dense.backward()
        loss_fused.backward()
        worst_out = max(worst_out, (out_fused.detach().cpu() - out_dense.detach()).abs().max().item())
        grads = [(x.grad, xn.grad)] + [(p.grad, q.grad) for p, q in zip(dense.parameters(), fused.parameters())]
        worst_grad = max(worst_grad, max((b.cpu() - a).abs().max().item() for a, b in grads))
        opt_dense.step()
        opt_fused.step()
        log(f"step {step}: loss {loss_fused.item():.5f} (dense {loss_dense.item():.5f})")
    return worst_out, worst_grad


def quantize_weight(w):
    """Per output channel symmetric int8: (int8 [in, out], float32 scale [out])."""
    scale = w.abs().amax(dim=0) / 127
    return torch.round(w / scale).clamp(-128, 127).to(torch.int8), scale


def w8a8_linear(x, w_int8, w_scale, bias=None):
    """y = x @ w with int8 activations (per token) and weights (per channel), bfloat16 out."""
    x_int8, x_scale = torch_npu.npu_dynamic_quant(x)
    return torch_npu.npu_quant_matmul(x_int8, w_int8, w_scale, pertoken_scale=x_scale, bias=bias,
                                      output_dtype=torch.bfloat16)


def fake_quant_linear(x, w_int8, w_scale, bias=None):
    """The same computation in float64 on the dequantized values (the W8A8 reference)."""
    xf = x.double()
    x_scale = xf.abs().amax(dim=-1, keepdim=True) / 127
    x_fq = torch.round(xf / x_scale).clamp(-128, 127) * x_scale
    y = x_fq @ (w_int8.double() * w_scale.double())
    return y + bias.double() if bias is not None else y


def check_w8a8(tokens=16, features=(64, 128), seed=0):
    """-> (largest |y - fake-quant y|, largest |y - float y| / the int8 bound)."""
    torch.manual_seed(seed)
    x = torch.randn(tokens, features[0]).bfloat16()
    w = torch.randn(*features) * features[0] ** -0.5
    bias = torch.randn(features[1]).bfloat16()
    w_int8, w_scale = quantize_weight(w)
    y = w8a8_linear(x.npu(), w_int8.npu(), w_scale.npu(), bias.npu()).cpu().double()
    vs_fake = (y - fake_quant_linear(x, w_int8, w_scale, bias)).abs().max().item()
    exact = x.double() @ w.double() + bias.double()
    # |x w - x_fq w_fq| <= |x| |dw| + |w| |dx| + |dx| |dw|, with |dx| <= x_scale / 2, |dw| <= w_scale / 2
    xa, wa = x.double().abs(), w.double().abs()
    half_x, half_w = xa.amax(-1, keepdim=True) / 254, w_scale.double() / 2
    bound = xa.sum(-1, keepdim=True) * half_w + half_x * wa.sum(0) + features[0] * half_x * half_w
    vs_float = ((y - exact).abs() / (bound + 0.01 * exact.abs() + 1e-2)).max().item()
    return vs_fake, vs_float


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args(argv)
    worst_out, worst_grad = train_moe(args.steps, args.tokens)
    print(f"MoE, fused npu ops vs dense loop: max |output diff| {worst_out:.2e}, max |grad diff| {worst_grad:.2e}")
    vs_fake, vs_float = check_w8a8(args.tokens)
    print(f"W8A8: max |y - fake-quant y| {vs_fake:.2e} (bfloat16 rounding); "
          f"|y - float y| at most {vs_float:.2f} of the int8 rounding bound")


if __name__ == "__main__":
    main()
