"""An RWKV-7 ("Goose") decoder's single-token step, written from the paper's
description (Peng et al., 2025, "RWKV-7 Goose with Expressive Dynamic State
Evolution", section 4): per layer a time mix (token shift with six
interpolations, r/k/v projections, the decay, in-context learning rate, value
residual and gate low-rank MLPs, the generalised delta rule on a per-head state,
a group norm and a bonus term) and a channel mix (token shift, squared ReLU).
Random weights: the workload's shape, not its output, is what is measured.

Used by validate_cost_model.py to project a decode step onto a chip and compare
with the published measurements of the same shapes (0.1B: 12 layers of 768;
1.5B: 24 layers of 2048; heads of 64, vocabulary 65536)."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Config:
    layers: int
    width: int
    head_size: int = 64
    vocab: int = 65536
    decay_lora: int = 64    # the low-rank widths of the paper's table of model sizes
    iclr_lora: int = 64
    value_lora: int = 32
    gate_lora: int = 128

    @property
    def heads(self):
        return self.width // self.head_size


RWKV7_0_1B = Config(layers=12, width=768)
RWKV7_1_5B = Config(layers=24, width=2048, decay_lora=96, iclr_lora=96, value_lora=64, gate_lora=256)


class Layer:
    def __init__(self, cfg, index, device, dtype, generator):
        d, h = cfg.width, cfg.heads

        def w(*shape, scale=0.02):
            return (torch.randn(*shape, generator=generator) * scale).to(device=device, dtype=dtype)

        self.index = index
        self.ln1 = (torch.ones(d, device=device, dtype=dtype), torch.zeros(d, device=device, dtype=dtype))
        self.ln2 = (torch.ones(d, device=device, dtype=dtype), torch.zeros(d, device=device, dtype=dtype))
        self.mix = {name: w(d, scale=0.5) for name in ("r", "w", "k", "v", "a", "g")}
        self.W_r, self.W_k, self.W_v, self.W_o = w(d, d), w(d, d), w(d, d), w(d, d)
        self.w0, self.w1, self.w2 = w(d), w(d, cfg.decay_lora), w(cfg.decay_lora, d)
        self.a0, self.a1, self.a2 = w(d), w(d, cfg.iclr_lora), w(cfg.iclr_lora, d)
        self.v0, self.v1, self.v2 = w(d), w(d, cfg.value_lora), w(cfg.value_lora, d)
        self.g1, self.g2 = w(d, cfg.gate_lora), w(cfg.gate_lora, d)
        self.k_k, self.k_a, self.r_k = w(d, scale=1.0), w(d, scale=1.0), w(h, cfg.head_size, scale=1.0)
        self.ln_x = (torch.ones(d, device=device, dtype=dtype), torch.zeros(d, device=device, dtype=dtype))
        self.cmix_k = w(d, scale=0.5)
        self.ffn_key, self.ffn_value = w(d, 4 * d), w(4 * d, d)

    def time_mix(self, x, shift, state, v_first, cfg):
        B, H, N = x.shape[0], cfg.heads, cfg.head_size
        xx = shift - x
        xr, xw, xk, xv, xa, xg = (x + xx * self.mix[n] for n in ("r", "w", "k", "v", "a", "g"))
        r, k, v = xr @ self.W_r, xk @ self.W_k, xv @ self.W_v
        w = torch.exp(-0.606531 * torch.sigmoid(self.w0 + torch.tanh(xw @ self.w1) @ self.w2))   # decay in (0, 1)
        a = torch.sigmoid(self.a0 + (xa @ self.a1) @ self.a2)                                  # in-context rate
        if self.index == 0:
            v_first = v
        else:                                                                                # value residual
            v = v + (v_first - v) * torch.sigmoid(self.v0 + (xv @ self.v1) @ self.v2)
        g = torch.sigmoid(xg @ self.g1) @ self.g2
        kk = F.normalize((k * self.k_k).view(B, H, N), dim=-1).view(B, -1)
        k = k * (1 + (a - 1) * self.k_a)
        # The generalised delta rule: S = S diag(w) - (S kk) (kk a)^T + v k^T, out = S r.
        r_, w_, k_, v_, kk_, a_ = (t.view(B, H, N, 1) for t in (r, w, k, v, kk, a))
        state = state * w_.transpose(-1, -2) + (state @ -kk_) @ (kk_ * a_).transpose(-1, -2) + v_ @ k_.transpose(-1, -2)
        out = (state @ r_).view(B, H * N)
        out = F.group_norm(out, H, *self.ln_x, eps=64e-5)
        out = out + ((r_ * k_).view(B, H, N) * self.r_k).sum(-1, keepdim=True).mul(v.view(B, H, N)).view(B, -1)
        return (out * g) @ self.W_o, x, state, v_first

    def channel_mix(self, x, shift):
        k = x + (shift - x) * self.cmix_k
        return torch.relu(k @ self.ffn_key).square() @ self.ffn_value, x


class RWKV7:
    """The model's weights and a decode step: ``step(tokens, state) -> (logits, state)``."""

    def __init__(self, cfg, device="npu", dtype=torch.float16, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.cfg, self.device, self.dtype = cfg, device, dtype
        d = cfg.width
        self.emb = (torch.randn(cfg.vocab, d, generator=g) * 0.02).to(device=device, dtype=dtype)
        self.ln0 = (torch.ones(d, device=device, dtype=dtype), torch.zeros(d, device=device, dtype=dtype))
        self.ln_out = (torch.ones(d, device=device, dtype=dtype), torch.zeros(d, device=device, dtype=dtype))
        self.head = (torch.randn(d, cfg.vocab, generator=g) * 0.02).to(device=device, dtype=dtype)
        self.layers = [Layer(cfg, i, device, dtype, g) for i in range(cfg.layers)]

    def new_state(self, batch):
        cfg = self.cfg
        zeros = lambda *s: torch.zeros(*s, device=self.device, dtype=self.dtype)   # noqa: E731
        return [(zeros(batch, cfg.width), zeros(batch, cfg.heads, cfg.head_size, cfg.head_size), zeros(batch, cfg.width))
                for _ in range(cfg.layers)]

    def step(self, tokens, state):
        d = self.cfg.width
        x = F.layer_norm(self.emb[tokens], (d,), *self.ln0)
        v_first = None
        new_state = []
        for layer, (shift_t, wkv, shift_c) in zip(self.layers, state):
            h = F.layer_norm(x, (d,), *layer.ln1)
            out, shift_t, wkv, v_first = layer.time_mix(h, shift_t, wkv, v_first, self.cfg)
            x = x + out
            h = F.layer_norm(x, (d,), *layer.ln2)
            out, shift_c = layer.channel_mix(h, shift_c)
            x = x + out
            new_state.append((shift_t, wkv, shift_c))
        return F.layer_norm(x, (d,), *self.ln_out) @ self.head, new_state
