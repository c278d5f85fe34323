# doctor-case: random features rebuilt on the host and moved every step: w = torch.randn(n, n); w = w.to(device)
# loop: training
# expect: host_to_device_copy @ 22|21
import math

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
n = 256

head = nn.Linear(n, 1).to(device)
optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
X = torch.randn(512, n)
y = torch.sign(X[:, :4].sum(dim=1, keepdim=True))

for step in range(10):
    xb = X[(step % 8) * 64:(step % 8 + 1) * 64].to(device)
    yb = y[(step % 8) * 64:(step % 8 + 1) * 64].to(device)
    w = torch.randn(n, n)
    w = w.to(device)
    feats = torch.cos(xb @ w / math.sqrt(n))
    loss = nn.functional.soft_margin_loss(head(feats), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
