# doctor-case: clean evaluation: inference_mode, correct counts accumulated on the device, one .item() at the end
# loop: eval
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 6)).to(device).eval()
X = torch.randn(640, 20)
Y = torch.randint(0, 6, (640,))
correct = torch.zeros((), dtype=torch.long, device=device)
with torch.inference_mode():
    for start in range(0, 640, 64):
        xb = X[start:start + 64].to(device, non_blocking=True)
        yb = Y[start:start + 64].to(device, non_blocking=True)
        correct += (model(xb).argmax(dim=1) == yb).sum()

print(f"accuracy {correct.item() / 640:.3f}")
