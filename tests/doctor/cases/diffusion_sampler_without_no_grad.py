# doctor-case: sampling loop run without torch.no_grad(): x = x - eps * model(x, t) chains every step's graph
# loop: diffusion
# expect: memory_growth @ 26|25
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class EpsModel(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim + 1, 512), nn.SiLU(), nn.Linear(512, dim))

    def forward(self, x, t):
        return self.net(torch.cat([x, t.expand(x.shape[0], 1)], dim=1))


model = EpsModel().to(device)
model.eval()
x = torch.randn(256, 64, device=device)
eps = 0.1
for t in torch.linspace(1.0, 0.0, 12, device=device):
    pred = model(x, t.view(1, 1))
    x = x - eps * pred

print("sample", x.mean().item())
