# doctor-case: mixed-precision training builds BCEWithLogitsLoss(pos_weight=torch.tensor([4.0]).to(device)) every step
# loop: amp
# expect: host_to_device_copy @ 20
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(device)
X = torch.randn(480, 32)
Y = (torch.rand(480, 1) < 0.2).float()

for step in range(12):
    xb, yb = X[step * 40:(step + 1) * 40].to(device), Y[step * 40:(step + 1) * 40].to(device)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        logits = model(xb)
    criterion = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([4.0]).to(device))
    loss = criterion(logits.float(), yb)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

print("loss", loss.item())
