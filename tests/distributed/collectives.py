"""Every collective of the npu backend against its expected result, on 2 ranks
(torchrun --nproc-per-node 2, NPU_EMU_DEVICES=2: rank r on npu:r). argv[1]:
the backend string given to init_process_group ("" for none)."""
import sys

import torch
import torch.distributed as dist

import torch_npu

backend = sys.argv[1] or None
device = torch_npu.distributed.local_device()
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2 and device == torch.device("npu", rank)
checks = []


def check(name, got, expected):
    assert got.device == device, f"{name}: result on {got.device}, not {device}"
    torch.testing.assert_close(got.cpu(), expected, msg=lambda m: f"{name}: {m}")
    checks.append(name)


def ranked(n=6, dtype=torch.float32):   # rank r holds [r*10, r*10+1, ...]
    return (torch.arange(n, dtype=dtype) + 10 * rank).to(device)


every = [torch.arange(6.0) + 10 * r for r in range(world)]
for op, expected in ((dist.ReduceOp.SUM, sum(every)), (dist.ReduceOp.AVG, sum(every) / world),
                     (dist.ReduceOp.MAX, torch.maximum(*every)), (dist.ReduceOp.MIN, torch.minimum(*every)),
                     (dist.ReduceOp.PRODUCT, every[0] * every[1])):
    t = ranked()
    dist.all_reduce(t, op=op)
    check(f"all_reduce {op}", t, expected)

t = ranked(6, torch.float16)
dist.all_reduce(t)
check("all_reduce float16", t, sum(every).half())

strided = ranked(6).view(2, 3).t()                 # a transposed view: staged and written back in place
dist.all_reduce(strided)
check("all_reduce of a strided view", strided, sum(every).view(2, 3).t())

t = ranked() if rank == 1 else torch.zeros(6, device=device)
dist.broadcast(t, src=1)
check("broadcast", t, every[1])

outs = [torch.empty(6, device=device) for _ in range(world)]
dist.all_gather(outs, ranked())
for r in range(world):
    check(f"all_gather[{r}]", outs[r], every[r])

out = torch.empty(12, device=device)
dist.all_gather_into_tensor(out, ranked())
check("all_gather_into_tensor", out, torch.cat(every))

shards = torch.zeros(12, device=device)        # FSDP's pattern: the input is this rank's slice of the output
shards[6 * rank:6 * rank + 6] = ranked()
dist.all_gather_into_tensor(shards, shards[6 * rank:6 * rank + 6])
check("all_gather_into_tensor in place", shards, torch.cat(every))

out = torch.empty(3, device=device)
dist.reduce_scatter_tensor(out, ranked())
check("reduce_scatter_tensor", out, sum(every)[3 * rank:3 * rank + 3])

out = torch.empty(3, device=device)
dist.reduce_scatter(out, list(ranked().chunk(2)))
check("reduce_scatter", out, sum(every)[3 * rank:3 * rank + 3])

outs = [torch.empty(3, device=device) for _ in range(world)]
dist.all_to_all(outs, list(ranked().chunk(2)))
for r in range(world):
    check(f"all_to_all[{r}]", outs[r], every[r][3 * rank:3 * rank + 3])

# Uneven splits: rank 0 sends 2 elements to itself and 4 to rank 1; rank 1 sends 1 and 5.
in_splits = [2, 4] if rank == 0 else [1, 5]
out_splits = [[2, 1], [4, 5]][rank]
out = torch.empty(sum(out_splits), device=device)
dist.all_to_all_single(out, ranked(), out_splits, in_splits)
sent = {0: every[0].split([2, 4]), 1: every[1].split([1, 5])}
check("all_to_all_single (uneven)", out, torch.cat([sent[0][rank], sent[1][rank]]))

t = ranked()
dist.reduce(t, dst=0)
if rank == 0:
    check("reduce", t, sum(every))

gathered = [torch.empty(6, device=device) for _ in range(world)] if rank == 0 else None
dist.gather(ranked(), gathered, dst=0)
if rank == 0:
    for r in range(world):
        check(f"gather[{r}]", gathered[r], every[r])

out = torch.empty(6, device=device)
dist.scatter(out, [e.to(device) for e in every] if rank == 1 else None, src=1)
check("scatter", out, every[rank])

if rank == 0:
    dist.send(ranked(), dst=1)
    request = dist.irecv(got := torch.empty(6, device=device), src=1)
    request.wait()
    check("irecv", got, every[1])
else:
    got = torch.empty(6, device=device)
    dist.recv(got, src=0)
    check("recv", got, every[0])
    dist.isend(ranked(), dst=0).wait()

# A ring in which every rank sends before it receives: sends must not wait for the peer.
received = torch.empty(6, device=device)
for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, ranked(), (rank + 1) % world),
                                       dist.P2POp(dist.irecv, received, (rank - 1) % world)]):
    request.wait()
check("batch_isend_irecv ring", received, every[(rank - 1) % world])

t = ranked()
work = dist.all_reduce(t, async_op=True)
assert work.wait() and work.is_completed()
check("all_reduce async_op (wait)", t, sum(every))
t = ranked()
future = dist.all_reduce(t, async_op=True).get_future()
check("all_reduce async_op (future)", future.wait()[0], sum(every))

objects = [None, None]
dist.all_gather_object(objects, {"rank": rank})
assert objects == [{"rank": 0}, {"rank": 1}]
dist.barrier()

pg = dist.distributed_c10d._get_default_group()
npu_backend = type(pg._get_backend(device)).__name__
cpu = torch.arange(4.0) + rank
if backend is None:       # as for CUDA: no backend named, only the accelerator's
    try:
        dist.all_reduce(cpu)
        raise AssertionError("a cpu tensor was reduced by a group made for the npu only")
    except RuntimeError as e:
        assert "No backend type associated with device type cpu" in str(e), e
    cpu_backend = None
else:
    dist.all_reduce(cpu)
    torch.testing.assert_close(cpu, torch.arange(4.0) * 2 + 1)
    cpu_backend = type(pg._get_backend(torch.device("cpu"))).__name__
print(f"rank {rank} backend={dist.get_backend()} npu={npu_backend} cpu={cpu_backend} checks={len(checks)} OK",
      flush=True)
# The group must go while Python is alive: torch's Gloo worker thread drops a finished
# work's (Python) tensors after wait() returns, and at interpreter exit that aborts.
del pg
dist.destroy_process_group()
