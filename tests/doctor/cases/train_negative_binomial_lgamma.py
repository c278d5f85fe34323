# doctor-case: count data fitted with a negative-binomial likelihood written with torch.lgamma: the chip decomposes lgamma into lgamma.out, which falls back, and digamma in the backward
# loop: training
# expect: cpu_fallback @ 17
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
net = nn.Linear(10, 2).to(device)
optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
features = torch.randn(320, 10)
counts = torch.poisson(torch.full((320,), 4.0))
for step in range(10):
    x, k = features[step * 32:(step + 1) * 32].to(device), counts[step * 32:(step + 1) * 32].to(device)
    log_mu, log_r = net(x).unbind(1)
    mu, r = log_mu.exp(), log_r.exp() + 1e-3
    log_prob = (torch.lgamma(k + r) - torch.lgamma(r) - torch.lgamma(k + 1)
                + r * (r / (r + mu)).log() + k * (mu / (r + mu)).log())
    loss = -log_prob.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
