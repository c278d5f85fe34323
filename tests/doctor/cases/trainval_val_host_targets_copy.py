# doctor-case: validation set kept on the host: the same tensors are copied in at every evaluation (every 2 steps)
# loop: validation
# expect: host_to_device_copy @ 25
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(24, 48), nn.ReLU(), nn.Linear(48, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
X_train, y_train = torch.randn(384, 24), torch.randn(384, 1)
X_val, y_val = torch.randn(256, 24), torch.randn(256, 1)

val_curve = []
for step in range(12):
    xb = X_train[step * 32:(step + 1) * 32].to(device)
    yb = y_train[step * 32:(step + 1) * 32].to(device)
    loss = nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 2 == 1:
        with torch.no_grad():
            val_loss = nn.functional.mse_loss(model(X_val.to(device)), y_val.to(device))
        val_curve.append(val_loss)

print("val", torch.stack(val_curve).tolist())
