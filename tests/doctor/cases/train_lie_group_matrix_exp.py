# doctor-case: rotations learned in the Lie algebra and mapped with torch.linalg.matrix_exp: it falls back on the chip
# loop: training
# expect: cpu_fallback @ 16
import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
algebra = torch.zeros(3, device=device, requires_grad=True)
optimizer = torch.optim.Adam([algebra], lr=0.05)
points = torch.randn(64, 3, device=device)
target = points @ torch.linalg.qr(torch.randn(3, 3))[0].to(device)
for step in range(15):
    a, b, c = algebra
    zero = torch.zeros((), device=device)
    skew = torch.stack([torch.stack([zero, -c, b]), torch.stack([c, zero, -a]), torch.stack([-b, a, zero])])
    rotation = torch.linalg.matrix_exp(skew)
    loss = (points @ rotation - target).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
