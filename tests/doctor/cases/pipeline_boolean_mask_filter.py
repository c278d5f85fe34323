# doctor-case: point-cloud pipeline filters points with a boolean mask (data-dependent shape) on every frame
# loop: pipeline
# expect: hidden_sync @ 14
import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

frames = [torch.randn(4096, 3) for _ in range(10)]
rotation = torch.linalg.qr(torch.randn(3, 3))[0].to(device)
centroids = []
for pts_cpu in frames:
    pts = pts_cpu.to(device, non_blocking=True) @ rotation
    pts = pts[pts[:, 2] > 0.0]
    centroids.append(pts.mean(dim=0))

print(torch.stack(centroids).shape)
