# doctor-case: a classifier trained with the multi-class hinge loss: the chip has no multi_margin_loss kernel
# loop: training
# expect: cpu_fallback @ 16
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 6)).to(device)
criterion = nn.MultiMarginLoss(margin=1.0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x_all, y_all = torch.randn(480, 30), torch.randint(0, 6, (480,))
for step in range(15):
    x = x_all[step * 32:(step + 1) * 32].to(device)
    y = y_all[step * 32:(step + 1) * 32].to(device)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
