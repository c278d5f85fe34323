# doctor-case: a VAE with a Gamma latent sampled by reparameterisation: _standard_gamma falls back on the chip, forward and backward
# loop: training
# expect: cpu_fallback @ 21
# expect: hidden_sync @ 21
import torch
import torch.nn as nn
from torch.distributions import Gamma

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class GammaVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(20, 2 * 8)
        self.dec = nn.Linear(8, 20)

    def forward(self, x):
        concentration, rate = nn.functional.softplus(self.enc(x)).chunk(2, dim=1)
        z = Gamma(concentration + 0.5, rate + 0.5).rsample()
        return self.dec(z)


model = GammaVAE().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.rand(256, 20)
for step in range(12):
    x = data[step * 16:(step + 1) * 16].to(device)
    loss = (model(x) - x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
