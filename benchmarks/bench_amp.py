"""Mixed precision on the npu: a training step of a 256-wide transformer block
in float32, and under torch.autocast("npu") with float16 (and a GradScaler) and
bfloat16. Ratios against the float32 step in the same run, interleaved rounds;
the cpu's autocast (bfloat16) is measured beside it for reference.

The emulated npu computes with ATen's cpu kernels, so its lower-precision
speed is the host's: bfloat16 matmuls use the cpu's bfloat16 instructions where
it has them, float16 mostly converts around float32 arithmetic.

    python benchmarks/bench_amp.py [--quick]
"""
import argparse
import time

import torch

import torch_npu  # noqa: F401


def make_step(device, dtype):
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, batch_first=True, dropout=0.0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
    x = torch.randn(8, 64, 256, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = model(x).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if device == "npu":
            torch.npu.synchronize()
    step()
    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args, _ = parser.parse_known_args(argv)
    rounds = 3 if args.quick else 10
    configs = {("npu", None): "npu float32", ("npu", torch.float16): "npu autocast float16 + GradScaler",
               ("npu", torch.bfloat16): "npu autocast bfloat16", ("cpu", None): "cpu float32",
               ("cpu", torch.bfloat16): "cpu autocast bfloat16"}
    steps = {config: make_step(*config) for config in configs}
    best = {}
    for _ in range(rounds):
        for config, step in steps.items():
            start = time.perf_counter()
            step()
            best[config] = min(best.get(config, float("inf")), time.perf_counter() - start)
    print(f"Training step of a 256-wide transformer block, 8x64 tokens (best of {rounds})")
    for config, name in configs.items():
        base = best[(config[0], None)]
        print(f"  {name:<36} {best[config] * 1e3:8.2f} ms   {base / best[config]:.2f}x the {config[0]} float32 step")


if __name__ == "__main__":
    main()
