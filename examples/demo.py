"""The main job: train a small transformer on the npu, then report where its ops ran.

Run it with `make demo`. It trains the same model on the cpu and on the npu
from the same seed, checks they agree, and prints:
  * the loss curve and the time per training step on both devices;
  * which aten ops the step used and how each ran on the npu: a native npu
    kernel, or the CPU fallback (with counts, time and bytes copied);
  * the npu memory the step needed and an event-timed step.
"""
import collections
import copy
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import torch_npu

VOCAB, CLASSES, WIDTH, SEQ, BATCH, STEPS = 64, 8, 64, 16, 32, 60


class TokenClassifier(nn.Module):
    """Embedding -> transformer encoder layer -> mean pool -> linear head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.encoder = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=4 * WIDTH, dropout=0.1,
                                                  batch_first=True)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def make_batches(seed):
    """A learnable task: the class is the largest token of the sequence, bucketed."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(STEPS):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        labels = tokens.max(dim=1).values * CLASSES // VOCAB
        batches.append((tokens, labels))
    return batches


def train(model, batches, device):
    model = copy.deepcopy(model).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, correct = [], torch.zeros((), dtype=torch.float64, device=device)
    torch.manual_seed(1)  # same dropout masks on both devices
    start = time.perf_counter()
    for tokens, labels in batches:
        tokens, labels = tokens.to(device), labels.to(device)
        logits = model(tokens)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        # A float64 accumulator: the npu has no float64 kernels, so this falls back.
        correct += (logits.argmax(dim=1) == labels).sum().double()
    seconds = (time.perf_counter() - start) / len(batches)
    return model, losses, seconds, correct.item() / (len(batches) * BATCH)


class OpRecorder(TorchDispatchMode):
    """Counts the aten ops that reach the device (after PyTorch's decompositions)."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func.name()] += 1
        return func(*args, **(kwargs or {}))


def where_ops_ran(model, batch):
    tokens, labels = (t.to("npu") for t in batch)
    torch_npu.NPUFallbackMode.reset_fallback_stats()
    with OpRecorder() as recorder:
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        (loss.detach().double() * 2).item()  # one float64 op, to show a dtype fallback
    fallbacks = torch_npu.NPUFallbackMode.get_fallback_stats()
    rows = collections.defaultdict(lambda: [0, 0])
    for name, calls in recorder.calls.items():
        info = torch_npu._ops_registry.get(name)
        where = info.backend if info else "unknown"
        if name in fallbacks:
            where = "cpu (fallback)"
        rows[where][0] += 1
        rows[where][1] += calls
    return recorder.calls, rows, fallbacks


def main():
    print(f"torch {torch.__version__}, torch_npu {torch_npu.__version__}: "
          f"{torch.npu.device_count()} x {torch.npu.get_device_name()} "
          f"({torch.npu.get_device_properties().total_memory / 2**30:.1f} GiB)")
    print(f"native npu kernels registered: {torch_npu._ops_registry.num_registered}")

    torch.manual_seed(0)
    model = TokenClassifier()
    batches = make_batches(seed=0)
    _, cpu_losses, cpu_step, cpu_acc = train(model, batches, "cpu")
    torch.npu.reset_peak_memory_stats()
    npu_model, npu_losses, npu_step, npu_acc = train(model, batches, "npu")

    print("\nTraining (same seed on both devices)")
    for step in (0, 9, 19, 39, STEPS - 1):
        print(f"  step {step + 1:3d}: loss cpu {cpu_losses[step]:.4f}  npu {npu_losses[step]:.4f}")
    drift = max(abs(a - b) for a, b in zip(cpu_losses, npu_losses))
    print(f"  largest loss difference cpu vs npu: {drift:.2e}; accuracy cpu {cpu_acc:.1%}, npu {npu_acc:.1%}")
    print(f"  time per step: cpu {cpu_step * 1e3:.1f} ms, npu {npu_step * 1e3:.1f} ms "
          f"(npu/cpu {npu_step / cpu_step:.2f}x)")
    if drift > 1e-3:
        raise SystemExit("npu and cpu training disagree")

    calls, rows, fallbacks = where_ops_ran(npu_model, batches[0])
    print("\nWhere the ops of one training step ran (forward + backward)")
    print(f"  {'backend':<16} {'ops':>5} {'calls':>6}")
    for where, (ops, n) in sorted(rows.items()):
        print(f"  {where:<16} {ops:>5} {n:>6}")
    print("  most called:", ", ".join(f"{name} x{n}" for name, n in calls.most_common(6)))
    print("\nCPU fallbacks of that step (torch_npu.NPUFallbackMode.get_fallback_stats())")
    print("  " + fallbacks.table().replace("\n", "\n  "))
    print("  (float64 has no npu kernels: keep metrics in float32, or allow it per op with "
          "NPUFallbackMode.set_op_fallback)")

    print("\nMemory and timing")
    print(f"  peak allocated {torch.npu.max_memory_allocated() / 2**20:.1f} MiB, "
          f"reserved {torch.npu.memory_reserved() / 2**20:.1f} MiB")
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    tokens, labels = (t.to("npu") for t in batches[0])
    start.record()
    F.cross_entropy(npu_model(tokens), labels).backward()
    end.record()
    end.synchronize()
    print(f"  one forward+backward timed with npu events: {start.elapsed_time(end):.2f} ms")


if __name__ == "__main__":
    main()
