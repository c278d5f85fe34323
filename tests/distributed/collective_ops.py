"""The collective ops (npu_all_gather_base_mm, npu_mm_reduce_scatter_base,
npu_moe_distribute_dispatch/_combine and _v2) on N ranks (torchrun
--nproc-per-node N, NPU_EMU_DEVICES=N: rank r on npu:r), each against the plain
computation on the cpu: every rank builds every rank's inputs from one seed, so
it knows what the group as a whole computes. Prints "<check> OK" per check."""
import torch
import torch.distributed as dist

import torch_npu

device = torch_npu.distributed.local_device()
dist.init_process_group("hccl")
rank, world = dist.get_rank(), dist.get_world_size()
npu = torch.device("npu")


def comm_name(group=None):
    group = group or dist.distributed_c10d._get_default_group()
    return group._get_backend(npu).get_hccl_comm_name(rank)


hcom = comm_name()
gen = torch.Generator().manual_seed(1234)


def randn(*shape):
    return torch.randn(*shape, generator=gen)


def close(name, got, expected, **tol):
    assert got.device == device, f"{name}: on {got.device}"
    torch.testing.assert_close(got.cpu(), expected, msg=lambda m: f"rank {rank} {name}: {m}", **tol)


def ok(name):
    print(f"rank {rank} {name} OK", flush=True)


def raises(name, call, *fragments):
    try:
        call()
    except RuntimeError as e:
        message = str(e)
        assert all(f in message for f in fragments), (name, message)
    else:
        raise AssertionError(f"{name}: no error")
    ok(name)


# ---- matmul fused with all_gather / reduce_scatter --------------------------------------------

m, k, n = 3, 5, 4
xs = [randn(m, k) for _ in range(world)]
w = randn(n, k).t()          # a transposed view, as MindSpeed passes weight.t()
bias = randn(n)
out, gathered = torch_npu.npu_all_gather_base_mm(xs[rank].npu(), w.npu(), hcom, world, bias=bias.npu())
close("all_gather_base_mm output", out, torch.cat(xs) @ w + bias)
close("all_gather_base_mm gather_out", gathered, torch.cat(xs))
out, gathered = torch_npu.npu_all_gather_base_mm(xs[rank].npu(), w.npu(), hcom, world, gather_output=False)
close("all_gather_base_mm without bias", out, torch.cat(xs) @ w)
assert gathered.numel() == 0
xb = [x.bfloat16() for x in xs]
out, _ = torch_npu.npu_all_gather_base_mm(xb[rank].npu(), w.bfloat16().npu(), hcom, world)
close("all_gather_base_mm bfloat16", out, (torch.cat(xb).float() @ w.bfloat16().float()).bfloat16(),
      atol=2e-2, rtol=2e-2)
ok("all_gather_base_mm")

xs = [randn(2 * world, k) for _ in range(world)]
ws = [randn(k, n) for _ in range(world)]
total = sum(x @ wr for x, wr in zip(xs, ws))
out = torch_npu.npu_mm_reduce_scatter_base(xs[rank].npu(), ws[rank].npu(), hcom, world)
close("mm_reduce_scatter_base", out, total.chunk(world)[rank])
out = torch_npu.npu_mm_reduce_scatter_base(xs[rank].npu(), ws[rank].npu(), hcom, world, reduce_op="sum",
                                           bias=bias.npu())
close("mm_reduce_scatter_base with bias", out, (total + world * bias).chunk(world)[rank])
xh, wh = [x.half() for x in xs], [wr.half() for wr in ws]
out = torch_npu.npu_mm_reduce_scatter_base(xh[rank].npu(), wh[rank].npu(), hcom, world)
assert out.dtype == torch.float16
close("mm_reduce_scatter_base float16", out.float(),
      sum(x.float() @ wr.float() for x, wr in zip(xh, wh)).chunk(world)[rank], atol=2e-2, rtol=2e-2)
ok("mm_reduce_scatter_base")

if world == 4:   # two groups of two: each op finds its own group by name
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    name = comm_name(mine)
    assert name != hcom and name == comm_name(mine)
    pair = [rank // 2 * 2, rank // 2 * 2 + 1]
    out, _ = torch_npu.npu_all_gather_base_mm(xs[rank][:3].npu(), ws[0].npu(), name, 2)
    close("all_gather_base_mm on a subgroup", out, torch.cat([xs[r][:3] for r in pair]) @ ws[0])
    ok("subgroup")

# ---- expert parallelism: dispatch -> experts -> combine ----------------------------------------

local, K, H = 2, 2, 8
E = local * world
bs = [3] * world
experts = [randn(H, H) / H ** 0.5 for _ in range(E)]      # expert g: y = x @ experts[g]


def routing(bs):
    x = [randn(b, H) for b in bs]
    ids = [torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(b)]).int() for b in bs]
    weights = [torch.softmax(randn(b, K), -1) for b in bs]
    return x, ids, weights


def routed_rows(x, ids, weights, active=None):
    """What this rank's experts receive, by local expert then source rank, on the cpu."""
    rows, scales, counts, per_block = [], [], [], []
    for e in range(local):
        g = rank * local + e
        count = 0
        for s in range(world):
            block = 0
            for t in range(ids[s].shape[0]):
                if active is not None and not active[s][t]:
                    continue
                for j in range(K):
                    if ids[s][t, j] == g:
                        rows.append(x[s][t])
                        scales.append(weights[s][t, j])
                        block += 1
            per_block.append(block)
            count += block
        counts.append(count)
    return (torch.stack(rows) if rows else torch.zeros(0, H)), torch.tensor(scales), counts, per_block


def moe_on_cpu(x, ids, weights, active=None):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        if active is not None and not active[t]:
            continue
        for j in range(K):
            out[t] += weights[t, j] * (x[t] @ experts[ids[t, j]])
    return out


def run_experts(expand_x, expert_token_nums):
    y = torch.zeros_like(expand_x)
    start = 0
    for e, count in enumerate(expert_token_nums.tolist()):
        y[start:start + count] = expand_x[start:start + count] @ experts[rank * local + e].to(device)
        start += count
    return y


def round_trip(name, v2=False, bs=bs, global_bs=0, active=None, shared=False):
    x, ids, weights = routing(bs)
    mask = [torch.tensor(a) for a in active] if active is not None else None
    dispatch = torch_npu.npu_moe_distribute_dispatch_v2 if v2 else torch_npu.npu_moe_distribute_dispatch
    extra = {"x_active_mask": mask[rank].npu()} if mask is not None else {}
    (expand_x, dynamic_scales, idx, token_nums, ep_recv_counts, tp_recv_counts, expand_scales) = dispatch(
        x=x[rank].npu(), expert_ids=ids[rank].npu(), group_ep=hcom, ep_world_size=world, ep_rank_id=rank,
        moe_expert_num=E, expert_scales=weights[rank].npu(), global_bs=global_bs, expert_shard_type=0,
        shared_expert_rank_num=0, quant_mode=0, expert_token_nums_type=1, **extra)
    rows, scales, counts, per_block = routed_rows(x, ids, weights, mask)
    A = (global_bs or bs[rank] * world) * min(local, K)
    assert expand_x.shape == (A, H) and expand_scales.shape == (A,), (expand_x.shape, A)
    close(f"{name}: expand_x", expand_x[:len(rows)], rows)
    close(f"{name}: expand_x beyond the rows received", expand_x[len(rows):], torch.zeros(A - len(rows), H))
    close(f"{name}: expand_scales", expand_scales[:len(rows)], scales)
    close(f"{name}: expert_token_nums", token_nums, torch.tensor(counts))
    assert token_nums.dtype == torch.int64 and ep_recv_counts.dtype == torch.int32
    close(f"{name}: ep_recv_counts", ep_recv_counts, torch.tensor(per_block).cumsum(0).int())
    assert idx.shape == ((A * 128,) if v2 else (bs[rank] * K,))

    y = run_experts(expand_x, token_nums)
    combine = torch_npu.npu_moe_distribute_combine_v2 if v2 else torch_npu.npu_moe_distribute_combine
    shared_x = randn(bs[rank], H) if shared else None
    kwargs = dict(expand_x=y, expert_ids=ids[rank].npu(), ep_send_counts=ep_recv_counts,
                  expert_scales=weights[rank].npu(), group_ep=hcom, ep_world_size=world, ep_rank_id=rank,
                  moe_expert_num=E, tp_send_counts=tp_recv_counts, expand_scales=expand_scales, global_bs=global_bs,
                  **extra)
    kwargs["assist_info_for_combine" if v2 else "expand_idx"] = idx
    if shared:
        kwargs["shared_expert_x"] = shared_x.npu()
    out = combine(**kwargs)
    expected = moe_on_cpu(x[rank], ids[rank], weights[rank], mask[rank] if mask is not None else None)
    if shared:
        expected = expected + shared_x
    close(f"{name}: combine", out, expected, atol=1e-5, rtol=1e-5)
    ok(name)


round_trip("dispatch/combine")
round_trip("dispatch_v2/combine_v2", v2=True)
round_trip("dispatch/combine with a shared expert", shared=True)
round_trip("dispatch/combine with x_active_mask", v2=True,
           active=[[True] * (b - 1) + [False] for b in bs])
uneven = [2 + r for r in range(world)]
round_trip("dispatch/combine with different BS per rank", bs=uneven, global_bs=max(uneven) * world)

# dynamic int8 quantization on the way out; int8 on the wire on the way back
x, ids, weights = routing(bs)
smooth = randn(E, H).abs() + 0.5
expand_x, dynamic_scales, idx, token_nums, ep_recv_counts, _, _ = torch_npu.npu_moe_distribute_dispatch(
    x[rank].npu(), ids[rank].npu(), hcom, world, rank, E, scales=smooth.npu(), quant_mode=2)
assert expand_x.dtype == torch.int8 and dynamic_scales.shape == (expand_x.shape[0],)
rows, _, counts, _ = routed_rows(x, ids, weights)
owner = [rank * local + e for e in range(local) for s in range(world) for t in range(bs[s]) for j in range(K)
         if ids[s][t, j] == rank * local + e]
smoothed = rows * smooth[torch.tensor(owner, dtype=torch.long)]
expected_scale = smoothed.abs().amax(1) / 127
close("quant_mode=2: dynamic_scales", dynamic_scales[:len(rows)], expected_scale)
close("quant_mode=2: expand_x", expand_x[:len(rows)], torch.round(smoothed / expected_scale[:, None]).to(torch.int8),
      atol=1, rtol=0)
y = run_experts(expand_x.float() * dynamic_scales[:, None], token_nums)
out = torch_npu.npu_moe_distribute_combine(y, ids[rank].npu(), idx, ep_recv_counts, weights[rank].npu(), hcom, world,
                                           rank, E, comm_quant_mode=2)
exact = torch.zeros(bs[rank], H)
for t in range(bs[rank]):
    for j in range(K):
        exact[t] += weights[rank][t, j] * ((x[rank][t] * smooth[ids[rank][t, j]]) @ experts[ids[rank][t, j]])
close("quant_mode=2 round trip", out, exact, atol=0.05, rtol=0.05)
ok("quantized dispatch/combine")

# ---- errors: each names the op, the device and the remedy ---------------------------------------

x1 = torch.ones(2, 4, device=device)
raises("an unknown group name", lambda: torch_npu.npu_all_gather_base_mm(x1, x1.t(), "no_such_group", world),
       "npu::npu_all_gather_base_mm", f"npu:{rank}", "'no_such_group' names no hccl group", "get_hccl_comm_name")
raises("a wrong world_size", lambda: torch_npu.npu_mm_reduce_scatter_base(x1.repeat(world * (world + 1), 1), x1.t(),
                                                                          hcom, world + 1),
       "npu::npu_mm_reduce_scatter_base", f"has {world} ranks")
raises("a k mismatch", lambda: torch_npu.npu_all_gather_base_mm(x1, x1, hcom, world), "must share k")
raises("a wrong ep_rank_id", lambda: torch_npu.npu_moe_distribute_dispatch(
    x1, torch.zeros(2, 1, dtype=torch.int32, device=device), hcom, world, (rank + 1) % world, world),
    "npu::npu_moe_distribute_dispatch", f"this process is rank {rank}", "dist.get_rank(group)")
raises("an ep size that does not divide the experts", lambda: torch_npu.npu_moe_distribute_dispatch(
    x1, torch.zeros(2, 1, dtype=torch.int32, device=device), hcom, world, rank, world + 1),
    "must be a positive multiple of ep_world_size")
raises("shared expert ranks", lambda: torch_npu.npu_moe_distribute_dispatch(
    x1, torch.zeros(2, 1, dtype=torch.int32, device=device), hcom, world, rank, world, shared_expert_rank_num=1),
    "shared_expert_rank_num=1", "shared_expert_x")

# a bad input on one rank only: every rank raises (none is left waiting in the row exchange)
bad_ids = torch.zeros(2, 1, dtype=torch.int32)
if rank == 0:
    bad_ids[1, 0] = E + 5
raises("a bad expert id on one rank", lambda: torch_npu.npu_moe_distribute_dispatch(
    x1, bad_ids.to(device), hcom, world, rank, E),
    "npu::npu_moe_distribute_dispatch",
    *(("is not an expert", "every rank of group_ep raises") if rank == 0 else ("another rank of group_ep",)))
# and the group still works afterwards: a good dispatch on every rank
round_trip("dispatch/combine after a rank's error")

dist.barrier()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
