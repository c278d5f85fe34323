# doctor-case: sampler draws noise by inverse CDF with torch.special.ndtri (no npu kernel) every step
# loop: diffusion
# expect: cpu_fallback @ 17
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(8, 64), nn.SiLU(), nn.Linear(64, 8)).to(device).eval()
sigmas = torch.linspace(1.0, 0.05, 11, device=device)
x = torch.randn(512, 8, device=device) * sigmas[0]
with torch.no_grad():
    for i in range(10):
        denoised = x - sigmas[i] * model(x / (1 + sigmas[i] ** 2).sqrt())
        u = torch.rand_like(x).clamp(1e-6, 1 - 1e-6)
        noise = torch.special.ndtri(u)
        x = denoised + sigmas[i + 1] * noise

print("std", x.std().item())
