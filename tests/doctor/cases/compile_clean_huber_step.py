# doctor-case: a torch.compile'd training step with F.huber_loss: inductor generates its own kernels for the loss, so nothing falls back
# loop: compile
# expect: clean
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)


@torch.compile
def loss_of(s, g):
    return F.huber_loss(model(s), g)


states = torch.randn(256, 12)
targets = states[:, :1] * 2
for step in range(8):
    s, g = states[step * 32:(step + 1) * 32].to(device), targets[step * 32:(step + 1) * 32].to(device)
    loss = loss_of(s, g)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
