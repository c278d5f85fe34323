# doctor-case: EMA of the weights updated parameter by parameter in a Python loop after every step
# loop: training
# expect: launch_bound @ 30|29
import copy

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

layers = []
for _ in range(16):
    layers += [nn.Linear(32, 32), nn.ReLU()]
model = nn.Sequential(*layers, nn.Linear(32, 1)).to(device)
ema_model = copy.deepcopy(model).requires_grad_(False)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
decay = 0.99

X = torch.randn(320, 32)
Y = X.mean(dim=1, keepdim=True)
for step in range(10):
    xb, yb = X[step * 32:(step + 1) * 32].to(device), Y[step * 32:(step + 1) * 32].to(device)
    loss = nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for ema_p, p in zip(ema_model.parameters(), model.parameters()):
            ema_p.mul_(decay).add_(p, alpha=1 - decay)

print("loss", loss.item())
