# doctor-case: numpy float64 batches, and the model made .double() to match them (float64 everywhere)
# loop: training
# expect: float64 @ 20|15
import numpy as np
import torch
import torch.nn as nn

rng = np.random.default_rng(1)
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(1)

X_np = rng.uniform(-1, 1, size=(360, 4))
y_np = np.sin(X_np).sum(axis=1, keepdims=True)

model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)).double().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

for step in range(10):
    batch = slice(step * 36, (step + 1) * 36)
    xb = torch.from_numpy(X_np[batch]).to(device)
    yb = torch.from_numpy(y_np[batch]).to(device)
    loss = ((model(xb) - yb) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
