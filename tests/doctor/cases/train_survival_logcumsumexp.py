# doctor-case: a Cox survival model whose partial likelihood uses torch.logcumsumexp: the chip decomposes it and _logcumsumexp falls back in the backward pass
# loop: training
# expect: cpu_fallback @ 17
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
risk = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
optimizer = torch.optim.Adam(risk.parameters(), lr=1e-3)
covariates = torch.randn(256, 8)
times = torch.rand(256)
for step in range(8):
    order = torch.argsort(times[step * 32:(step + 1) * 32], descending=True)
    x = covariates[step * 32:(step + 1) * 32][order].to(device)
    scores = risk(x).squeeze(1)
    log_risk_set = torch.logcumsumexp(scores, dim=0)
    loss = -(scores - log_risk_set).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
