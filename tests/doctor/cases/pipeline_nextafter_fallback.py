# doctor-case: feature hashing pipeline uses torch.nextafter (no npu kernel) for an exclusive upper bound per batch
# loop: pipeline
# expect: cpu_fallback @ 16
import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
n_bins = 64

chunks = [torch.randn(2048, 16) * 5 for _ in range(8)]
inf = torch.full((16,), float("inf"), device=device)
histograms = []
for chunk in chunks:
    x = chunk.to(device)
    lo = x.amin(dim=0)
    hi = torch.nextafter(x.amax(dim=0), inf)
    bins = ((x - lo) / (hi - lo) * n_bins).long()
    histograms.append((bins[..., None] == torch.arange(n_bins, device=device)).sum(dim=0))

print(torch.stack(histograms).sum(dim=0).shape)
