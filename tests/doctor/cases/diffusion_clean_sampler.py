# doctor-case: clean DDPM-style sampler: float32 schedule made on the device once, device-side noise, int timesteps
# loop: diffusion
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
T = 12


class Denoiser(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.t_embed = nn.Embedding(T, 32)
        self.net = nn.Sequential(nn.Linear(dim + 32, 256), nn.SiLU(), nn.Linear(256, dim))

    def forward(self, x, t):
        temb = self.t_embed(t).expand(x.shape[0], -1)
        return self.net(torch.cat([x, temb], dim=1))


model = Denoiser().to(device).eval()
betas = torch.linspace(1e-4, 0.02, T, device=device)
alphas = 1.0 - betas
alpha_bars = torch.cumprod(alphas, dim=0)
timesteps = torch.arange(T, device=device)

x = torch.randn(128, 64, device=device)
with torch.no_grad():
    for t in reversed(range(T)):
        eps = model(x, timesteps[t:t + 1])
        x = (x - betas[t] / (1 - alpha_bars[t]).sqrt() * eps) / alphas[t].sqrt()
        if t > 0:
            x = x + betas[t].sqrt() * torch.randn_like(x)

print("sample std", x.std().item())
