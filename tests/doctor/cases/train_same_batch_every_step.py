# doctor-case: full-batch training on a dataset kept on the host: the same X and y are copied in every step
# loop: training
# expect: host_to_device_copy @ 18
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

X = torch.randn(200, 6)
y = (X[:, 0] * X[:, 1] > 0).long()
model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
criterion = nn.CrossEntropyLoss()

for epoch in range(12):
    optimizer.zero_grad()
    loss = criterion(model(X.to(device)), y.to(device))
    loss.backward()
    optimizer.step()

print("loss", loss.item())
