"""Graph replay against eager: the zoo's GPT and a launch-bound MLP (24 small
Linear + ReLU layers; with GELU it would not be launch-bound: ATen's CPU GELU costs
about 9 us on 256 floats, more than a launch), an inference step and a whole training step (forward, backward and an SGD
step, captured with torch.npu.graph as CUDA's whole-network recipe does), replayed
on the npu, against npu eager and cpu eager, in one run.

Printed per model and step: the times, and the ratios that matter
  replay/cpu eager  (target <= 0.5 for the launch-bound MLP: a graph removes the launches)
  replay/npu eager  (target <= 1: never slower than eager)

    python benchmarks/bench_graphs.py [--quick]
"""
import argparse
import copy
import os
import sys
import time

import torch

import torch_npu  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import zoo  # noqa: E402


def mlp(depth=24, width=32):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def models():
    gpt, make_batch, loss_fn = zoo.build("gpt", device="cpu")
    x, y = make_batch(0)
    yield "GPT", gpt, x, y, loss_fn
    torch.manual_seed(1)
    yield "MLP 24x32", mlp(), torch.randn(8, 32), torch.randint(0, 10, (8,)), torch.nn.functional.cross_entropy


def sync(device):
    if device == "npu":
        torch.npu.synchronize()


def best_of(fn, device, iterations, repeats):
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        sync(device)
        best = min(best, (time.perf_counter() - start) / iterations)
    return best


def steps(model, x, y, loss_fn, device):
    """(inference step, training step) closures of eager code on ``device``."""
    model = copy.deepcopy(model).to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def infer():
        with torch.no_grad():
            return model(x)

    def train():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return infer, train


def graphed(model, x, y, loss_fn):
    """(inference replay, training replay) on the npu: each step captured whole."""
    infer, train = steps(model, x, y, loss_fn, "npu")
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):                     # warm up: optimizer state, lazy initialisations
        for _ in range(3):
            infer()
            train()
    torch.npu.current_stream().wait_stream(side)
    g_infer, g_train = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    with torch.npu.graph(g_infer):
        infer()
    with torch.npu.graph(g_train):
        train()

    # The graphs read and write the model's, the optimizer's and the batch's memory: the
    # closures keep them alive, as CUDA graphs need their static tensors kept.
    def replay_infer(keep=(infer, train)):
        g_infer.replay()

    def replay_train(keep=(infer, train)):
        g_train.replay()

    return replay_infer, replay_train


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations and repeats")
    args, _ = parser.parse_known_args(argv)
    iterations, repeats = (5, 2) if args.quick else (20, 5)
    print(f"Graph replay against eager (per step, best of {repeats} x {iterations})")
    print(f"  {'model':<10} {'step':<9} {'cpu eager':>10} {'npu eager':>10} {'npu replay':>11}  "
          f"{'replay/cpu':>10} {'replay/npu':>10}")
    for name, model, x, y, loss_fn in models():
        cpu = steps(model, x, y, loss_fn, "cpu")
        npu = steps(model, x, y, loss_fn, "npu")
        replay = graphed(model, x, y, loss_fn)
        for i, step in enumerate(("inference", "training")):
            t_cpu = best_of(cpu[i], "cpu", iterations, repeats)
            t_npu = best_of(npu[i], "npu", iterations, repeats)
            t_replay = best_of(replay[i], "npu", iterations, repeats)
            print(f"  {name:<10} {step:<9} {t_cpu * 1e3:8.2f}ms {t_npu * 1e3:8.2f}ms {t_replay * 1e3:9.2f}ms  "
                  f"{t_replay / t_cpu:10.2f} {t_replay / t_npu:10.2f}")


if __name__ == "__main__":
    main()
