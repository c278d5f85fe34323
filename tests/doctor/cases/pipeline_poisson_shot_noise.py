# doctor-case: low-light augmentation with Poisson shot noise drawn on the npu: torch.poisson falls back on the chip
# loop: pipeline
# expect: cpu_fallback @ 13
import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
images = torch.rand(64, 3, 32, 32)
means = []
for i in range(0, 64, 8):
    batch = images[i:i + 8].to(device)
    photons = batch * 40.0
    noisy = torch.poisson(photons) / 40.0
    means.append(noisy.mean(dim=(1, 2, 3)))
print(torch.cat(means).mean().item())
