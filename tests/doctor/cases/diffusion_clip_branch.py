# doctor-case: data-dependent branch in the sampler: `if x.abs().max() > 3:` decides whether to clamp at each step
# loop: diffusion
# expect: hidden_sync @ 15
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

eps_model = nn.Sequential(nn.Linear(12, 96), nn.GELU(), nn.Linear(96, 12)).to(device).eval()
x = torch.randn(200, 12, device=device) * 2
with torch.no_grad():
    for t in range(10):
        x = x - 0.05 * eps_model(x)
        if x.abs().max() > 3.0:
            x = x.clamp(-3.0, 3.0)

print("max", x.abs().max().item())
