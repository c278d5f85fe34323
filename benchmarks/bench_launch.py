"""Where should a kernel run: on the caller's thread or on the stream's worker?

The emulated NPU runs a kernel launched on an idle stream on the caller's thread
unless it touches more than NPU_EMU_INLINE_BYTES (default: unlimited);
NPU_EMU_ALWAYS_ENQUEUE=1 queues everything. This benchmark measures each policy,
in child processes, as npu/cpu time ratios of the same work in the same child:
add on 16, 4096, 1M and 16M (out=) elements, and a transformer training step.

    python benchmarks/bench_launch.py
"""
import json
import os
import subprocess
import sys

POLICIES = {
    "always enqueue": {"NPU_EMU_ALWAYS_ENQUEUE": "1"},
    "inline <= 64 KiB": {"NPU_EMU_INLINE_BYTES": "64KiB"},
    "inline <= 1 MiB": {"NPU_EMU_INLINE_BYTES": "1MiB"},
    "inline always (default)": {},
}

CHILD = r"""
import json, time, copy
import torch, torch.nn as nn, torch.nn.functional as F
import torch_npu

def best(fn, device, iters, repeats=5):
    fn(); torch.npu.synchronize()
    out = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        if device == "npu":
            torch.npu.synchronize()
        out = min(out, (time.perf_counter() - t) / iters)
    return out

results = {}
for n, iters in ((16, 2000), (4096, 2000), (1 << 20, 100), (1 << 24, 5)):
    ratio = {}
    for device in ("cpu", "npu"):
        a, b = torch.randn(n, device=device), torch.randn(n, device=device)
        o = torch.empty(n, device=device)
        ratio[device] = best(lambda: torch.add(a, b, out=o), device, iters)
    results[f"add {n}"] = ratio["npu"] / ratio["cpu"]
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
x = torch.randn(8, 64, 256)
step = {}
for device in ("cpu", "npu"):
    m = copy.deepcopy(layer).to(device)
    opt = torch.optim.Adam(m.parameters())
    xd = x.to(device)
    def train():
        opt.zero_grad(); m(xd).square().mean().backward(); opt.step()
    step[device] = best(train, device, 8, repeats=3)
results["training step"] = step["npu"] / step["cpu"]
print(json.dumps(results))
"""


def main():
    rows = {}
    for name, env in POLICIES.items():
        child_env = {k: v for k, v in os.environ.items()
                     if k not in ("NPU_EMU_ALWAYS_ENQUEUE", "NPU_EMU_INLINE_BYTES")}
        child_env.update(env)
        proc = subprocess.run([sys.executable, "-c", CHILD], env=child_env, capture_output=True, text=True,
                              check=True)
        rows[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    columns = list(next(iter(rows.values())).keys())
    print("npu/cpu time ratio of add(out=) and a training step, per launch policy")
    print(f"  {'policy':<26}" + "".join(f"{c:>15}" for c in columns))
    for name, values in rows.items():
        print(f"  {name:<26}" + "".join(f"{values[c]:>15.2f}" for c in columns))
    return rows


if __name__ == "__main__":
    main()
