# doctor-case: a learned exponential smoother written as a Python loop over 64 time steps inside forward
# loop: training
# expect: launch_bound @ 21|20
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class Smoother(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((features,), 0.8))
        self.out = nn.Linear(features, 1)

    def forward(self, x):                      # x: (batch, time, features)
        h = torch.zeros_like(x[:, 0])
        states = []
        for t in range(x.shape[1]):
            h = self.alpha * h + (1 - self.alpha) * x[:, t]
            states.append(h)
        return self.out(torch.stack(states, dim=1)).squeeze(-1)


model = Smoother(8).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
series = torch.randn(256, 64, 8).cumsum(dim=1) * 0.1
target = series.mean(dim=2)

for step in range(8):
    xb = series[step * 32:(step + 1) * 32].to(device)
    yb = target[step * 32:(step + 1) * 32].to(device)
    loss = nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
