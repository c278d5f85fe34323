"""DeepSpeed ZeRO on 2 npu ranks (torchrun, NPU_EMU_DEVICES=2), its accelerator found by
DeepSpeed's own detection (import torch_npu), its backend "hccl": stages 1, 2 and 3 (every
parameter partitioned, gathered to compare) in float32 against one process training on the
whole batch on the cpu (1e-5), and in bfloat16 against a bfloat16-model/float32-master-weights
reference on the cpu (bf16 tolerance); the loss over all batches falls, and both ranks hold the
same parameters. Usage: deepspeed_zero.py STAGE fp32|bf16."""
import copy
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import torch_npu  # noqa: F401
import deepspeed
from deepspeed.accelerator import get_accelerator

STEPS, BATCH, LR = 6, 4, 1e-2


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))


def batches(world):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(world * BATCH, 6, generator=g), torch.randn(world * BATCH, 2, generator=g))
            for _ in range(STEPS)]


def optimizer(params, bf16):
    """Adam in float32. In bfloat16, SGD with momentum: Adam divides each step by the gradient's
    magnitude, so bfloat16 rounding of a near-zero gradient becomes a step of lr either way and
    no reference could be compared within a bfloat16 tolerance."""
    if bf16:
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=LR)


def train_deepspeed(model, data, stage, bf16):
    rank, world = dist.get_rank(), dist.get_world_size()
    config = {"train_batch_size": world * BATCH, "train_micro_batch_size_per_gpu": BATCH,
              "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True,   # torch.optim.SGD (bf16)
              "gradient_clipping": 0.0,   # DeepSpeed clips at 1.0 unless told; the reference does not clip
              "bf16": {"enabled": bf16}, "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}
    if stage == 3:   # partition every parameter, however small (DeepSpeed keeps those < 1e5 whole)
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    opt = optimizer(model.parameters(), bf16)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    assert engine.device.type == "npu" and engine.device.index == rank, engine.device
    expected = "DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer"
    assert type(engine.optimizer).__name__ == expected, type(engine.optimizer)
    losses = []
    shard = slice(rank * BATCH, (rank + 1) * BATCH)
    for x, y in data:
        x, y = x[shard].to(engine.device), y[shard].to(engine.device)
        if bf16:
            x = x.bfloat16()
        out = engine(x)
        assert out.device == engine.device and out.dtype == (torch.bfloat16 if bf16 else torch.float32)
        loss = F.mse_loss(out.float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    params = list(engine.module.parameters())
    if stage == 3:   # each rank holds its partition of every parameter: gather them whole
        assert all(p.numel() == 0 for p in params), "ZeRO 3 left a parameter unpartitioned"
        with deepspeed.zero.GatheredParameters(params):
            return [p.detach().float().cpu().clone() for p in params], losses
    return [p.detach().float().cpu() for p in params], losses


def train_alone(model, data, bf16):
    """One process, the whole batch, on the cpu; with bf16, a bfloat16 copy of the model
    computes and float32 master weights take the Adam steps (what DeepSpeed's bf16 does)."""
    master = copy.deepcopy(model)
    opt = optimizer(master.parameters(), bf16)
    for x, y in data:
        opt.zero_grad()
        if bf16:
            work = copy.deepcopy(master).bfloat16()
            F.mse_loss(work(x.bfloat16()).float(), y).backward()
            for m, w in zip(master.parameters(), work.parameters()):
                m.grad = w.grad.float()
        else:
            F.mse_loss(master(x), y).backward()
        opt.step()
    return [p.detach() for p in master.parameters()]


def full_loss(model, params, data):
    """The float32 loss, on the cpu, of ``model`` with ``params`` over every batch."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v)
        return sum(F.mse_loss(model(x), y).item() for x, y in data) / len(data)


def main():
    stage, bf16 = int(sys.argv[1]), sys.argv[2] == "bf16"
    accel = get_accelerator()
    assert accel.device_name() == "npu" and accel.communication_backend_name() == "hccl", accel
    torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
    deepspeed.init_distributed()        # the accelerator's backend: "hccl"
    assert dist.get_backend() == "hccl", dist.get_backend()
    rank, world = dist.get_rank(), dist.get_world_size()
    model, data = net(), batches(world)
    got, losses = train_deepspeed(copy.deepcopy(model), data, stage, bf16)
    want = train_alone(model, data, bf16)
    # ZeRO shards the optimizer state; after each step both ranks hold all parameters, the same.
    flat = torch.cat([p.flatten() for p in got]).to(f"npu:{rank}")
    other = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(other, flat)
    assert all(torch.equal(o, other[0]) for o in other), "the ranks' parameters differ"
    if bf16:   # the engine's model holds the bfloat16 rounding of its float32 master weights
        want = [w.bfloat16().float() for w in want]
    diff = max((g - w).abs().max().item() for g, w in zip(got, want))
    tol = 1e-2 if bf16 else 1e-5
    assert diff <= tol, f"stage {stage} {'bf16' if bf16 else 'fp32'}: max |deepspeed - alone| = {diff}"
    before, after = full_loss(model, model.parameters(), data), full_loss(model, got, data)
    assert after < 0.9 * before, f"training did not lower the loss on all batches: {before} -> {after}"
    print(f"rank {rank} zero{stage} {'bf16' if bf16 else 'fp32'} max_diff={diff:.3g} "
          f"loss {before:.4f} -> {after:.4f} rank_losses={json.dumps([round(v, 5) for v in losses])} OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
