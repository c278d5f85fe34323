# doctor-case: sampler builds the timestep batch from a Python list every step: torch.tensor([t] * n, device=device)
# loop: diffusion
# expect: host_to_device_copy @ 25
import math

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
steps = 12


def timestep_embedding(t, dim=32):
    freqs = torch.exp(-math.log(1000.0) * torch.arange(dim // 2, device=t.device) / (dim // 2))
    args = t[:, None].float() * freqs[None]
    return torch.cat([args.sin(), args.cos()], dim=1)


net = nn.Sequential(nn.Linear(16 + 32, 128), nn.SiLU(), nn.Linear(128, 16)).to(device).eval()
n = 64
x = torch.randn(n, 16, device=device)
with torch.no_grad():
    for t in range(steps - 1, -1, -1):
        t_batch = torch.tensor([t] * n, device=device)
        eps = net(torch.cat([x, timestep_embedding(t_batch)], dim=1))
        x = x - (1.0 / steps) * eps

print("mean", x.mean().item())
