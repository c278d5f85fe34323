# doctor-case: MoCo-style key queue whose write position is a 0-dim npu tensor used as a slice index every step
# loop: training
# expect: hidden_sync @ 30
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
dim, K, B, tau = 32, 256, 32, 0.07

encoder_q = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, dim)).to(device)
encoder_k = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, dim)).to(device).requires_grad_(False)
encoder_k.load_state_dict(encoder_q.state_dict())
optimizer = torch.optim.SGD(encoder_q.parameters(), lr=0.03, momentum=0.9)
queue = F.normalize(torch.randn(K, dim, device=device), dim=1)
queue_ptr = torch.zeros((), dtype=torch.long, device=device)

views = torch.randn(10, B, 48)
for step in range(10):
    x = views[step].to(device)
    q = F.normalize(encoder_q(x + 0.1 * torch.randn_like(x)), dim=1)
    with torch.no_grad():
        k = F.normalize(encoder_k(x + 0.1 * torch.randn_like(x)), dim=1)
    logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], dim=1) / tau
    loss = F.cross_entropy(logits, torch.zeros(B, dtype=torch.long, device=device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    queue[queue_ptr:queue_ptr + B] = k
    queue_ptr = (queue_ptr + B) % K

print("loss", loss.item())
