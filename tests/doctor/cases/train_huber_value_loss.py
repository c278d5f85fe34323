# doctor-case: a value network regressed with F.huber_loss: the chip has no huber_loss kernel
# loop: training
# expect: cpu_fallback @ 19
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

value_net = nn.Sequential(nn.Linear(12, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
optimizer = torch.optim.Adam(value_net.parameters(), lr=3e-4)
states = torch.randn(512, 12)
returns = states[:, :3].sum(1, keepdim=True)

for step in range(16):
    idx = torch.randint(0, 512, (32,))
    s, g = states[idx].to(device), returns[idx].to(device)
    loss = F.huber_loss(value_net(s), g, delta=1.0)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
