# doctor-case: compiled model run on a fixed calibration batch that stays on the host and is copied in every iteration
# loop: compile
# expect: host_to_device_copy @ 17
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).to(device).eval()
fast_model = torch.compile(model)
calibration = torch.randn(32, 64)
running_max = torch.zeros(64, device=device)

with torch.no_grad():
    for _ in range(10):
        act = fast_model(calibration.to(device))
        running_max = torch.maximum(running_max, act.abs().amax(dim=0))

print("scale", (running_max / 127).mean().item())
