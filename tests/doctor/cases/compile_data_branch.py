# doctor-case: compiled function with a data-dependent branch `if x.norm() > 10:` (graph break and host read per call)
# loop: compile
# expect: hidden_sync @ 16
# expect: compile @ 16
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
proj = nn.Linear(32, 32).to(device)


@torch.compile
def step_fn(x):
    y = torch.tanh(proj(x))
    if y.norm() > 10.0:
        y = y / y.norm()
    return y


x = torch.randn(64, 32, device=device)
with torch.no_grad():
    for _ in range(10):
        x = x + step_fn(x)

print("norm", x.norm().item())
