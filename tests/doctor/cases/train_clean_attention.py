# doctor-case: clean transformer training: attention's transpose(1, 2).contiguous() of fresh activations is normal
# loop: training
# expect: clean
import math

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class SelfAttention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        y = att.softmax(dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y)


model = nn.Sequential(nn.Embedding(100, 64), SelfAttention(), nn.LayerNorm(64), nn.Linear(64, 100)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
data = torch.randint(0, 100, (12, 16, 17))
for step in range(12):
    batch = data[step].to(device)
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 100), batch[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
