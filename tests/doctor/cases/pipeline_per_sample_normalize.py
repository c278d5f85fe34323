# doctor-case: per-sample normalisation in a Python list comprehension over the batch (tiny ops per sample)
# loop: pipeline
# expect: launch_bound @ 18|11
import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


def normalize_one(sample):
    return (sample - sample.mean()) / (sample.std() + 1e-6)


batches = [torch.randn(96, 40) for _ in range(8)]
out = []
for batch in batches:
    batch = batch.to(device)
    normed = torch.stack([normalize_one(s) for s in batch])
    out.append(normed.max(dim=1).values)

print(torch.cat(out).shape)
