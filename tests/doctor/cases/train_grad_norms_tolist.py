# doctor-case: per-layer gradient norms logged with .tolist() after every backward
# loop: training
# expect: hidden_sync @ 23
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda"

model = nn.Sequential(nn.Linear(24, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3)).to(device)
optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
inputs = torch.randn(320, 24)
targets = torch.randint(0, 3, (320,))
grad_log = []

for step in range(10):
    sl = slice(step * 32, step * 32 + 32)
    x, y = inputs[sl].to(device), targets[sl].to(device)
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    norms = torch.stack([p.grad.norm() for p in model.parameters() if p.ndim == 2])
    grad_log.append(norms.tolist())
    optimizer.step()

print("last grad norms", [round(v, 4) for v in grad_log[-1]])
