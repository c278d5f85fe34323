# doctor-case: binary activation with a straight-through estimator built on torch.heaviside (no npu kernel)
# loop: training
# expect: cpu_fallback @ 20
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class BinaryNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 2)
        self.register_buffer("step_at_zero", torch.tensor(0.5))

    def forward(self, x):
        soft = torch.sigmoid(self.fc1(x))
        hard = torch.heaviside(soft - 0.5, self.step_at_zero)
        return self.fc2(soft + (hard - soft).detach())


model = BinaryNet().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
X = torch.randn(384, 16)
Y = (X[:, 0] > 0).long()
for step in range(12):
    xb, yb = X[step * 32:(step + 1) * 32].to(device), Y[step * 32:(step + 1) * 32].to(device)
    loss = nn.functional.cross_entropy(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
