# doctor-case: loss history kept as tensors: history.append(loss) keeps every step's autograd graph alive
# loop: training
# expect: memory_growth @ 21|17
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
history = []

for step in range(12):
    x = torch.randn(128, 64, device=device)
    y = x.sum(dim=1, keepdim=True)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history.append(loss)

print("losses", len(history))
