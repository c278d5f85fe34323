# doctor-case: scoring with a von Mises feature map: torch.special.i0e (no npu kernel) on every batch
# loop: eval
# expect: cpu_fallback @ 18
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

scorer = nn.Sequential(nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 1)).to(device).eval()
kappa = torch.linspace(0.5, 4.0, 24, device=device)
angles = torch.rand(400, 24) * 6.283

scores = []
with torch.no_grad():
    for start in range(0, 400, 50):
        theta = angles[start:start + 50].to(device)
        feats = torch.special.i0e(kappa * torch.cos(theta))
        scores.append(scorer(feats))

print("mean score", torch.cat(scores).mean().item())
