# doctor-case: debug print of an npu tensor slice inside the inference loop
# loop: eval
# expect: hidden_sync @ 16
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3)).to(device).eval()
batches = [torch.randn(24, 16) for _ in range(10)]

with torch.no_grad():
    for i, xb in enumerate(batches):
        logits = model(xb.to(device))
        print(f"batch {i}:", logits[:2])
