# doctor-case: mixed-precision training that logs scaler.get_scale() (a host read) every step
# loop: amp
# expect: hidden_sync @ 26
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda"

model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda")
X = torch.randn(384, 64)
Y = torch.randint(0, 10, (384,))
scales = []

for step in range(12):
    xb = X[step * 32:(step + 1) * 32].to(device, non_blocking=True)
    yb = Y[step * 32:(step + 1) * 32].to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(xb), yb)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    scales.append(scaler.get_scale())

print("scales", scales[-3:])
