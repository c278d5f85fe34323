# doctor-case: clean training of a torch.compile'd model: no host reads in the loop, loss read once at the end
# loop: compile
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1)).to(device)
compiled = torch.compile(model)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
X = torch.randn(320, 16)
Y = X.pow(2).sum(dim=1, keepdim=True)

for step in range(10):
    xb, yb = X[step * 32:(step + 1) * 32].to(device), Y[step * 32:(step + 1) * 32].to(device)
    loss = nn.functional.mse_loss(compiled(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("final loss", loss.item())
