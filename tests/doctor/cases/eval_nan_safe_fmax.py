# doctor-case: evaluation taking the NaN-ignoring maximum of two heads with torch.fmax: the chip decomposes it into fmax.out, which falls back
# loop: eval
# expect: cpu_fallback @ 16
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
head_a = nn.Linear(32, 5).to(device).eval()
head_b = nn.Linear(32, 5).to(device).eval()
features = torch.randn(160, 32)
scores = []
with torch.no_grad():
    for i in range(0, 160, 16):
        x = features[i:i + 16].to(device)
        best = torch.fmax(head_a(x), head_b(x))
        scores.append(best)
print(torch.cat(scores).shape)
