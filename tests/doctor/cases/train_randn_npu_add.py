# doctor-case: label noise made on the host and copied every step: x = target + 0.01 * torch.randn(1024, 1024).npu()
# loop: training
# expect: host_to_device_copy @ 14
import torch
import torch_npu  # noqa: F401

torch.manual_seed(0)
target = torch.randn(1024, 1024).npu()
factors = torch.randn(1024, 16, device="npu") * 0.1
factors.requires_grad_()
optimizer = torch.optim.SGD([factors], lr=0.5)

for step in range(8):
    x = target + 0.01 * torch.randn(1024, 1024).npu()
    loss = ((factors @ factors.T - x) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("loss", loss.item())
