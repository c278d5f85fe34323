# doctor-case: data-dependent branch: keeps the best weights with `if loss < best_loss:` every step
# loop: training
# expect: hidden_sync @ 26
import copy

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
X = torch.randn(256, 10)
Y = (X ** 2).sum(dim=1, keepdim=True)

best_loss = float("inf")
best_state = None
for step in range(12):
    i = (step % 8) * 32
    xb, yb = X[i:i + 32].to(device), Y[i:i + 32].to(device)
    loss = nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if loss < best_loss:
        best_loss = loss.detach()
        best_state = copy.deepcopy(model.state_dict())

model.load_state_dict(best_state)
print("best", float(best_loss))
