# doctor-case: clean mixed-precision training: autocast + GradScaler, loss read every 6 steps
# loop: amp
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(device)
X = torch.randn(384, 64).pin_memory()
Y = torch.randint(0, 10, (384,)).pin_memory()

for step in range(12):
    xb = X[step * 32:(step + 1) * 32].to(device, non_blocking=True)
    yb = Y[step * 32:(step + 1) * 32].to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(xb), yb)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    if step % 6 == 5:
        print(f"step {step}: loss {loss.item():.4f}")
