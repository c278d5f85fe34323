# doctor-case: every step's logits kept (not detached) in a list for an epoch-level metric computed at the end
# loop: training
# expect: memory_growth @ 25|20
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 100)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()
X = torch.randn(768, 32)
Y = torch.randint(0, 100, (768,))

epoch_logits, epoch_labels = [], []
for step in range(12):
    xb = X[step * 64:(step + 1) * 64].to(device)
    yb = Y[step * 64:(step + 1) * 64].to(device)
    logits = model(xb)
    loss = criterion(logits, yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    epoch_logits.append(logits)
    epoch_labels.append(yb)

top5 = torch.cat(epoch_logits).topk(5, dim=1).indices
hits = (top5 == torch.cat(epoch_labels)[:, None]).any(dim=1).float().mean()
print("train top-5", hits.item())
