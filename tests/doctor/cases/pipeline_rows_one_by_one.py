# doctor-case: preprocessing copies each record to the device on its own (torch.tensor(row, device=...)) then stacks
# loop: pipeline
# expect: host_to_device_copy @ 18
import random

import torch

random.seed(0)
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

records = [[random.gauss(0, 1) for _ in range(12)] for _ in range(1024)]
projection = torch.randn(12, 4, device=device)

embeddings = []
for start in range(0, len(records), 128):
    batch_records = records[start:start + 128]
    rows = [torch.tensor(r, device=device) for r in batch_records]
    batch = torch.stack(rows)
    batch = (batch - batch.mean(dim=0)) / (batch.std(dim=0) + 1e-6)
    embeddings.append(batch @ projection)

print(torch.cat(embeddings).shape)
