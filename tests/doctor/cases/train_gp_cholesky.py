# doctor-case: a Gaussian process fitted by its marginal likelihood: the Cholesky factor falls back on the chip in every step
# loop: training
# expect: cpu_fallback @ 19
# expect: cpu_fallback @ 20
import math
import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.linspace(0, 6, 48, device=device).unsqueeze(1)
y = torch.sin(x).squeeze(1) + 0.1 * torch.randn(48, device=device)
log_length = torch.zeros((), device=device, requires_grad=True)
log_noise = torch.full((), -2.0, device=device, requires_grad=True)
optimizer = torch.optim.Adam([log_length, log_noise], lr=0.05)
for step in range(12):
    distance = (x - x.T).square()
    kernel = torch.exp(-0.5 * distance / log_length.exp().square())
    cov = kernel + log_noise.exp() * torch.eye(48, device=device)
    chol = torch.linalg.cholesky(cov)
    alpha = torch.cholesky_solve(y.unsqueeze(1), chol)
    nll = 0.5 * (y.unsqueeze(1) * alpha).sum() + chol.diagonal().log().sum() + 24 * math.log(2 * math.pi)
    optimizer.zero_grad()
    nll.backward()
    optimizer.step()
