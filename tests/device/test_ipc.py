"""npu tensors and events shared between processes, as torch.multiprocessing shares CUDA's.

The patterns of PyTorch's multiprocessing notes: a producer sends tensors on a queue to
spawned consumers, keeps them alive while the consumers use them, and the consumers drop
them when done. Each scenario runs as one script in a fresh interpreter (spawn needs a
main module), printing a JSON line of what it saw.
"""
import json
import pickle

import pytest
import torch
import torch_npu
from multiprocessing.reduction import ForkingPickler

from helpers import last_line

# A HAL without interprocess memory (NPU_EMU_PROTECT=1) refuses: tests/device/test_contracts.py.
pytestmark = pytest.mark.skipif("not torch_npu._C._ipc_supported(0)",  # at each test, not at import
                                reason="the HAL has no interprocess memory (Capabilities::interprocess)")


def run_script(run_python, tmp_path, source, env=None, timeout=120):
    script = tmp_path / "scenario.py"
    script.write_text(source)
    proc = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", env=env,
                      timeout=timeout)
    return json.loads(last_line(proc))


# ---- writes both ways, events, views, parameters ----------------------------------------

BOTH_WAYS = r"""
import json, torch, torch.multiprocessing as mp

def consumer(inbox, outbox):
    torch.npu.init()
    outbox.put("ready")                           # waiting in get(): the tensor arrives before the fill runs
    x, window, same, param = inbox.get(timeout=60)
    seen = x.cpu().tolist()                       # the producer's queued write must have landed
    window_seen = window.cpu().tolist()
    same_storage = same.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    x.mul_(10)                                    # written by the consumer, on its own stream
    done = torch.npu.Event(interprocess=True)
    done.record()
    outbox.put((seen, window_seen, same_storage, type(param).__name__, param.requires_grad, done))
    inbox.get(timeout=60)                         # the producer has read: release
    del x, window, same, param

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consumer, args=(inbox, outbox))
    p.start()
    assert outbox.get(timeout=60) == "ready"
    x = torch.zeros(8, device="npu")
    values = torch.arange(3.0, device="npu")
    param = torch.nn.Parameter(torch.ones(2, device="npu"))
    torch.npu.synchronize()
    torch.npu._sleep(500)                         # queued (NPU_EMU_ALWAYS_ENQUEUE): the writes run 500 ms later
    x.fill_(7.0)
    x[2:5].copy_(values)
    inbox.put((x, x[2:5], x.view(2, 4), param))   # put() returns before the writes ran
    queued = not torch.npu.current_stream().query()
    seen, window_seen, same_storage, param_type, requires_grad, done = outbox.get(timeout=60)
    done.wait()                                   # this process's stream waits for the consumer's write
    after = x.cpu().tolist()
    inbox.put(None)
    p.join(60)
    print(json.dumps({"seen": seen, "window": window_seen, "same_storage": same_storage, "param": param_type,
                      "requires_grad": requires_grad, "after": after, "queued": queued, "exitcode": p.exitcode,
                      "event": repr(done)}))
"""


def test_a_consumer_sees_the_producers_writes_and_the_producer_the_consumers(run_python, tmp_path):
    out = run_script(run_python, tmp_path, BOTH_WAYS,
                     env={"NPU_EMU_ALWAYS_ENQUEUE": "1", "NPU_LAUNCH_BLOCKING": None})
    assert out["seen"] == [7.0, 7.0, 0.0, 1.0, 2.0, 7.0, 7.0, 7.0], "the consumer read before the producer's write"
    assert out["window"] == [0.0, 1.0, 2.0], "a view arrives at its offset"
    assert out["same_storage"], "two tensors of one storage arrive on one storage"
    assert out["param"] == "Parameter" and out["requires_grad"]
    assert out["after"] == [70.0, 70.0, 0.0, 10.0, 20.0, 70.0, 70.0, 70.0], "the producer did not see the write"
    assert out["exitcode"] == 0 and out["queued"], "the writes were not pending when the tensor was sent"
    assert "interprocess" in out["event"]


# ---- the producer keeps the memory until consumers release it ---------------------------

KEEP_ALIVE = r"""
import json, os, time, torch, torch.multiprocessing as mp

N = 1 << 18   # 1 MiB of float32

def consumer(inbox, outbox, exit_without_release):
    x = inbox.get(timeout=60)
    outbox.put("received")
    inbox.get(timeout=60)                 # the producer dropped its tensor and allocated anew
    outbox.put(x[:4].cpu().tolist())      # still ours: not reused by the producer
    if exit_without_release:
        outbox.close()
        outbox.join_thread()              # the answer is sent before the exit
        os._exit(0)                       # never releases: its exit does
    del x
    torch.npu.synchronize()
    outbox.put("released")
    inbox.get(timeout=60)

def scenario(ctx, exit_without_release):
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consumer, args=(inbox, outbox, exit_without_release))
    p.start()
    base = torch.npu.memory_allocated()
    x = torch.full((N,), 3.0, device="npu")
    inbox.put(x)
    assert outbox.get(timeout=60) == "received"
    ptr = x.data_ptr()
    del x
    torch.npu.ipc_collect()
    held = torch.npu.memory_allocated() - base        # the consumer holds it
    y = torch.full((N,), -1.0, device="npu")         # must not reuse the held block
    reused = y.data_ptr() == ptr
    inbox.put(None)
    consumer_saw = outbox.get(timeout=60)
    if exit_without_release:
        p.join(60)
    else:
        assert outbox.get(timeout=60) == "released"
    torch.npu.ipc_collect()
    after = torch.npu.memory_allocated() - base - y.numel() * 4
    if not exit_without_release:
        inbox.put(None)
        p.join(60)
    return {"held": held, "reused": reused, "consumer_saw": consumer_saw, "after": after, "exitcode": p.exitcode,
            "limbo": torch_npu._C._ipc_limbo_count()}

if __name__ == "__main__":
    import torch_npu
    ctx = mp.get_context("spawn")
    print(json.dumps({"released": scenario(ctx, False), "exited": scenario(ctx, True)}))
"""


def test_the_producer_keeps_sent_memory_until_consumers_release_it(run_python, tmp_path):
    out = run_script(run_python, tmp_path, KEEP_ALIVE)
    for case in ("released", "exited"):
        result = out[case]
        assert result["held"] == 1 << 20, (case, result)   # dropped by the producer, kept for the consumer
        assert not result["reused"], (case, result)
        assert result["consumer_saw"] == [3.0] * 4, (case, result)
        assert result["after"] == 0 and result["limbo"] == 0, (case, result)   # ipc_collect freed it
        assert result["exitcode"] == 0


# ---- a DataLoader whose workers return npu tensors ----------------------------------------

DATALOADER = r"""
import json, torch
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self):
        return 12
    def __getitem__(self, i):
        return torch.full((3,), float(i * i), device="npu")    # made on the npu in the worker

if __name__ == "__main__":
    loader = DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context="spawn")
    batches = [b for b in loader]
    print(json.dumps({"devices": sorted({str(b.device) for b in batches}),
                      "values": [b[:, 0].cpu().tolist() for b in batches],
                      "sum": sum(float(b.sum().cpu()) for b in batches)}))
"""


def test_a_dataloader_with_spawned_workers_returns_npu_tensors(run_python, tmp_path):
    out = run_script(run_python, tmp_path, DATALOADER)
    assert out["devices"] == ["npu:0"]
    assert out["values"] == [[0.0, 1.0, 4.0, 9.0], [16.0, 25.0, 36.0, 49.0], [64.0, 81.0, 100.0, 121.0]]
    assert out["sum"] == 3 * sum(i * i for i in range(12))


FORKED_WORKERS = r"""
import json, torch
from torch.utils.data import DataLoader, Dataset

class OnTheNpu(Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, i):
        return torch.ones(2, device="npu")

if __name__ == "__main__":
    torch.ones(1, device="npu")           # the parent uses the npu: a forked worker cannot (as with CUDA)
    try:
        list(DataLoader(OnTheNpu(), num_workers=1, multiprocessing_context="fork"))
        print(json.dumps({"error": None}))
    except Exception as e:
        print(json.dumps({"error": str(e)}))
"""


def test_forked_workers_cannot_make_npu_tensors_once_the_parent_used_the_npu(run_python, tmp_path):
    out = run_script(run_python, tmp_path, FORKED_WORKERS)
    assert out["error"] is not None and "spawn" in out["error"]


# ---- in one process, and what cannot be shared ---------------------------------------------

def test_pickling_in_one_process_gives_the_same_memory():
    x = torch.arange(6.0, device="npu")
    y = ForkingPickler.loads(ForkingPickler.dumps(x[1:4]))
    assert y.device == x.device and y.tolist() == [1.0, 2.0, 3.0]
    assert y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    y.fill_(-1.0)
    assert x.tolist() == [0.0, -1.0, -1.0, -1.0, 4.0, 5.0]
    empty = ForkingPickler.loads(ForkingPickler.dumps(torch.empty(0, device="npu")))
    assert empty.device.type == "npu" and empty.numel() == 0
    del y
    torch.npu.ipc_collect()


def test_what_cannot_be_sent_says_why():
    x = torch.ones(3, device="npu")
    with pytest.raises(RuntimeError, match="Cannot pickle npu storage; try pickling an npu tensor"):
        ForkingPickler.dumps(x.untyped_storage())
    with pytest.raises(RuntimeError, match="Cowardly refusing"):
        ForkingPickler.dumps(x.requires_grad_() * 2)
    with pytest.raises(RuntimeError, match="not interprocess.*interprocess=True"):
        torch.npu.Event().ipc_handle()
    with pytest.raises(ValueError, match="interprocess event cannot time"):
        torch.npu.Event(enable_timing=True, interprocess=True)
    assert pickle.dumps(torch.ones(2)) is not None   # plain pickling of cpu tensors is untouched


def test_an_interprocess_event_in_one_process():
    event = torch.npu.Event(interprocess=True)
    assert event.query()
    handle = event.ipc_handle()
    assert isinstance(handle, bytes) and len(handle) <= 64
    opened = torch.npu.Event.from_ipc_handle(0, handle)
    assert isinstance(opened, torch.npu.Event) and opened.device == torch.device("npu", 0)
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        torch.npu._sleep(50)
        event.record()
    opened.wait()                        # the current stream waits for s
    opened.synchronize()
    assert event.query() and opened.query()
    again = ForkingPickler.loads(ForkingPickler.dumps(event))
    assert again.ipc_handle() == handle
    with pytest.raises(RuntimeError, match="cannot time"):
        event.elapsed_time(opened)


def test_the_capability_is_the_hals():
    import os
    assert torch_npu._C._ipc_supported(0) == (os.environ.get("NPU_EMU_PROTECT", "0") in ("", "0"))


def test_the_readme_example_runs(run_python):
    from pathlib import Path
    example = Path(__file__).resolve().parents[2] / "examples" / "share_npu_tensors.py"
    proc = run_python(f"import runpy; runpy.run_path({str(example)!r}, run_name='__main__')")
    assert "producer reads [1.0, 1.0, 1.0, 1.0]" in proc.stdout
    assert "npu memory allocated 0" in proc.stdout
