# doctor-case: per-class true positives counted in a Python loop over 40 classes for every batch
# loop: eval
# expect: launch_bound @ 22|23|21
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
num_classes = 40

model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, num_classes)).to(device).eval()
X = torch.randn(640, 32)
Y = torch.randint(0, num_classes, (640,))
true_pos = torch.zeros(num_classes, device=device)
support = torch.zeros(num_classes, device=device)

with torch.no_grad():
    for start in range(0, 640, 80):
        pred = model(X[start:start + 80].to(device)).argmax(dim=1)
        y = Y[start:start + 80].to(device)
        for c in range(num_classes):
            true_pos[c] += ((pred == c) & (y == c)).sum()
            support[c] += (y == c).sum()

recall = true_pos / support.clamp(min=1)
print("macro recall", recall.mean().item())
