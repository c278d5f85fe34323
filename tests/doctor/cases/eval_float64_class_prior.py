# doctor-case: prior correction with a class prior from numpy (float64) moved to the device once, used every batch
# loop: eval
# expect: float64 @ 12
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

class_counts = np.array([500, 120, 60, 20])
prior = torch.from_numpy(class_counts / class_counts.sum()).to(device)

model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4)).to(device).eval()
inputs = torch.randn(480, 10)
predictions = []
with torch.no_grad():
    for start in range(0, 480, 60):
        probs = model(inputs[start:start + 60].to(device)).softmax(dim=-1)
        balanced = probs / prior
        predictions.append(balanced.argmax(dim=-1))

print("predicted", torch.bincount(torch.cat(predictions), minlength=4).tolist())
