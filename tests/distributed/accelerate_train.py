"""accelerate launch --multi_gpu --num_processes 2 (NPU_EMU_DEVICES=2): the
Accelerator trains on npu:LOCAL_RANK over the hccl backend, and the parameters
equal single-process training on the whole batch (on the cpu)."""
import copy

import torch
import torch.nn.functional as F
from accelerate import Accelerator

import torch_npu  # noqa: F401

accelerator = Accelerator()
state = accelerator.state
assert accelerator.device == torch.device("npu", state.local_process_index), accelerator.device
assert torch.distributed.get_backend() == "hccl", torch.distributed.get_backend()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
reference = copy.deepcopy(model)
g = torch.Generator().manual_seed(3)
x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)   # 4 per process
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
for xb, yb in data:
    optimizer.zero_grad()
    accelerator.backward(F.mse_loss(model(xb), yb))
    optimizer.step()

ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
for start in range(0, 16, 8):          # each step saw 8 rows: 4 on each process
    ref_opt.zero_grad()
    F.mse_loss(reference(x[start:start + 8]), y[start:start + 8]).backward()
    ref_opt.step()
for p, q in zip(accelerator.unwrap_model(model).parameters(), reference.parameters()):
    assert p.device.type == "npu"
    torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-5)
print(f"process {state.process_index} accelerate OK", flush=True)
