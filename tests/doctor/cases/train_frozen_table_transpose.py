# doctor-case: two-tower retrieval with a frozen item table: item_table.t().contiguous() recomputed every step
# loop: training
# expect: strided_copy @ 19
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

item_table = torch.randn(4096, 64, device=device)          # pretrained, frozen
user_tower = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64)).to(device)
optimizer = torch.optim.Adam(user_tower.parameters(), lr=1e-3)

users = torch.randn(384, 32)
clicked = torch.randint(0, 4096, (384,))
for step in range(12):
    u = users[step * 32:(step + 1) * 32].to(device)
    target = clicked[step * 32:(step + 1) * 32].to(device)
    item_matrix = item_table.t().contiguous()
    scores = user_tower(u) @ item_matrix
    loss = nn.functional.cross_entropy(scores, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
