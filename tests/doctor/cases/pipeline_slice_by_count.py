# doctor-case: a 0-dim npu tensor used as a slice bound: batch[:n_valid] where n_valid = mask.sum(), per batch
# loop: pipeline
# expect: hidden_sync @ 16
import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

padded = torch.randn(10, 64, 32)
lengths = torch.randint(10, 64, (10,)).to(device)
pooled = []
for seq, length in zip(padded, lengths):
    seq = seq.to(device)
    valid = torch.arange(64, device=device) < length
    n_valid = valid.sum()
    tokens = seq[:n_valid]
    pooled.append(tokens.mean(dim=0))

print(torch.stack(pooled).shape)
