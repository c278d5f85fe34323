# doctor-case: features converted with .float(), but the numpy targets enter the device as float64 every step
# loop: training
# expect: float64 @ 21
import numpy as np
import torch
import torch.nn as nn

rng = np.random.default_rng(0)
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

X_np = rng.normal(size=(480, 10))
y_np = X_np @ rng.normal(size=(10, 1)) + 0.1 * rng.normal(size=(480, 1))

model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for step in range(12):
    idx = rng.permutation(480)[:40]
    xb = torch.from_numpy(X_np[idx]).float().to(device)
    yb = torch.from_numpy(y_np[idx]).to(device)
    loss = nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
