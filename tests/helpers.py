"""Helpers for the torch_npu test-suite (importable from any test module)."""
import os
import subprocess
import sys
import textwrap

# Environment variables the emulator reads once, at first use: a test that needs
# other values runs its code in a fresh interpreter (see run_python).
EMULATOR_VARIABLES = (
    "NPU_EMU_DEVICES",
    "NPU_EMU_MEMORY",
    "NPU_EMU_ALWAYS_ENQUEUE",
    "NPU_EMU_DEFER",
    "NPU_EMU_INLINE_BYTES",
    "NPU_LAUNCH_BLOCKING",
)

# The repository (tests/ sits in it; test files sit one folder deeper, by area).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10


def run_python(code, env=None, timeout=120, check=True):
    """Runs ``code`` (dedented) in a new ``sys.executable`` process.

    ``env`` entries are added to the current environment; a value of None removes
    the variable. Returns the CompletedProcess (text stdout/stderr). With
    ``check`` (default) a non-zero exit status fails with the child's output.
    """
    full_env = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = str(value)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"subprocess exited with {proc.returncode}\n--- stdout ---\n{proc.stdout}\n"
            f"--- stderr ---\n{proc.stderr}"
        )
    return proc


def last_line(proc):
    """The last non-empty line the child printed (where scripts put their result)."""
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"the subprocess printed nothing; stderr:\n{proc.stderr}"
    return lines[-1]


# Scenarios that need true asynchrony, run together in one child process with
# NPU_EMU_ALWAYS_ENQUEUE=1 (by default a kernel launched on an idle stream runs on
# the caller's thread; with it every launch goes to the stream's worker, so the
# host really runs ahead of the device). The child prints one JSON object
# {scenario: result}; conftest's session fixture ``async_results`` holds it.
ASYNC_ENV = {"NPU_EMU_ALWAYS_ENQUEUE": "1", "NPU_LAUNCH_BLOCKING": None}

ASYNC_SCENARIOS = r"""
import json, time, torch

results = {}

def scenario(fn):
    try:
        results[fn.__name__] = fn()
    except Exception as error:  # reported, so one scenario cannot hide the others
        results[fn.__name__] = {"error": f"{type(error).__name__}: {error}"}
    torch.npu.synchronize()
    return fn

@scenario
def launch_returns_at_once():
    s = torch.npu.current_stream()
    x = torch.zeros(1 << 16, device="npu")
    torch.npu.synchronize()
    t0 = time.perf_counter()
    torch.npu._sleep(200)
    x.fill_(3.0)
    launch_ms = (time.perf_counter() - t0) * 1000
    busy = not s.query()
    torch.npu.synchronize()
    total_ms = (time.perf_counter() - t0) * 1000
    return {"launch_ms": launch_ms, "busy": busy, "total_ms": total_ms, "idle_after": s.query(),
            "value_ok": bool((x.cpu() == 3.0).all())}

@scenario
def event_query_while_busy():
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        torch.npu._sleep(150)
        e = torch.npu.Event()
        e.record()
    pending = not e.query()
    e.synchronize()
    return {"pending": pending, "done": e.query()}

@scenario
def device_synchronize_waits_for_side_stream():
    s = torch.npu.Stream()
    x = torch.zeros(1000, device="npu")
    torch.npu.synchronize()
    with torch.npu.stream(s):
        torch.npu._sleep(150)
        x.fill_(1.0)
    t0 = time.perf_counter()
    torch.npu.synchronize()
    return {"waited_ms": (time.perf_counter() - t0) * 1000, "idle": s.query(),
            "value_ok": bool((x.cpu() == 1).all())}

N = 1 << 20
s1, s2 = torch.npu.Stream(), torch.npu.Stream()

def cross_stream(order):
    x = torch.zeros(N, device="npu")
    torch.npu.synchronize()
    with torch.npu.stream(s1):
        torch.npu._sleep(150)
        x.fill_(5.0)
        e = torch.npu.Event()
        e.record()
    if order == "event":
        s2.wait_event(e)
    elif order == "stream":
        s2.wait_stream(s1)
    t0 = time.perf_counter()
    with torch.npu.stream(s2):
        y = torch.empty_like(x)
        y.copy_(x)
    host_ms = (time.perf_counter() - t0) * 1000
    s2.synchronize()
    seen = y.cpu()
    torch.npu.synchronize()
    state = "5" if bool((seen == 5.0).all()) else ("0" if bool((seen == 0.0).all()) else "mixed")
    return {"seen": state, "host_ms": host_ms}

@scenario
def cross_stream_wait_event():
    return cross_stream("event")

@scenario
def cross_stream_wait_stream():
    return cross_stream("stream")

@scenario
def cross_stream_unordered():
    return cross_stream("none")

@scenario
def kernel_error_reported_later():
    torch.npu._sleep(50)
    torch.npu._launch_failing_kernel("late-boom")  # returns: the error comes later
    out = {"launch_returned": True}
    try:
        torch.npu.synchronize()
        out["raised"] = None
    except RuntimeError as error:
        out["raised"] = str(error)
    torch.npu.synchronize()
    out["second_sync_clean"] = True
    return out

@scenario
def record_stream_delays_reuse():
    side = torch.npu.Stream()
    x = torch.empty(1024, device="npu")  # 4 KiB from the default stream's pool
    torch.npu.synchronize()
    ptr = x.data_ptr()
    with torch.npu.stream(side):
        torch.npu._sleep(200)
    x.record_stream(side)
    del x
    y = torch.empty(1024, device="npu")  # side is still busy: x's block must not come back
    reused_while_busy = y.data_ptr() == ptr
    busy = not side.query()
    side.synchronize()
    del y
    z = torch.empty(1024, device="npu")  # side is done: the block is free again
    reused_after = z.data_ptr() == ptr
    # control: without record_stream the block is reused at once
    w_ptr = z.data_ptr()
    del z
    w = torch.empty(1024, device="npu")
    return {"reused_while_busy": reused_while_busy, "busy": busy, "reused_after": reused_after,
            "reused_without_record": w.data_ptr() == w_ptr}

@scenario
def cross_device_copy_source_freed_early():
    # b = a.to("npu:1") is queued on npu:1's (busy) stream and reads a's memory on
    # npu:0; a is then freed and its block reused and overwritten on npu:0.
    if torch.npu.device_count() < 2:
        return {"skipped": True}
    n = 1 << 20
    a = torch.full((n,), 1.0, device="npu:0")
    torch.npu.synchronize(0)
    with torch.npu.device(1):
        torch.npu._sleep(200)
    b = a.to("npu:1")
    ptr = a.data_ptr()
    del a
    c = torch.empty(n, device="npu:0")
    reused = c.data_ptr() == ptr
    c.fill_(9.0)
    torch.npu.synchronize(0)
    values = sorted(set(b.cpu().unique().tolist()))
    return {"reused_immediately": reused, "values": values}

print(json.dumps(results))
"""
