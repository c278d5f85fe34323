# doctor-case: training with a validation pass after each epoch that calls .item() on every validation batch
# loop: validation
# expect: hidden_sync @ 34
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

train_set = TensorDataset(torch.randn(128, 20), torch.randint(0, 4, (128,)))
val_set = TensorDataset(torch.randn(192, 20), torch.randint(0, 4, (192,)))
train_loader = DataLoader(train_set, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
val_loader = DataLoader(val_set, batch_size=24)

model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()

for epoch in range(3):
    model.train()
    for xb, yb in train_loader:
        xb, yb = xb.to(device), yb.to(device)
        loss = criterion(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    model.eval()
    val_loss = 0.0
    with torch.no_grad():
        for xv, yv in val_loader:
            xv, yv = xv.to(device), yv.to(device)
            val_loss += criterion(model(xv), yv).item()
    print(f"epoch {epoch}: val loss {val_loss / len(val_loader):.4f}")
