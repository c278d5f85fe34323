# doctor-case: a script written for bfloat16 run on a 310P, which has no bfloat16 units: it stops at the first bfloat16 tensor
# loop: training
# target: ascend310p3
# raises: TypeError
# expect: unsupported_dtype @ 15
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Linear(16, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x_all = torch.randn(128, 16)
for step in range(8):
    x = x_all[step * 16:(step + 1) * 16].to(device, torch.bfloat16)
    loss = model.to(torch.bfloat16)(x).float().square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
