"""A training script full of the classic traps of accelerator code.

Each planted trap is marked with a `# TRAP: <kind>` comment on its line; run

    python -m torch_npu.doctor examples/traps.py

and the doctor's report names each of these lines (tests/doctor/test_doctor.py checks it).
Written as a CUDA script: under the doctor, "cuda" means the npu.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_npu


class Net(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default=None)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")

    torch.manual_seed(0)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    class_weights = torch.tensor([1.0, 2.0, 1.0, 0.5])     # a cpu constant
    x = torch.randn(64, 32, device=device)
    y = torch.randint(0, 4, (64,), device=device)
    table = torch.randn(1024, 512, device=device)     # never changes
    buffer = torch.randn(2048, 512, device=device)
    trend = torch.zeros(1024, device=device)
    kept = []
    # The op policy stands for any op the npu cannot run (forced here, so the trap
    # does not depend on which kernels exist).
    torch_npu.NPUFallbackMode.set_op_fallback("aten::erfinv", "cpu")
    accuracy = torch.zeros((), dtype=torch.float64, device=device)

    for step in range(args.steps):
        weights = class_weights.to(device)                                  # TRAP: host_to_device_copy
        logits = model(x)
        loss = F.cross_entropy(logits, y, weight=weights)
        penalty = torch.zeros((), device=device)
        for p in model.parameters():
            for row in p.reshape(-1, p.shape[-1])[:16]:
                penalty = penalty + row.abs().sum() * 1e-4                  # TRAP: launch_bound
        (loss + penalty).backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")                        # TRAP: hidden_sync
        accuracy += (logits.argmax(1) == y).double().mean()                 # TRAP: float64
        noise = torch.erfinv(torch.rand(64, device=device) * 1.8 - 0.9)     # TRAP: cpu_fallback
        kept.append(model(x + noise[:, None]).detach() * 1.0)               # TRAP: memory_growth
        columns = table.t().contiguous()                                    # TRAP: strided_copy
        buffer[:, ::2].mul_(0.99)                                           # TRAP: strided_copy
        trend = 0.9 * trend + 0.1 * columns[0]
        torch.cuda.synchronize()                                            # TRAP: hidden_sync

    torch_npu.NPUFallbackMode.set_op_fallback("aten::erfinv", "default")
    return {"accuracy": (accuracy / args.steps).item(), "kept": len(kept)}


if __name__ == "__main__":
    main()
