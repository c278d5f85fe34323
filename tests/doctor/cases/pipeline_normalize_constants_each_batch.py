# doctor-case: image preprocessing rebuilds the ImageNet mean/std tensors on the host and copies them for every batch
# loop: pipeline
# expect: host_to_device_copy @ 14
# expect: host_to_device_copy @ 15
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


def preprocess(images_u8):
    x = images_u8.to(device).float() / 255.0
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1).to(device)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1).to(device)
    return (x - mean) / std


backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).to(device)
backbone.eval()
decoded = [torch.randint(0, 256, (16, 3, 24, 24), dtype=torch.uint8) for _ in range(10)]
features = []
with torch.no_grad():
    for images in decoded:
        features.append(backbone(preprocess(images)))

print(torch.cat(features).shape)
