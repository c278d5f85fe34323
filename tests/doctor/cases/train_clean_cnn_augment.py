# doctor-case: clean CNN training with device-side augmentation (torch.rand(..., device=device) flips, torch.where)
# loop: training
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
images = torch.rand(384, 1, 16, 16).pin_memory()
labels = torch.randint(0, 10, (384,)).pin_memory()

for step in range(12):
    x = images[step * 32:(step + 1) * 32].to(device, non_blocking=True)
    y = labels[step * 32:(step + 1) * 32].to(device, non_blocking=True)
    flip = torch.rand(x.shape[0], 1, 1, 1, device=device) < 0.5
    x = torch.where(flip, x.flip(-1), x)
    x = x + 0.05 * torch.randn_like(x)
    loss = nn.functional.cross_entropy(model(x), y, label_smoothing=0.1)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
