# doctor-case: latency benchmark that copies the same host input into the device on every iteration
# loop: eval
# expect: host_to_device_copy @ 20
import time

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128)).to(device).eval()
example = torch.randn(16, 128)

with torch.no_grad():
    model(example.to(device))                     # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(8):
        out = model(example.to(device))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start

print(f"{elapsed / 8 * 1e3:.3f} ms per batch, out {tuple(out.shape)}")
