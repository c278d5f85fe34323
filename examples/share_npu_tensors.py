"""npu tensors shared between processes, as CUDA tensors are: PyTorch's producer/consumer pattern.

    python examples/share_npu_tensors.py

The consumer (a spawned process) receives the producer's tensor on the same npu memory,
adds to it in place and hands back an interprocess event recorded after its write; the
producer waits for that event on its own stream and reads the consumer's result. The
producer keeps the memory until the consumer dropped its tensor; ipc_collect() frees it.
"""
import torch
import torch.multiprocessing as mp

import torch_npu  # noqa: F401  (import torch alone loads it too)


def consumer(inbox, outbox):
    weights = inbox.get()                    # the producer's tensor, on the same npu memory
    weights.add_(1.0)                        # written here, seen there
    done = torch.npu.Event(interprocess=True)
    done.record()
    outbox.put(done)
    inbox.get()                              # the producer has read it: drop ours
    del weights


if __name__ == "__main__":
    ctx = mp.get_context("spawn")            # as with CUDA: spawn, never fork
    inbox, outbox = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=consumer, args=(inbox, outbox))
    worker.start()
    weights = torch.zeros(4, device="npu")
    inbox.put(weights)
    outbox.get().wait()                      # this stream waits for the consumer's write
    print("producer reads", weights.cpu().tolist())   # [1.0, 1.0, 1.0, 1.0]
    inbox.put(None)
    worker.join()
    del weights
    torch.npu.ipc_collect()                  # the consumer released it: the memory is free again
    print("npu memory allocated", torch.npu.memory_allocated())
