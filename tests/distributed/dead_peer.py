"""A peer that dies, or stops, in the middle of training: the other rank's next
collective raises DistBackendError instead of waiting forever. argv[1]: "exit"
(rank 1 exits) or "stall" (rank 1 sleeps past the group's 5 s timeout)."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_npu

device = torch_npu.distributed.local_device()
dist.init_process_group("hccl", timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
t = torch.ones(1024, device=device)
dist.all_reduce(t)                       # both alive: fine
if rank == 1:
    if sys.argv[1] == "exit":
        os._exit(3)
    time.sleep(20)
    os._exit(0)
start = time.monotonic()
try:
    dist.all_reduce(t)
    print("rank 0: the collective returned", flush=True)
except dist.DistBackendError as e:
    message = str(e).splitlines()[0]
    print(f"rank 0: DistBackendError after {time.monotonic() - start:.1f} s: {message}", flush=True)
os._exit(0)
