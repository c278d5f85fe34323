# doctor-case: clean training loop: pinned host data, one non_blocking copy per step, loss read every 4 steps
# loop: training
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
X = torch.randn(768, 32).pin_memory()
Y = X[:, :1].clone().pin_memory()

for step in range(12):
    xb = X[step * 64:(step + 1) * 64].to(device, non_blocking=True)
    yb = Y[step * 64:(step + 1) * 64].to(device, non_blocking=True)
    loss = nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 4 == 0:
        print(f"step {step}: loss {loss.item():.4f}")
