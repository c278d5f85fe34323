"""torch.distributed on the npu: the "hccl" backend (Gloo on host copies of npu
tensors). The collectives, DDP and accelerate run in 2 processes on 2 emulated
devices (torchrun, NPU_EMU_DEVICES=2, rank r on npu:r), each result checked
against its expected value or single-process training on the cpu."""
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import torch_npu

HERE = os.path.dirname(os.path.abspath(__file__))   # the scripts sit beside this file
ENV = dict(os.environ, NPU_EMU_DEVICES="2", OMP_NUM_THREADS="1", TORCH_NCCL_ASYNC_ERROR_HANDLING="0")


def torchrun(script, *args, launcher=None, env=None):
    command = launcher or [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(command + [os.path.join(HERE, script), *args], env=dict(ENV, **(env or {})),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{script} {args} failed\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n" \
                                 f"{proc.stderr[-6000:]}"
    return proc.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("backend,staging", [("", "0"), ("cpu:gloo,npu:hccl", "0"), ("npu_gloo", "1")])
def test_every_collective_lands_on_the_npu_with_the_right_values(backend, staging):
    # NPU_DIST_STAGING=1: through pinned host copies, as on a device whose memory the host cannot address.
    out = torchrun("collectives.py", backend, env={"NPU_DIST_STAGING": staging})
    for rank in (0, 1):
        assert f"rank {rank} backend=" in out and "npu=GlooBackend" in out, out
    assert out.count(" OK") == 2, out
    if backend == "cpu:gloo,npu:hccl":
        assert "cpu=ProcessGroupGloo" in out       # each device routed to its own backend


def test_ddp_matches_single_process_training():
    out = torchrun("ddp.py")
    for name in ("plain", "no_sync accumulation", "find_unused_parameters"):
        assert out.count(f"{name} OK") == 2, out


@pytest.mark.child_process
@pytest.mark.parametrize("how", ["exit", "stall"])
def test_a_dead_or_stalled_peer_raises_instead_of_hanging(how):
    # Plain processes, not torchrun: its agent would stop rank 0 as soon as rank 1 exits.
    port = free_port()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "dead_peer.py"), how],
                              env=dict(ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                                       LOCAL_RANK=str(r), WORLD_SIZE="2"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    start = time.monotonic()
    out, err = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=120)
    assert "rank 0: DistBackendError" in out, out + err[-3000:]
    assert "c10d::allreduce on npu:0" in out
    assert time.monotonic() - start < 60


def test_accelerate_launch_trains_on_two_npus():
    pytest.importorskip("accelerate")
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    out = torchrun("accelerate_train.py", launcher=launcher)
    assert out.count("accelerate OK") == 2, out


def test_the_backend_is_registered_for_the_npu():
    assert dist.Backend.default_device_backend_map["npu"] == "hccl"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"        # the cpu keeps Gloo
    for name in ("hccl", "npu_gloo"):
        assert dist.Backend.backend_capability[name] == ["cpu", "npu"]


@pytest.fixture
def single_process_group():
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_group_of_one_in_this_process(single_process_group):
    t = torch.arange(4.0, device="npu")
    work = dist.all_reduce(t, async_op=True)
    assert work.is_completed() and work.wait()
    torch.testing.assert_close(work.get_future().value()[0].cpu(), torch.arange(4.0))
    assert dist.get_backend() == "hccl"
    pg = dist.distributed_c10d._get_default_group()
    assert isinstance(pg._get_backend(torch.device("npu")), torch_npu.distributed.GlooBackend)
    assert pg._get_backend(torch.device("npu")).name() == "hccl"
    del pg


def test_each_device_of_a_process_has_its_streams_and_memory():
    torch.npu.synchronize()
    before = [torch.npu.memory_allocated(d) for d in (0, 1)]
    x = torch.ones(1 << 16, device="npu:1")
    assert torch.npu.memory_allocated(1) - before[1] >= x.nbytes
    assert torch.npu.memory_allocated(0) == before[0]
    s0, s1 = torch.npu.current_stream(0), torch.npu.current_stream(1)
    assert s0.device == torch.device("npu:0") and s1.device == torch.device("npu:1")
    with torch.npu.device(1):
        side = torch.npu.Stream()
        with torch.npu.stream(side):
            y = x * 2
        torch.npu.current_stream().wait_stream(side)
    assert y.device == torch.device("npu:1") and y.sum().item() == 2 * x.numel()


def test_transfer_to_npu_makes_nccl_the_npu_backend(run_python):
    proc = run_python("""
        import torch, torch.distributed as dist
        import torch_npu.contrib.transfer_to_npu
        assert dist.is_nccl_available()
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
        t = torch.ones(2, device="cuda")
        dist.all_reduce(t)
        group = dist.new_group([0], backend="cpu:gloo,cuda:nccl")
        dist.all_reduce(t, group=group)
        print(dist.get_backend(), dist.get_backend(group), t.device)
        dist.destroy_process_group()
    """)
    assert proc.stdout.split() == ["hccl", "cpu:gloo,npu:hccl", "npu:0"]
