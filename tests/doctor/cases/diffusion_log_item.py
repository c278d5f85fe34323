# doctor-case: sampling loop logs the sample statistics with .item() at every denoising step
# loop: diffusion
# expect: hidden_sync @ 17
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(33, 128), nn.SiLU(), nn.Linear(128, 32)).to(device).eval()
num_steps = 10
x = torch.randn(256, 32, device=device)
with torch.no_grad():
    for i in range(num_steps):
        t = torch.full((x.shape[0], 1), 1.0 - i / num_steps, device=device)
        x = x - 0.1 * model(torch.cat([x, t], dim=1))
        print(f"step {i}: |x| = {x.abs().mean().item():.4f}")
