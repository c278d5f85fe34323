"""Small models written the way eager PyTorch code is: a GPT-style decoder (RMSNorm,
SwiGLU MLP, rotary embeddings, causal attention), a ResNet-style CNN and a
ViT-style encoder. Used by the compile tests and benchmarks/bench_models.py.

    model, make_batch, loss_fn = zoo.build("gpt", device="npu")
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).transpose(1, 3).unbind(2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        gate, value = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * value)


class DecoderBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = SwiGLU(dim, 2 * dim)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab=64, dim=64, heads=4, layers=2, context=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        half = dim // heads // 2
        freqs = 1.0 / (10000 ** (torch.arange(half) / half))
        angles = torch.arange(context)[:, None] * freqs[None, :]
        self.register_buffer("cos", torch.cat((angles.cos(), angles.cos()), -1), persistent=False)
        self.register_buffer("sin", torch.cat((angles.sin(), angles.sin()), -1), persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


class ResidualBlock(nn.Module):
    def __init__(self, channels, stride=1):
        super().__init__()
        out = channels * stride
        self.conv1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.skip = (nn.Sequential(nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                     if stride != 1 else nn.Identity())

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.skip(x))


class ResNet(nn.Module):
    def __init__(self, classes=10, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layers = nn.Sequential(ResidualBlock(width), ResidualBlock(width, 2), ResidualBlock(2 * width, 2))
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x):
        return self.head(self.layers(self.stem(x)).mean((2, 3)))


class ViT(nn.Module):
    def __init__(self, classes=10, dim=64, heads=4, layers=2, patch=4, image=16):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.position = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True,
                                           activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), 1) + self.position
        return self.head(self.encoder(x)[:, 0])


def build(name, device="npu", batch=8, seed=0):
    """(model, make_batch(step) -> inputs, targets, loss_fn) for "gpt", "resnet" or "vit"."""
    torch.manual_seed(seed)
    if name == "gpt":
        model, context = GPT(), 32

        def make_batch(step):
            g = torch.Generator().manual_seed(seed * 1000 + step)
            tokens = torch.randint(0, 64, (batch, context + 1), generator=g)
            return tokens[:, :-1].to(device), tokens[:, 1:].to(device)

        def loss_fn(logits, targets):
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    elif name in ("resnet", "vit"):
        model = ResNet() if name == "resnet" else ViT()

        def make_batch(step):
            g = torch.Generator().manual_seed(seed * 1000 + step)
            return (torch.randn(batch, 3, 16, 16, generator=g).to(device),
                    torch.randint(0, 10, (batch,), generator=g).to(device))

        loss_fn = F.cross_entropy
    else:
        raise ValueError(f"zoo.build: unknown model {name!r}; choose 'gpt', 'resnet' or 'vit'")
    return model.to(device), make_batch, loss_fn


def parameters_count(model):
    return sum(p.numel() for p in model.parameters())


__all__ = ["GPT", "ResNet", "ViT", "RMSNorm", "SwiGLU", "build", "parameters_count"]
