"""DistributedDataParallel of an npu model on 2 ranks (torchrun, NPU_EMU_DEVICES=2)
against single-process training on the concatenated batch, on the cpu: plain
steps, gradient accumulation with no_sync(), and find_unused_parameters=True."""
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_npu

device = torch_npu.distributed.local_device()
dist.init_process_group("hccl")
rank, world = dist.get_rank(), dist.get_world_size()
STEPS, MICRO, BATCH = 5, 2, 8


class Net(nn.Module):
    def __init__(self, unused_branch=False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 2)
        self.unused = nn.Linear(16, 2) if unused_branch else None

    def forward(self, x):
        return self.head(self.body(x))


def batches():
    g = torch.Generator().manual_seed(7)
    return [[(torch.randn(world * BATCH, 6, generator=g), torch.randn(world * BATCH, 2, generator=g))
             for _ in range(MICRO)] for _ in range(STEPS)]


def train_ddp(model, data, accumulate, **ddp_kwargs):
    ddp = DDP(copy.deepcopy(model).to(device), device_ids=[device.index], **ddp_kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for micro_batches in data:
        opt.zero_grad()
        used = micro_batches if accumulate else micro_batches[:1]
        for i, (x, y) in enumerate(used):
            shard = slice(rank * BATCH, (rank + 1) * BATCH)
            context = ddp.no_sync() if i < len(used) - 1 else torch.enable_grad()
            with context:
                F.mse_loss(ddp(x[shard].to(device)), y[shard].to(device)).backward()
        opt.step()
    return ddp.module


def train_alone(model, data, accumulate):
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for micro_batches in data:
        opt.zero_grad()
        for x, y in (micro_batches if accumulate else micro_batches[:1]):
            F.mse_loss(model(x), y).backward()
        opt.step()
    return model


torch.manual_seed(0)
for name, accumulate, unused in (("plain", False, False), ("no_sync accumulation", True, False),
                                 ("find_unused_parameters", False, True)):
    model = Net(unused_branch=unused)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = batches()
    trained = train_ddp(model, data, accumulate, find_unused_parameters=unused)
    expected = train_alone(model, data, accumulate)
    for (pname, p), q in zip(trained.named_parameters(), expected.parameters()):
        assert p.device == device, (name, pname, p.device)
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{name}, {pname}: {m}")
        assert pname.startswith("unused") or not torch.equal(p.detach().cpu(), initial[pname]), pname
    print(f"rank {rank} {name} OK", flush=True)
dist.destroy_process_group()
