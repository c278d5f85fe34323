# doctor-case: clean data pipeline: each chunk of a host array copied once, statistics reduced on the device
# loop: pipeline
# expect: clean
import numpy as np
import torch

rng = np.random.default_rng(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

table = rng.normal(size=(8192, 32)).astype(np.float32)
total = torch.zeros(32, device=device)
total_sq = torch.zeros(32, device=device)
count = 0
for chunk in np.array_split(table, 8):
    x = torch.from_numpy(chunk).to(device, non_blocking=True)
    total += x.sum(dim=0)
    total_sq += (x * x).sum(dim=0)
    count += x.shape[0]

mean = total / count
std = (total_sq / count - mean ** 2).sqrt()
print("mean", mean.cpu().numpy()[:3], "std", std.cpu().numpy()[:3])
