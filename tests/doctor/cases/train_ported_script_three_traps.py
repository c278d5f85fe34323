# doctor-case: script ported from a CUDA tutorial: .item() print, weights rebuilt with .cuda(), float64 numpy targets
# loop: training
# expect: hidden_sync @ 37
# expect: host_to_device_copy @ 32
# expect: float64 @ 31
import numpy as np
import torch
import torch.nn as nn

np.random.seed(0)
torch.manual_seed(0)

features = np.random.randn(600, 8).astype(np.float32)
scores = features[:, :2].sum(axis=1, keepdims=True) + np.random.randn(600, 1) * 0.1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


net = Net().cuda()
optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
for i in range(12):
    inputs = torch.from_numpy(features[i * 50:(i + 1) * 50]).cuda()
    targets = torch.from_numpy(scores[i * 50:(i + 1) * 50]).cuda()
    sample_weights = torch.ones(50, 1).cuda()
    optimizer.zero_grad()
    loss = (sample_weights * (net(inputs) - targets) ** 2).mean()
    loss.backward()
    optimizer.step()
    print("[%d] loss: %.3f" % (i + 1, loss.item()))
