# doctor-case: physics-style fit: polynomial coefficients made with torch.tensor(python_floats, dtype=torch.float64)
# loop: training
# expect: float64 @ 11
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

poly_coeffs = [0.5, -1.25, 0.75, 0.1]
coeffs = torch.tensor(poly_coeffs, dtype=torch.float64, device=device)

net = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)

for step in range(10):
    x = torch.linspace(-1, 1, 128, device=device).unsqueeze(1)
    powers = torch.cat([x ** k for k in range(len(poly_coeffs))], dim=1)
    target = (powers * coeffs).sum(dim=1, keepdim=True)
    loss = ((net(x) - target) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
