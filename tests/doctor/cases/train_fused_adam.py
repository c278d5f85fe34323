# doctor-case: Adam with fused=True for speed: the chip has no _fused_adam_ kernel, so every step's update falls back
# loop: training
# expect: cpu_fallback @ 17
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 10)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
x_all, y_all = torch.randn(512, 32), torch.randint(0, 10, (512,))
for step in range(16):
    x, y = x_all[step * 32:(step + 1) * 32].to(device), y_all[step * 32:(step + 1) * 32].to(device)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
