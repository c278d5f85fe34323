# doctor-case: NaN/inf guard `if torch.isnan(loss) or torch.isinf(loss):` evaluated every step
# loop: training
# expect: hidden_sync @ 30
import torch
import torch.nn as nn

torch.manual_seed(3)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 32), nn.SiLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


model = Regressor().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
features = torch.randn(300, 12)
target = features.sum(dim=1)
skipped = 0

for step in range(10):
    xb = features[step * 30:(step + 1) * 30].to(device)
    yb = target[step * 30:(step + 1) * 30].to(device)
    loss = nn.functional.smooth_l1_loss(model(xb), yb)
    if torch.isnan(loss) or torch.isinf(loss):
        skipped += 1
        continue
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("skipped", skipped)
