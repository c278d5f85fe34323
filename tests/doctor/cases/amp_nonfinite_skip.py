# doctor-case: autocast training that skips a step with `if not torch.isfinite(loss):` (a host read every step)
# loop: amp
# expect: hidden_sync @ 21
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Conv1d(4, 16, 5, padding=2), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 32, 3)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
scaler = torch.amp.GradScaler(device)
signals = torch.randn(360, 4, 32)
labels = torch.randint(0, 3, (360,))

for step in range(12):
    xb = signals[step * 30:(step + 1) * 30].to(device)
    yb = labels[step * 30:(step + 1) * 30].to(device)
    with torch.autocast(device_type=device, dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(xb), yb)
    if not torch.isfinite(loss):
        optimizer.zero_grad()
        continue
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

print("loss", loss.item())
