"""The model zoo (examples/zoo.py: GPT-style decoder, ResNet-style CNN, ViT-style
encoder; tiny sizes), and GPT-2 and Llama from transformers configs where
transformers is installed: a training step and inference, eager and compiled
(inductor), on the npu and on the cpu, in one run.

Printed per model: step times, then the ratios that matter
  npu/cpu compiled  = cpu compiled time / npu compiled time (target >= 0.9: same kernels)
  compile speed-up  = eager time / compiled time, on the npu and on the cpu
plus a normalization/pointwise-heavy block (RMSNorm + SwiGLU + rotary, small
matmuls) compiled with inductor and with backend="npu" against eager npu
(target >= 1.5x), and the first-compile latency of the GPT, npu against cpu
(target within 1.2x).

    python benchmarks/bench_models.py [--quick]
"""
import argparse
import copy
import os
import sys
import time

import torch

import torch_npu

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import zoo  # noqa: E402


def sync(device):
    if device == "npu":
        torch.npu.synchronize()


def timed(fn, device, repeats):
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def runners(model, make_batch, loss_fn, device, compiled):
    model = copy.deepcopy(model).to(device)
    run = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, targets = make_batch(0)
    inputs, targets = inputs.to(device), targets.to(device)

    def train():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(run(inputs), targets).backward()
        optimizer.step()

    def infer():
        model.eval()
        with torch.no_grad():
            run(inputs)

    train()          # compiles the training graphs ...
    infer()          # ... and the inference ones
    sync(device)
    return train, infer


def measure(name, model, make_batch, loss_fn, repeats, eager_only=False):
    compiled_modes = (False,) if eager_only else (False, True)
    configs = [(device, compiled) for device in ("cpu", "npu") for compiled in compiled_modes]
    steps = {config: runners(model, make_batch, loss_fn, *config) for config in configs}
    times = {}
    # Rounds interleave the four configurations, so the machine's slow spells hit them alike.
    for _ in range(repeats):
        for mode, index in (("train", 0), ("infer", 1)):
            for config in configs:
                best = timed(steps[config][index], config[0], 1)
                times[config + (mode,)] = min(times.get(config + (mode,), best), best)
    torch._dynamo.reset()
    for mode in ("train", "infer"):
        t = {k[:2]: v for k, v in times.items() if k[2] == mode}
        if eager_only:
            print(f"  {name:<8} {mode:<5}  npu eager {t[('npu', False)] * 1e3:7.2f} ms  cpu eager "
                  f"{t[('cpu', False)] * 1e3:7.2f} ms | npu/cpu eager {t[('npu', False)] / t[('cpu', False)]:.3f}")
            continue
        print(f"  {name:<8} {mode:<5}  npu eager {t[('npu', False)] * 1e3:7.2f} ms  cpu eager "
              f"{t[('cpu', False)] * 1e3:7.2f} ms  npu compiled {t[('npu', True)] * 1e3:7.2f} ms  cpu compiled "
              f"{t[('cpu', True)] * 1e3:7.2f} ms | npu/cpu compiled {t[('cpu', True)] / t[('npu', True)]:.2f}  "
              f"speed-up npu {t[('npu', False)] / t[('npu', True)]:.2f} cpu {t[('cpu', False)] / t[('cpu', True)]:.2f}")


class NormBlock(torch.nn.Module):
    """RMSNorm, rotary and SwiGLU around small matmuls: launch- and memory-bound when eager."""

    def __init__(self, dim=64, context=32):
        super().__init__()
        self.norm1, self.norm2 = zoo.RMSNorm(dim), zoo.RMSNorm(dim)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.mlp = zoo.SwiGLU(dim, dim)
        angles = torch.arange(context)[:, None] * (1.0 / 10000 ** (torch.arange(dim // 2) / (dim // 2)))
        self.register_buffer("cos", torch.cat((angles.cos(), angles.cos()), -1))
        self.register_buffer("sin", torch.cat((angles.sin(), angles.sin()), -1))

    def forward(self, x):
        h = self.norm1(x)
        h = h * self.cos + zoo.rotate_half(h) * self.sin
        x = x + self.proj(h)
        return x + self.mlp(self.norm2(x))


def norm_block(repeats, shape):
    from torch_npu._compile.backend import NpuBackend
    torch.manual_seed(0)
    block = NormBlock(dim=shape[2], context=shape[1]).npu()
    x = torch.randn(*shape, device="npu", requires_grad=True)

    def step(fn):
        def run():
            fn(x).sum().backward()
        return run

    results = {}
    for name, fn in (("eager", block), ("inductor", torch.compile(copy.deepcopy(block))),
                     ("npu", torch.compile(copy.deepcopy(block), backend=NpuBackend()))):
        step(fn)()
        results[name] = timed(step(fn), "npu", repeats)
    torch._dynamo.reset()
    print(f"  norm block {list(shape)} fwd+bwd: eager {results['eager'] * 1e3:.2f} ms, inductor {results['inductor'] * 1e3:.2f} "
          f"ms ({results['eager'] / results['inductor']:.2f}x), backend='npu' {results['npu'] * 1e3:.2f} ms "
          f"({results['eager'] / results['npu']:.2f}x); target >= 1.5x")


def transformers_models():
    try:
        import transformers
    except ImportError:
        return []
    gpt2 = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0,
                                   eos_token_id=0)
    llama = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                     num_attention_heads=4, num_key_value_heads=4, vocab_size=128)
    out = []
    for name, config, cls in (("gpt2", gpt2, transformers.GPT2LMHeadModel),
                              ("llama", llama, transformers.LlamaForCausalLM)):
        torch.manual_seed(0)
        model = cls(config)

        def make_batch(step):
            tokens = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(step))
            return tokens, tokens

        out.append((name, model, make_batch, lambda outputs, targets: outputs.logits.float().mean()))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the zoo's GPT only, fewer repeats")
    parser.add_argument("--eager-only", action="store_true",
                        help="eager steps only, npu/cpu time ratio (target <= 1.03); no compile")
    args, _ = parser.parse_known_args(argv)
    os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")   # first-compile times are real
    repeats = 5 if args.quick else 30
    print("Models, eager and compiled (inductor), npu against cpu (best of %d)" % repeats)
    names = ["gpt"] if args.quick else ["gpt", "resnet", "vit"]
    for name in names:
        model, make_batch, loss_fn = zoo.build(name, device="cpu")
        measure(name, model, make_batch, loss_fn, repeats, args.eager_only)
    if not args.quick:
        for name, model, make_batch, loss_fn in transformers_models():
            measure(name, model, make_batch, loss_fn, repeats, args.eager_only)
    if args.eager_only:
        return
    first = {device: first_compile(device) for device in ("cpu", "npu")}
    print(f"  first compile of the GPT (train step + inference, fresh process, no caches): npu {first['npu']:.1f} s, "
          f"cpu {first['cpu']:.1f} s ({first['npu'] / first['cpu']:.2f}x; target <= 1.2x)")
    for shape in ((16, 32, 64), (32, 64, 256)):
        norm_block(repeats, shape)


FIRST_COMPILE = """
import sys, time, torch, torch_npu
sys.path.insert(0, {examples!r})
import zoo
model, make_batch, loss_fn = zoo.build("gpt", device={device!r})
tokens, targets = make_batch(0)
compiled = torch.compile(model)
start = time.perf_counter()
loss_fn(compiled(tokens), targets).backward()
with torch.no_grad():
    model.eval(); compiled(tokens)
print("seconds", time.perf_counter() - start)
"""


def first_compile(device):
    import subprocess
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    code = FIRST_COMPILE.format(examples=os.path.join(HERE, "..", "examples"), device=device)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return float(out.split("seconds")[-1])


if __name__ == "__main__":
    main()
