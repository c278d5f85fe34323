# doctor-case: training accuracy computed in numpy: predictions moved with .cpu().numpy() every step
# loop: training
# expect: hidden_sync @ 29
import numpy as np
import torch
import torch.nn as nn

rng = np.random.default_rng(0)
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

x_np = rng.normal(size=(400, 16)).astype(np.float32)
y_np = (x_np[:, 0] + x_np[:, 1] > 0).astype(np.int64)

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
loss_fn = nn.CrossEntropyLoss()

correct = seen = 0
for step in range(12):
    idx = rng.choice(400, size=50, replace=False)
    xb = torch.from_numpy(x_np[idx]).to(device)
    yb = torch.from_numpy(y_np[idx]).to(device)
    logits = model(xb)
    loss = loss_fn(logits, yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    preds = logits.argmax(dim=1).cpu().numpy()
    correct += int((preds == y_np[idx]).sum())
    seen += len(idx)

print(f"train accuracy {correct / seen:.3f}")
