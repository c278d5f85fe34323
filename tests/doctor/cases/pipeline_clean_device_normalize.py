# doctor-case: clean preprocessing: mean/std made on the device once, uint8 batches copied once each, non_blocking
# loop: pipeline
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)
backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).to(device)
backbone.eval()

decoded = [torch.randint(0, 256, (16, 3, 24, 24), dtype=torch.uint8).pin_memory() for _ in range(10)]
features = []
with torch.no_grad():
    for images in decoded:
        x = images.to(device, non_blocking=True).float().div_(255.0)
        features.append(backbone((x - mean) / std))

print(torch.cat(features).cpu().shape)
