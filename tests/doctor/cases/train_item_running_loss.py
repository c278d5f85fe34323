# doctor-case: training loop adds loss.item() to a Python float every step
# loop: training
# expect: hidden_sync @ 25
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.MSELoss()

X = torch.randn(512, 32)
Y = X[:, :1] * 2.0 + 0.1 * torch.randn(512, 1)

running_loss = 0.0
for step in range(12):
    idx = torch.randint(0, 512, (64,))
    xb, yb = X[idx].to(device), Y[idx].to(device)
    optimizer.zero_grad()
    loss = criterion(model(xb), yb)
    loss.backward()
    optimizer.step()
    running_loss += loss.item()

print(f"mean loss {running_loss / 12:.4f}")
