# doctor-case: noise schedule computed in numpy (float64) and moved to the device with torch.from_numpy
# loop: diffusion
# expect: float64 @ 13
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
T = 12

betas_np = np.linspace(1e-4, 0.02, T)
alphas_cumprod = torch.from_numpy(np.cumprod(1.0 - betas_np)).to(device)

model = nn.Sequential(nn.Linear(16, 128), nn.SiLU(), nn.Linear(128, 16)).to(device).eval()
x = torch.randn(64, 16, device=device)
with torch.no_grad():
    for t in reversed(range(T)):
        a_t = alphas_cumprod[t]
        a_prev = alphas_cumprod[t - 1] if t > 0 else torch.ones_like(a_t)
        eps = model(x)
        x0 = (x - (1 - a_t).sqrt() * eps) / a_t.sqrt()
        x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps

print("std", x.std().item())
