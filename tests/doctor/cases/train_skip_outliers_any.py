# doctor-case: data-dependent branch: `if (per_sample > 5).any():` clamps outlier losses every step
# loop: training
# expect: hidden_sync @ 21
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.MSELoss(reduction="none")

X = torch.randn(384, 8)
Y = torch.randn(384, 4) * 3

for step in range(12):
    xb = X[step * 32:(step + 1) * 32].to(device, non_blocking=True)
    yb = Y[step * 32:(step + 1) * 32].to(device, non_blocking=True)
    per_sample = criterion(model(xb), yb).mean(dim=1)
    if (per_sample > 5.0).any():
        per_sample = per_sample.clamp(max=5.0)
    loss = per_sample.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("done")
