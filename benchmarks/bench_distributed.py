"""all_reduce of npu tensors over the "hccl" backend (Gloo on the emulated
npu's host-addressable memory; with NPU_DIST_STAGING=1, on pinned host copies)
against Gloo on cpu tensors, 1 KB to 64 MB, 2 processes on this machine (one
emulated npu each). One group routes "cpu:gloo,npu:hccl", and the
two kinds of all_reduce alternate, so both see the same machine. Printed:
time per all_reduce and the npu/cpu ratio of bandwidth (target >= 0.8 at 64 MB).

    python benchmarks/bench_distributed.py [--quick]
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_npu  # noqa: F401

SIZES = [1 << 10, 16 << 10, 256 << 10, 4 << 20, 64 << 20]


def worker(rank, port, rounds, sizes):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.npu.set_device(rank)
    dist.init_process_group("cpu:gloo,npu:hccl", rank=rank, world_size=2)
    for nbytes in sizes:
        tensors = {"cpu": torch.ones(nbytes // 4), "npu": torch.ones(nbytes // 4, device=f"npu:{rank}")}
        repeats = max(2, min(50, (16 << 20) // nbytes))
        best = {}
        for _ in range(rounds):
            for device, t in tensors.items():
                dist.barrier()
                start = time.perf_counter()
                for _ in range(repeats):
                    dist.all_reduce(t)
                if device == "npu":
                    torch.npu.synchronize()
                best[device] = min(best.get(device, float("inf")), (time.perf_counter() - start) / repeats)
        if rank == 0:
            size = f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"
            print(f"  {size:>7}: gloo on cpu {best['cpu'] * 1e3:8.3f} ms  hccl on npu {best['npu'] * 1e3:8.3f} ms  "
                  f"npu/cpu bandwidth {best['cpu'] / best['npu']:.2f}", flush=True)
    dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, up to 4 MB")
    args, _ = parser.parse_known_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rounds, sizes = (2, SIZES[:4]) if args.quick else (5, SIZES)
    os.environ["NPU_EMU_DEVICES"] = "2"   # the children's emulators: one device each
    print("all_reduce, 2 processes: npu tensors (hccl) against cpu tensors (gloo), best of %d rounds" % rounds)
    mp.spawn(worker, args=(port, rounds, sizes), nprocs=2)


if __name__ == "__main__":
    main()
