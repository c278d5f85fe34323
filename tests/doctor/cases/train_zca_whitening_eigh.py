# doctor-case: features whitened per batch with an eigendecomposition of their covariance: torch.linalg.eigh falls back on the chip
# loop: training
# expect: cpu_fallback @ 18
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
backbone = nn.Linear(40, 16).to(device)
head = nn.Linear(16, 3).to(device)
optimizer = torch.optim.SGD([*backbone.parameters(), *head.parameters()], lr=0.05)
x_all, y_all = torch.randn(384, 40), torch.randint(0, 3, (384,))
for step in range(12):
    x, y = x_all[step * 32:(step + 1) * 32].to(device), y_all[step * 32:(step + 1) * 32].to(device)
    h = backbone(x)
    h = h - h.mean(0)
    cov = h.T @ h / h.shape[0] + 1e-3 * torch.eye(16, device=device)
    eigenvalues, eigenvectors = torch.linalg.eigh(cov)
    white = h @ eigenvectors @ torch.diag(eigenvalues.rsqrt()) @ eigenvectors.T
    loss = nn.functional.cross_entropy(head(white), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
