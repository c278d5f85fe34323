# doctor-case: clean embedding extraction: frozen encoder under no_grad, normalised on the device, one copy out
# loop: eval
# expect: clean
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

encoder = nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 32)).to(device).eval()
corpus = torch.randn(800, 48).pin_memory()
index = torch.empty(800, 32, device=device)
with torch.no_grad():
    for start in range(0, 800, 100):
        batch = corpus[start:start + 100].to(device, non_blocking=True)
        index[start:start + 100] = F.normalize(encoder(batch), dim=1)
    query = F.normalize(encoder(torch.randn(4, 48, device=device)), dim=1)
    top = (query @ index.T).topk(5, dim=1).indices.cpu()

print(top.tolist())
