"""Train a small character-level transformer language model on Shakespeare.

A decoder-only transformer (2 layers, width 96, 4 heads, context 64) learns to
predict the next character of examples/data/shakespeare.txt. It is written like
an ordinary CUDA script: the whole encoded text is moved to the device once and
batches are sampled there, so the only thing crossing to the host is the loss at
logging steps. At the end it prints a short greedy sample.

    python examples/train_lm.py                 # cuda if available, else cpu
    python examples/train_lm.py --device npu    # the emulated npu (torch_npu)
    python -m torch_npu.doctor examples/train_lm.py
"""
import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shakespeare.txt")
CONTEXT, WIDTH, HEADS, LAYERS = 64, 96, 4, 2


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class CharLM(nn.Module):
    def __init__(self, vocab, width=WIDTH, heads=HEADS, layers=LAYERS, context=CONTEXT):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):  # (batch, time) -> (batch, time, vocab) logits
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(x)))


def load_text(path=DATA):
    """The text as a uint8 tensor of character ids, and the id -> character table."""
    with open(path, encoding="ascii") as f:
        text = f.read()
    chars = sorted(set(text))
    lut = torch.zeros(256, dtype=torch.uint8)
    lut[[ord(ch) for ch in chars]] = torch.arange(len(chars), dtype=torch.uint8)
    raw = torch.frombuffer(bytearray(text, "ascii"), dtype=torch.uint8)
    return lut[raw.long()], chars


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda, cpu, npu, ... (default: cuda if available)")
    parser.add_argument("--steps", type=int, default=1400, help="about a minute on the npu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=None, help="default: steps // 10")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    log_every = args.log_every or max(1, args.steps // 10)

    torch.manual_seed(args.seed)
    data, chars = load_text()
    data = data.to(device)  # the whole dataset, once
    offsets = torch.arange(CONTEXT + 1, device=device)
    gen = torch.Generator(device=device).manual_seed(args.seed)

    model = CharLM(len(chars)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    print(f"device {device}, {len(data):,} characters, vocab {len(chars)}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters")

    losses = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(data) - CONTEXT - 1, (args.batch, 1), device=device, generator=gen)
        chunk = data[starts + offsets].long()  # (batch, CONTEXT + 1)
        inputs, targets = chunk[:, :-1], chunk[:, 1:]
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step == 1 or step % log_every == 0 or step == args.steps:
            losses.append(loss.item())
            print(f"step {step:5d}  loss {losses[-1]:.3f}  ({time.perf_counter() - start:.1f}s)")

    model.eval()
    with torch.no_grad():
        prompt = "ROMEO:"
        tokens = torch.tensor([[chars.index(ch) for ch in prompt]], device=device)
        for _ in range(40):
            next_token = model(tokens[:, -CONTEXT:])[:, -1].argmax(dim=-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], dim=1)
    print("sample:", repr("".join(chars[i] for i in tokens[0].tolist())))
    return {"losses": losses, "final_loss": losses[-1]}


if __name__ == "__main__":
    main()
