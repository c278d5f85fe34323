"""The ops that fuse a collective with computation (npu_all_gather_base_mm,
npu_mm_reduce_scatter_base, npu_moe_distribute_dispatch/_combine and _v2) and
the backend's get_hccl_comm_name, which names their group. On 2 and 4 ranks
(collective_ops.py, each result against the plain computation on the cpu), and
in this process on a group of one (names, meta kernels, refusals)."""
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import torch_npu

HERE = os.path.dirname(os.path.abspath(__file__))

CHECKS = ["all_gather_base_mm", "mm_reduce_scatter_base", "dispatch/combine", "dispatch_v2/combine_v2",
          "dispatch/combine with a shared expert", "dispatch/combine with x_active_mask",
          "dispatch/combine with different BS per rank", "quantized dispatch/combine", "an unknown group name",
          "a wrong world_size", "a k mismatch", "a wrong ep_rank_id", "an ep size that does not divide the experts",
          "shared expert ranks", "a bad expert id on one rank", "dispatch/combine after a rank's error"]


@pytest.mark.parametrize("world", [2, 4])
def test_each_op_matches_the_collective_and_the_computation_on_the_cpu(world):
    env = dict(os.environ, NPU_EMU_DEVICES=str(world), OMP_NUM_THREADS="1", TORCH_NCCL_ASYNC_ERROR_HANDLING="0")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(world), os.path.join(HERE, "collective_ops.py")],
                          env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, f"--- stdout ---\n{out}\n--- stderr ---\n{proc.stderr[-6000:]}"
    for rank in range(world):
        for check in CHECKS + (["subgroup"] if world == 4 else []):
            assert f"rank {rank} {check} OK" in out, (rank, check, out)


@pytest.fixture
def group_of_one():
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)
    pg = dist.distributed_c10d._get_default_group()
    yield pg._get_backend(torch.device("npu")).get_hccl_comm_name(0)
    del pg
    dist.destroy_process_group()


def test_the_backend_names_its_group_as_ascends_process_group_hccl_does(group_of_one):
    pg = dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("npu"))
    assert group_of_one.startswith("hccl_") and 1 <= len(group_of_one) < 128
    assert backend.get_hccl_comm_name(0) == group_of_one == backend.get_hccl_comm_name(0, init_comm=False)
    sub = dist.new_group([0])
    assert sub._get_backend(torch.device("npu")).get_hccl_comm_name(0) != group_of_one
    with pytest.raises(ValueError, match="rank must be"):
        backend.get_hccl_comm_name(-1)
    del pg, backend, sub


def test_a_group_of_one_computes_the_plain_matmul(group_of_one):
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    out, gathered = torch_npu.npu_all_gather_base_mm(x.npu(), w.npu(), group_of_one, 1)
    torch.testing.assert_close(out.cpu(), x @ w)
    torch.testing.assert_close(gathered.cpu(), x)
    out = torch.ops.npu.npu_mm_reduce_scatter_base(x.npu(), w.npu(), group_of_one, 1)
    torch.testing.assert_close(out.cpu(), x @ w)
    # cpu tensors go through the same group (its backend serves the cpu too)
    out, gathered = torch_npu.npu_all_gather_base_mm(x, w, group_of_one, 1, bias=w[0])
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, x @ w + w[0])
    ids = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    weights = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    expand_x, _, idx, counts, recv_counts, _, _ = torch_npu.npu_moe_distribute_dispatch(x[:2], ids, group_of_one,
                                                                                        1, 0, 2)
    assert counts.tolist() == [2, 2]
    y = torch.cat([expand_x[:2] * 2, expand_x[2:4] * 3])          # expert 0 doubles, expert 1 triples
    out = torch_npu.npu_moe_distribute_combine(y, ids, idx, recv_counts, weights, group_of_one, 1, 0, 2)
    torch.testing.assert_close(out, x[:2] * torch.tensor([[0.25 * 2 + 0.75 * 3], [0.5 * 3 + 0.5 * 2]]))


def test_a_destroyed_groups_name_no_longer_resolves():
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)
    name = dist.distributed_c10d._get_default_group()._get_backend(torch.device("npu")).get_hccl_comm_name(0)
    dist.destroy_process_group()
    import gc
    gc.collect()
    x = torch.ones(2, 2, device="npu")
    with pytest.raises(RuntimeError, match=f"npu_all_gather_base_mm \\(npu:0\\): hcom='{name}' names no hccl group"):
        torch_npu.npu_all_gather_base_mm(x, x, name, 1)


def test_meta_kernels_give_ascends_shapes_without_a_group():
    meta = torch.device("meta")
    x1, x2 = torch.empty(3, 8, device=meta, dtype=torch.float16), torch.empty(8, 5, device=meta, dtype=torch.float16)
    out, gathered = torch.ops.npu.npu_all_gather_base_mm(x1, x2, "any", 4)
    assert out.shape == (12, 5) and gathered.shape == (12, 8) and out.dtype == torch.float16
    _, gathered = torch.ops.npu.npu_all_gather_base_mm(x1, x2, "any", 4, gather_output=False)
    assert gathered.shape == (0,)
    x1 = torch.empty(8, 8, device=meta, dtype=torch.bfloat16)
    assert torch.ops.npu.npu_mm_reduce_scatter_base(x1, x2.bfloat16(), "any", 4).shape == (2, 5)

    bs, h, k, ep, experts = 3, 16, 2, 4, 8
    x = torch.empty(bs, h, device=meta, dtype=torch.bfloat16)
    ids = torch.empty(bs, k, device=meta, dtype=torch.int32)
    res = torch.ops.npu.npu_moe_distribute_dispatch(x, ids, "any", ep, 1, experts, quant_mode=2)
    a = bs * ep * min(experts // ep, k)
    assert [tuple(t.shape) for t in res] == [(a, h), (a,), (bs * k,), (2,), (ep * 2,), (0,), (a,)]
    assert [t.dtype for t in res[:5]] == [torch.int8, torch.float32, torch.int32, torch.int64, torch.int32]
    res = torch.ops.npu.npu_moe_distribute_dispatch_v2(x, ids, "any", ep, 1, experts, global_bs=8 * ep)
    a = 8 * ep * 2
    assert res[0].shape == (a, h) and res[0].dtype == torch.bfloat16 and res[2].shape == (a * 128,)
    y = torch.empty(a, h, device=meta, dtype=torch.bfloat16)
    out = torch.ops.npu.npu_moe_distribute_combine_v2(y, ids, res[2], res[4], torch.empty(bs, k, device=meta),
                                                      "any", ep, 1, experts, global_bs=8 * ep)
    assert out.shape == (bs, h) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("call,fragment", [
    (lambda x, ids: torch_npu.npu_moe_distribute_dispatch(x, ids, "g", 2, 0, 4, tp_world_size=2),
     "tp_world_size=2: the TP domain"),
    (lambda x, ids: torch_npu.npu_moe_distribute_dispatch(x, ids, "g", 2, 0, 4, quant_mode=4), "Ascend 950"),
    (lambda x, ids: torch_npu.npu_moe_distribute_dispatch_v2(x, ids, "g", 2, 0, 4, zero_expert_num=1),
     "special experts"),
    (lambda x, ids: torch_npu.npu_moe_distribute_dispatch_v2(x, ids, "g", 2, 0, 4, comm_alg="ring"), "comm_alg"),
    (lambda x, ids: torch_npu.npu_moe_distribute_dispatch(x, ids.long(), "g", 2, 0, 4), "int32"),
    (lambda x, ids: torch_npu.npu_all_gather_base_mm(x, x.t(), "g", 2, x1_scale=x[0]), "x1_scale/x2_scale"),
    (lambda x, ids: torch_npu.npu_mm_reduce_scatter_base(x, x.t(), "g", 2, reduce_op="max"), "reduce_op"),
    (lambda x, ids: torch_npu.npu_mm_reduce_scatter_base(x[:3], x.t(), "g", 2), "must divide by world_size"),
    (lambda x, ids: torch_npu.npu_all_gather_base_mm(x, x.t(), "", 2), "hcom is empty"),
])
def test_what_this_npu_cannot_do_is_refused_by_name(call, fragment):
    x = torch.ones(4, 8, device="npu")
    ids = torch.zeros(4, 2, dtype=torch.int32, device="npu")
    ids[:, 1] = 1
    with pytest.raises(RuntimeError, match="npu::npu_") as info:
        call(x, ids)
    assert fragment in str(info.value) and "(npu:0)" in str(info.value)
