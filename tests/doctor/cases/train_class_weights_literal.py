# doctor-case: class weights rebuilt from a Python list with torch.tensor(..., device=device) inside the loop
# loop: training
# expect: host_to_device_copy @ 18
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
X = torch.randn(480, 16)
Y = torch.randint(0, 3, (480,))

for step in range(12):
    xb = X[step * 40:(step + 1) * 40].to(device)
    yb = Y[step * 40:(step + 1) * 40].to(device)
    criterion = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 3.0, 0.5], device=device))
    loss = criterion(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
