# doctor-case: clean Euler sampler for a flow model: timesteps precomputed on the device, under torch.no_grad()
# loop: diffusion
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class VelocityNet(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim + 1, 128), nn.SiLU(), nn.Linear(128, dim))

    def forward(self, x, t):
        return self.net(torch.cat([x, t.expand(x.shape[0], 1)], dim=1))


model = VelocityNet().to(device).eval()
ts = torch.linspace(0.0, 1.0, 11, device=device)
x = torch.randn(256, 32, device=device)
with torch.no_grad():
    for i in range(10):
        dt = ts[i + 1] - ts[i]
        x = x + dt * model(x, ts[i].view(1, 1))

print("mean", x.mean().item(), "std", x.std().item())
