# doctor-case: entropy regulariser with torch.special.entr, an op without an npu kernel, in every step
# loop: training
# expect: cpu_fallback @ 24
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

policy = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 6)).to(device)
optimizer = torch.optim.Adam(policy.parameters(), lr=3e-4)
states = torch.randn(480, 12)
actions = torch.randint(0, 6, (480,))
advantages = torch.randn(480)

for step in range(12):
    s = states[step * 40:(step + 1) * 40].to(device)
    a = actions[step * 40:(step + 1) * 40].to(device)
    adv = advantages[step * 40:(step + 1) * 40].to(device)
    logits = policy(s)
    log_probs = F.log_softmax(logits, dim=-1)
    pg_loss = -(log_probs.gather(1, a[:, None]).squeeze(1) * adv).mean()
    entropy = torch.special.entr(log_probs.exp()).sum(dim=-1).mean()
    loss = pg_loss - 0.01 * entropy
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
