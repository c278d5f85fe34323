"""Device profiles (NPU_EMU_PROFILE): a training step of each zoo model
(examples/zoo.py: GPT, ResNet, ViT; AdamW) on the emulated npu as each chip,
against the generic profile in the same run.

Printed per model and profile:
  fallbacks per step (count, their time) and which ops fell back;
  the measured wall time per step (median of the steps after warm-up);
  the step as the chip would run it (torch_npu.profiler.analyse of one profiled
  step: projected device time, kernels, launch overhead's share, host- or
  device-bound; chip profiles only);
  chip/generic = measured step time under the chip profile / under generic,
  beside the fallbacks' share of the chip's step; target: the chip profile is no
  slower than its fallbacks make it, i.e. (chip step - fallback time) / generic
  step <= 1.0 (within the machine's noise). An op outside the chip's native set
  that has a decomposition runs as several native kernels instead of falling
  back (AdamW's _foreach_* ops on 910A/310P): "kernels" counts the npu kernels
  of the profiled step, and kernels chip/generic shows that cost.
Then a 512x256 @ 256x1024 float16 mm: ATen's cpu float16 kernel, the npu's
(float16 on the emulated matrix unit: float32 accumulation) and bfloat16 on
the npu, median ms and ratios.

A profile is fixed per process: each profile runs in a child process of its
own (this script with --child), in interleaved rounds (every profile once per
round) so the machine's slow spells hit them alike; the round with the lowest
median step time counts.

    python benchmarks/bench_profiles.py [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.abspath(__file__)
MARK = "BENCH_PROFILES_JSON "
ORDER = ["generic", "ascend910b1", "ascend910b2", "ascend910b3", "ascend910b4", "ascend910_9391", "ascend910a",
         "ascend310p3"]
QUICK_PROFILES = ["generic", "ascend910b2", "ascend310p3"]
PROJECTED = ("projected_device_us", "projected_kernels", "projected_step_us", "projected_bound")


# ---------------------------------------------------------------- children --

def child_models(models, warmup, steps):
    """Runs in a process whose NPU_EMU_PROFILE is the profile measured."""
    import torch
    import torch_npu
    from torch_npu import NPUFallbackMode
    from torch_npu.profiler import ProfilerActivity, analyse, profile
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import zoo

    out = {"profile": torch_npu._emu.profiles.active().name, "models": {}}
    for name in models:
        model, make_batch, loss_fn = zoo.build(name, device="npu", batch=8)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        inputs, targets = make_batch(0)

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(inputs), targets).backward()
            optimizer.step()
            torch.npu.synchronize()

        for _ in range(warmup):
            step()
        NPUFallbackMode.reset_fallback_stats()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        stats = NPUFallbackMode.get_fallback_stats()
        # One profiled step, after the timed ones (so the profiler's cost is in none of them).
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as prof:
            step()
        analysis = analyse(prof)
        out["models"][name] = {
            "step_ms": statistics.median(times) * 1e3,
            "fallbacks": stats.total / steps,
            "fallback_ms": stats.total_seconds * 1e3 / steps,
            "fallback_ops": {op: s.count / steps for op, s in stats.ops.items()},
            # None where analyse() lacks a field (an older torch_npu); "" / 0 under generic.
            "projected": {field: getattr(analysis, field, None) for field in PROJECTED},
            "kernels": analysis.kernels,  # npu kernels the emulator ran in the profiled step
        }
    print(MARK + json.dumps(out), flush=True)


def child_mm(repeats):
    """The float16 matmul figure, under the generic profile."""
    import torch
    import torch_npu  # noqa: F401

    # ATen's cpu float16 GEMM is fast or slow depending on the host's CPU: fast
    # where it has float16 arithmetic (AVX512-FP16, AMX-FP16), two orders of
    # magnitude slower where it has not (the issue measured 219 ms for this mm on
    # such a host). The npu computes float16 on the emulated matrix unit (float32
    # accumulation: widen, float32 GEMM, round once), so its time is about the
    # host's float32 GEMM whatever the host.
    torch.manual_seed(0)
    a, b = torch.randn(512, 256), torch.randn(256, 1024)
    configs = {
        "cpu float16 (ATen's kernel)": ("cpu", a.half(), b.half()),
        "npu float16 (matrix unit, float32 accumulation)": ("npu", a.half().npu(), b.half().npu()),
        "npu bfloat16": ("npu", a.bfloat16().npu(), b.bfloat16().npu()),
        "npu float32 (for reference)": ("npu", a.npu(), b.npu()),
    }
    for device, x, y in configs.values():  # warm up
        torch.mm(x, y)
    torch.npu.synchronize()
    times = {name: [] for name in configs}
    for _ in range(repeats):  # interleaved rounds
        for name, (device, x, y) in configs.items():
            start = time.perf_counter()
            torch.mm(x, y)
            if device == "npu":
                torch.npu.synchronize()
            times[name].append(time.perf_counter() - start)
    # ATen's cpu float16 GEMM accumulates in float32 too: the two agree to float16 rounding.
    error = (torch.mm(a.half().npu(), b.half().npu()).cpu().float() - torch.mm(a.half(), b.half()).float()).abs().max()
    error = error.item()
    print(MARK + json.dumps({"mm_ms": {name: statistics.median(t) * 1e3 for name, t in times.items()},
                             "npu_fp16_max_error": error}), flush=True)


# ------------------------------------------------------------------ parent --

def run_child(args, profile):
    env = dict(os.environ, NPU_EMU_PROFILE=profile, NPU_FALLBACK_MODE="auto")
    env.pop("NPU_FALLBACK_OPS", None)  # the profile alone decides what falls back
    proc = subprocess.run([sys.executable, SCRIPT] + args, env=env, capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK) and proc.returncode == 0:
            return json.loads(line[len(MARK):]), None
    return None, (f"child {' '.join(args)} (NPU_EMU_PROFILE={profile}) exited {proc.returncode}:\n"
                  f"{proc.stdout[-2000:]}{proc.stderr[-6000:]}")


def profiles_to_run(quick):
    import torch_npu
    known = list(torch_npu.npu.list_profiles())
    if quick:
        return [p for p in QUICK_PROFILES if p in known]
    return [p for p in ORDER if p in known] + sorted(p for p in known if p not in ORDER)


def fmt_count(x):
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.2f}"


def print_tables(profiles, models, best, quick, warmup, steps, rounds):
    print(f"Training step (forward, backward, AdamW) of the zoo models, batch 8, on each device profile "
          f"(median of {steps} steps after {warmup} warm-up, best of {rounds} round{'s' * (rounds > 1)}"
          f"{', --quick' if quick else ''})")
    print(f"  {'model':<7} {'profile':<15} {'step ms':>8} {'kernels':>7} {'fallbk/step':>11} {'fallbk ms':>9} | "
          f"{'projected on the chip: device ms':>32} {'kernels':>7} {'step ms':>7} {'bound':>6}")
    missing = False
    for model in models:
        for profile in profiles:
            r = best.get((profile, model))
            if r is None:
                print(f"  {model:<7} {profile:<15} FAILED (see above)")
                continue
            p = r["projected"]
            if p["projected_device_us"] is None:
                missing = True
                projected = f"{'n/a (analyse() lacks the fields)':>32} {'':>7} {'':>7} {'':>6}"
            elif not p["projected_bound"]:
                projected = f"{'-':>32} {'-':>7} {'-':>7} {'-':>6}"
            else:
                device_us = p["projected_device_us"]
                projected = (f"{device_us / 1e3:>32.3f} {p['projected_kernels']:>7} "
                             f"{p['projected_step_us'] / 1e3:>7.2f} {p['projected_bound']:>6}")
            print(f"  {model:<7} {profile:<15} {r['step_ms']:>8.2f} {r['kernels']:>7} {fmt_count(r['fallbacks']):>11} "
                  f"{r['fallback_ms']:>9.3f} | {projected}")
    if missing:
        print("  note: torch_npu.profiler.analyse() has no projected_* fields in this build")

    print("\nCost of a chip profile against generic (measured step times, same run)")
    print(f"  {'model':<7} {'profile':<15} {'chip/generic':>12} {'fallbacks share':>15} "
          f"{'(chip - fallbacks)/generic':>26} {'kernels chip/generic':>20}   target <= 1.0 (column 5)")
    for model in models:
        generic = best.get(("generic", model))
        for profile in profiles:
            r = best.get((profile, model))
            if profile == "generic" or r is None or generic is None:
                continue
            ratio = r["step_ms"] / generic["step_ms"]
            share = r["fallback_ms"] / r["step_ms"]
            rest = (r["step_ms"] - r["fallback_ms"]) / generic["step_ms"]
            kernels = r["kernels"] / generic["kernels"] if generic["kernels"] else float("nan")
            print(f"  {model:<7} {profile:<15} {ratio:>11.2f}x {100 * share:>14.1f}% {rest:>25.2f}x {kernels:>19.2f}x")

    print("\nFallbacks per step, by op")
    any_fallback = False
    for model in models:
        for profile in profiles:
            r = best.get((profile, model))
            if r is None or not r["fallback_ops"]:
                continue
            any_fallback = True
            ops = ", ".join(f"{fmt_count(n)}x {op}" for op, n in sorted(r["fallback_ops"].items(),
                                                                          key=lambda kv: (-kv[1], kv[0])))
            print(f"  {model:<7} {profile:<15} {ops}")
    if not any_fallback:
        print("  none")


def print_mm(result, repeats):
    mm = result["mm_ms"]
    cpu16, npu16, npubf = (mm["cpu float16 (ATen's kernel)"], mm["npu float16 (matrix unit, float32 accumulation)"],
                           mm["npu bfloat16"])
    print(f"\nfloat16 mm, 512x256 @ 256x1024 (median of {repeats}; the cpu's float16 speed depends on the host's CPU)")
    for name, ms in mm.items():
        print(f"  {name:<48} {ms:8.3f} ms")
    print(f"  npu float16 against cpu float16: {cpu16 / npu16:.2f}x the speed "
          f"(cpu {cpu16:.3f} ms / npu {npu16:.3f} ms)")
    print(f"  npu float16 against npu bfloat16: {npubf / npu16:.2f}x the speed "
          f"(npu bfloat16 {npubf:.3f} ms / npu float16 {npu16:.3f} ms)")
    print(f"  npu float16 result against the cpu's float16 result: max abs difference "
          f"{result['npu_fp16_max_error']:.3g}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="generic, ascend910b2 and ascend310p3 only, GPT and ResNet only, fewer steps")
    parser.add_argument("--child", nargs=4, metavar=("PROFILE", "MODELS", "WARMUP", "STEPS"), help=argparse.SUPPRESS)
    parser.add_argument("--child-mm", type=int, metavar="REPEATS", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)
    if args.child:
        return child_models(args.child[1].split(","), int(args.child[2]), int(args.child[3]))
    if args.child_mm:
        return child_mm(args.child_mm)

    start = time.perf_counter()
    profiles = profiles_to_run(args.quick)
    models = ["gpt", "resnet"] if args.quick else ["gpt", "resnet", "vit"]
    warmup, steps, rounds, mm_repeats = (3, 10, 2, 10) if args.quick else (3, 20, 3, 30)
    best, errors = {}, []
    for _ in range(rounds):  # interleaved: every profile once per round
        for profile in profiles:
            result, error = run_child(["--child", profile, ",".join(models), str(warmup), str(steps)], profile)
            if error:
                errors.append(error)
                continue
            if result["profile"] != profile:
                errors.append(f"child for {profile} ran as profile {result['profile']}")
                continue
            for model, r in result["models"].items():
                if (profile, model) not in best or r["step_ms"] < best[(profile, model)]["step_ms"]:
                    best[(profile, model)] = r
    for error in errors:
        print(error)
    print_tables(profiles, models, best, args.quick, warmup, steps, rounds)
    mm, error = run_child(["--child-mm", str(mm_repeats)], "generic")
    if error:
        errors.append(error)
        print(error)
    else:
        print_mm(mm, mm_repeats)
    print(f"\n  ({time.perf_counter() - start:.0f} s in all)")
    if errors:
        raise RuntimeError(f"bench_profiles: {len(errors)} child process(es) failed; their output is above")


if __name__ == "__main__":
    main()
