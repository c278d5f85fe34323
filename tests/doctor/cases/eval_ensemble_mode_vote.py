# doctor-case: an ensemble voting by the most frequent class with torch.mode: the chip has no mode kernel
# loop: eval
# expect: cpu_fallback @ 16
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
members = [nn.Linear(24, 7).to(device).eval() for _ in range(5)]
inputs = torch.randn(200, 24)
votes = []
with torch.no_grad():
    for i in range(0, 200, 20):
        x = inputs[i:i + 20].to(device)
        predictions = torch.stack([m(x).argmax(1) for m in members], dim=1)
        majority, _ = torch.mode(predictions, dim=1)
        votes.append(majority)
print(torch.cat(votes).bincount())
