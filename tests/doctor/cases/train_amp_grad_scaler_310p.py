# doctor-case: mixed precision with float16 autocast and a GradScaler on a 310P: scaled gradients overflow by design and the scaler handles it (no overflow finding), but the profile's 310P lacks _amp_update_scale_ (its only kernel is aclnn), so scaler.update() falls back
# loop: amp
# target: ascend310p3
# expect: cpu_fallback @ 21
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler(device)
x_all, y_all = torch.randn(384, 32), torch.randint(0, 4, (384,))
for step in range(12):
    x, y = x_all[step * 32:(step + 1) * 32].to(device), y_all[step * 32:(step + 1) * 32].to(device)
    with torch.autocast(device_type=device, dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
