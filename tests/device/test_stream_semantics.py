"""The promises of a stream-ordered device, as torch.cuda keeps them.

Each test here was written against a defect seen on an earlier main: host work
that overlapped kernels of its own stream, waits that blocked the host, errors
raised at the wrong place or with the wrong type, blocks reused while queued
kernels still read them, random draws taken at run time, a fork that hung, and
inputs that were narrowed or misparsed in silence. They run under the default
launch policy here, and `make test` runs this module again with
NPU_EMU_ALWAYS_ENQUEUE=1 (every kernel queued to the stream's worker thread).
Scenarios that need a truly asynchronous device run in a child process.
"""
import copy
import json
import os
import pickle
import threading
import time

import pytest
import torch

import torch_npu
from helpers import last_line

ALWAYS_ENQUEUE = {"NPU_EMU_ALWAYS_ENQUEUE": "1", "NPU_LAUNCH_BLOCKING": None}


def child_json(run_python, code, env=None):
    """Runs ``code`` in a fresh interpreter; it prints one JSON line, returned parsed."""
    return json.loads(last_line(run_python(code, env=env)))


# ---- ordering: kernels of one stream never overlap -------------------------------

@pytest.mark.parametrize("n_streams", [1, 3])
def test_threads_launching_while_others_hold_and_synchronize_match_the_cpu(n_streams):
    # Launching threads claim idle streams without a lock: every kernel still runs
    # alone and in stream order (a counter bumped from every thread stays exact),
    # a hold sees no kernel run under it, and each thread's chain equals the cpu's.
    n_threads, n_iters = 4, 150
    torch.npu.synchronize()
    streams = [torch.npu.current_stream()] + [torch.npu.Stream() for _ in range(n_streams - 1)]
    counters = [torch.zeros(64, device="npu") for _ in streams]
    chains = [torch.linspace(-1, 1, 96, device="npu").reshape(8, 12) + t for t in range(n_threads)]
    starts = [c.cpu() for c in chains]
    failures, stop = [], threading.Event()

    def launcher(t):
        try:
            k = t % len(streams)
            with torch.npu.stream(streams[k]):
                x = chains[t]
                for i in range(n_iters):
                    counters[k].add_(1)
                    x = (x * 0.5 + 1).exp().log().sub(0.25)
                    if i % 16 == 0:
                        x = torch.cat([x[:, :6], x[:, 6:]], dim=1).softmax(-1) * 12 + x.sum(1, keepdim=True) * 0
                chains[t] = x
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    def holder():
        try:
            while not stop.is_set():
                for k, s in enumerate(streams):
                    with torch.npu.stream(s):
                        def look():
                            a = counters[k].cpu()
                            time.sleep(0.0005)
                            b = counters[k].cpu()
                            if not torch.equal(a, b) or not bool((a == a[0]).all()):
                                failures.append(AssertionError(f"a kernel ran under a hold: {a} then {b}"))
                        torch_npu._C._run_in_stream_order(s.device_index, "look", look)
        except Exception as e:  # noqa: BLE001
            failures.append(e)

    def synchronizer():
        while not stop.is_set():
            torch.npu.synchronize()
            for s in streams:
                s.query()
                s.synchronize()

    launchers = [threading.Thread(target=launcher, args=(t,)) for t in range(n_threads)]
    others = [threading.Thread(target=holder), threading.Thread(target=synchronizer)]
    for th in launchers + others:
        th.start()
    for th in launchers:
        th.join()
    stop.set()
    for th in others:
        th.join()
    torch.npu.synchronize()
    assert not failures, failures
    for k in range(len(streams)):
        bumps = n_iters * sum(1 for t in range(n_threads) if t % len(streams) == k)
        assert torch.equal(counters[k].cpu(), torch.full((64,), float(bumps)))
    for t in range(n_threads):
        x = starts[t]
        for i in range(n_iters):
            x = (x * 0.5 + 1).exp().log().sub(0.25)
            if i % 16 == 0:
                x = torch.cat([x[:, :6], x[:, 6:]], dim=1).softmax(-1) * 12 + x.sum(1, keepdim=True) * 0
        torch.testing.assert_close(chains[t].cpu(), x)


def test_host_executed_op_never_overlaps_a_kernel_of_another_thread():
    # One thread fills x again and again on the default stream; the other reads it
    # through an op that runs on the host (cat) and a synchronous copy (.cpu()).
    # Each read must see one fill, never a mix of two.
    x = torch.zeros(1 << 16, device="npu")
    stop = threading.Event()

    def filler():
        i = 0
        while not stop.is_set():
            x.fill_(float(i % 7))
            i += 1

    thread = threading.Thread(target=filler)
    thread.start()
    mixed = 0
    try:
        for _ in range(40):
            snapshot = torch.cat([x]).cpu()
            mixed += int(snapshot.min() != snapshot.max())
            copied = x.cpu()
            mixed += int(copied.min() != copied.max())
    finally:
        stop.set()
        thread.join()
    assert mixed == 0, f"{mixed} of 80 reads mixed two fills"


def test_wait_stream_on_a_busy_stream_returns_at_once_and_orders_later_work():
    side = torch.npu.Stream()
    x = torch.zeros(1000, device="npu")
    torch.npu.synchronize()
    started = threading.Event()

    def keep_side_busy():  # a launch that occupies `side` for 300 ms, from another thread
        with torch.npu.stream(side):
            started.set()
            torch.npu._sleep(300)
            x.fill_(1.0)

    thread = threading.Thread(target=keep_side_busy)
    thread.start()
    started.wait()
    time.sleep(0.02)
    t0 = time.perf_counter()
    torch.npu.current_stream().wait_stream(side)
    waited_ms = (time.perf_counter() - t0) * 1000
    y = x + 1  # queued behind the wait: must see the fill
    assert waited_ms < 100, f"wait_stream blocked the host for {waited_ms:.0f} ms"
    assert torch.equal(y.cpu(), torch.full((1000,), 2.0))
    thread.join()


def test_blocking_waits_release_the_gil():
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.005)

    side = torch.npu.Stream()
    done = threading.Event()

    def busy():
        with torch.npu.stream(side):
            torch.npu._sleep(200)
        done.set()

    launcher = threading.Thread(target=busy)
    launcher.start()
    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.01)
    t0 = time.perf_counter()
    side.synchronize()
    torch.npu.synchronize()
    t1 = time.perf_counter()
    stop.set()
    thread.join()
    launcher.join()
    during = [t for t in ticks if t0 <= t <= t1]
    if t1 - t0 > 0.05:
        assert len(during) >= 3, f"another Python thread ran {len(during)} times in {1000 * (t1 - t0):.0f} ms"


# ---- errors: metadata at the call, data-dependent ones kept with their type ------

@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_metadata_errors_of_in_place_ops_raise_at_the_call(bad):
    a = torch.ones(3, 4, device="npu")
    if bad == "shape":
        with pytest.raises(RuntimeError, match="broadcast|must match the size"):
            a.add_(torch.ones(5, 4, device="npu"))
    else:
        with pytest.raises(RuntimeError, match="can't be cast"):
            torch.ones(3, dtype=torch.long, device="npu").mul_(torch.rand(3, device="npu"))
    torch.npu.synchronize()  # nothing was left pending
    assert torch.equal(a.cpu(), torch.ones(3, 4))


DEFERRED = r"""
import json, torch
out = {}
s1 = torch.npu.Stream()
x = torch.zeros(4, device="npu")
with torch.npu.stream(s1):
    torch.npu._sleep(50)                   # the stream is busy: the next kernel is queued
    # metadata errors still raise here, at the call
    try:
        x.add_(torch.ones(5, device="npu"))
        out["shape_at_call"] = False
    except RuntimeError:
        out["shape_at_call"] = True
    x.fill_(1.0)
    bad = torch.tensor([0, 9], device="npu")
    x.index_add_(0, bad, torch.ones(2, device="npu"))   # index 9 of 4: data-dependent
    out["returned"] = True
    after = s1.record_event()
torch.npu.current_stream().wait_stream(s1)
try:
    x.cpu()
    out["cpu_raised"] = None
except Exception as e:
    out["cpu_raised"] = type(e).__name__
    out["message"] = str(e)
try:
    after.synchronize()
    s1.synchronize()
    torch.npu.synchronize()
    out["reported_once"] = True
except Exception as e:
    out["reported_once"] = repr(e)
# the event recorded after the failure carries it, one recorded before does not
with torch.npu.stream(s1):
    before = s1.record_event()
    x.index_add_(0, bad, torch.ones(2, device="npu"))
    after = s1.record_event()
before.synchronize()
try:
    after.synchronize()
    out["event_raised"] = None
except Exception as e:
    out["event_raised"] = type(e).__name__
torch.npu.synchronize()
y = torch.arange(4., device="npu") * 2                   # the device keeps working
out["works_after"] = y.cpu().tolist()
print(json.dumps(out))
"""


@pytest.mark.child_process
def test_deferred_error_keeps_its_type_and_reaches_the_stream_that_waited(run_python):
    out = child_json(run_python, DEFERRED, env=ALWAYS_ENQUEUE)
    assert out["shape_at_call"] and out["returned"]
    assert out["cpu_raised"] == "IndexError", out
    assert "aten::index_add_" in out["message"] and "NPU_LAUNCH_BLOCKING=1" in out["message"]
    assert "frame #" not in out["message"] and "\n#1 " not in out["message"], "the message carries a backtrace"
    assert len(out["message"]) < 600, out["message"]
    assert out["reported_once"] is True
    assert out["event_raised"] == "IndexError"
    assert out["works_after"] == [0.0, 2.0, 4.0, 6.0]


def test_data_dependent_error_raises_with_its_type_at_the_call_or_the_next_sync():
    # At the call when the kernel ran on this thread (an idle stream, the default
    # policy); at the next synchronisation point when it was queued.
    x = torch.zeros(4, device="npu")
    queued = "1" in (os.environ.get("NPU_EMU_ALWAYS_ENQUEUE"), os.environ.get("NPU_EMU_DEFER"))
    with pytest.raises(IndexError, match="index out of range"):
        x.index_add_(0, torch.tensor([0, 9], device="npu"), torch.ones(2, device="npu"))
        if queued:
            torch.npu.synchronize()
    torch.npu.synchronize()


BACKTRACE = r"""
import torch
x = torch.zeros(4, device="npu")
torch.npu._sleep(20)
x.index_add_(0, torch.tensor([7], device="npu"), torch.ones(1, device="npu"))
try:
    torch.npu.synchronize()
except IndexError as e:
    import re
    print(bool(re.search(r"^(frame )?#\d+ ", str(e), re.M)))
"""


@pytest.mark.child_process
@pytest.mark.parametrize("show", [None, "1"])
def test_deferred_error_shows_the_cpp_backtrace_only_when_asked(run_python, show):
    out = last_line(run_python(BACKTRACE, env={**ALWAYS_ENQUEUE, "TORCH_SHOW_CPP_STACKTRACES": show, "TORCH_DISABLE_ADDR2LINE": "1"}))
    assert out == ("True" if show else "False")


# ---- memory: a block is reused only when the work that used it is done -----------

EMPTY_CACHE_RACE = r"""
import threading, torch
stop = threading.Event()
def cache_emptier():
    while not stop.is_set():
        torch.npu.empty_cache()
t = threading.Thread(target=cache_emptier)
t.start()
bad = 0
for i in range(150):
    a = torch.full((1 << 18,), float(i), device="npu")
    b = a * 2 + 1
    del a                       # freed while the kernels that read it may be queued
    c = b.sum()
    del b
    bad += int(c.item() != (2 * i + 1) * (1 << 18))
stop.set(); t.join()
print(bad)
"""


@pytest.mark.child_process
def test_empty_cache_on_another_thread_never_frees_memory_queued_kernels_use(run_python):
    assert last_line(run_python(EMPTY_CACHE_RACE, env=ALWAYS_ENQUEUE)) == "0"


HOST_OP_REUSE = r"""
import threading, torch
n = 1 << 20
x = torch.arange(n, dtype=torch.float32, device="npu")
errors = []
def producer():
    for i in range(40):
        a = x + float(i)
        b = a * 2          # queued kernels read a
        del a              # a's block goes back to the stream's pool with b's kernel pending
        expected = (torch.arange(n, dtype=torch.float32) + i) * 2
        if not torch.equal(b.cpu(), expected):
            errors.append(("producer", i))
def host_ops():
    for i in range(40):
        m = torch.nonzero(x >= n - 8)             # runs on the host, allocates its output
        if m.numel() != 8 or int(m[0]) != n - 8:
            errors.append(("nonzero", i))
        c = torch.cat([x[:4], x[-4:]])
        if c.cpu().tolist() != [0.0, 1.0, 2.0, 3.0, n - 4.0, n - 3.0, n - 2.0, n - 1.0]:
            errors.append(("cat", i))
threads = [threading.Thread(target=producer), threading.Thread(target=host_ops)]
for t in threads: t.start()
for t in threads: t.join()
print(len(errors))
"""


@pytest.mark.child_process
@pytest.mark.parametrize("policy", ["default", "always_enqueue"])
def test_host_executed_op_never_gets_a_block_queued_kernels_still_read(run_python, policy):
    env = ALWAYS_ENQUEUE if policy == "always_enqueue" else {"NPU_EMU_ALWAYS_ENQUEUE": None}
    assert last_line(run_python(HOST_OP_REUSE, env=env)) == "0"


@pytest.mark.child_process
def test_oom_with_a_pending_kernel_error_raises_the_oom_and_keeps_the_error(run_python):
    code = r"""
import json, torch
out = {}
torch.npu._launch_failing_kernel("earlier failure")
try:
    torch.empty(1 << 30, device="npu")
    out["raised"] = None
except Exception as e:
    out["raised"] = type(e).__name__
stats = torch.npu.memory_stats()
out["num_ooms"] = stats["num_ooms"]
out["num_sync_all_streams"] = stats["num_sync_all_streams"]
try:
    torch.npu.synchronize()
    out["pending"] = None
except RuntimeError as e:
    out["pending"] = "earlier failure" in str(e)
print(json.dumps(out))
"""
    out = child_json(run_python, code, env={**ALWAYS_ENQUEUE, "NPU_EMU_MEMORY": "64MiB"})
    assert out["raised"] == "OutOfMemoryError", out
    assert out["num_ooms"] == 1 and out["num_sync_all_streams"] >= 1
    assert out["pending"] is True


def test_memory_stats_count_syncs_and_have_torch_cuda_oversize_keys(clean_npu):
    before = torch.npu.memory_stats()["num_sync_all_streams"]
    torch.npu.empty_cache()
    stats = torch.npu.memory_stats()
    assert stats["num_sync_all_streams"] == before + 1
    for key in ("oversize_allocations", "oversize_segments"):
        for field in ("current", "peak", "allocated", "freed"):
            assert stats[f"{key}.{field}"] == 0


# ---- random numbers: the draw is taken at launch ---------------------------------

RNG_REPLAY = r"""
import json, torch
from torch.utils.checkpoint import checkpoint
out = {}
torch.manual_seed(0)
a = torch.randn(1000, device="npu")
torch.npu._sleep(20)
torch.manual_seed(0)                       # must not race with the queued draw of a
b = torch.randn(1000, device="npu")
out["seed_repeats"] = torch.equal(a.cpu(), b.cpu())
state = torch.npu.get_rng_state()
c = torch.rand(100, device="npu").uniform_()
torch.npu.set_rng_state(state)
d = torch.rand(100, device="npu").uniform_()
out["state_replays"] = torch.equal(c.cpu(), d.cpu())
# checkpoint's preserve_rng_state replays dropout in the recomputation
layer = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5)).npu()
x = torch.randn(8, 16, device="npu", requires_grad=True)
torch.manual_seed(1)
layer(x).sum().backward()
plain = x.grad.cpu().clone()
x.grad = None
torch.manual_seed(1)
checkpoint(layer, x, use_reentrant=False).sum().backward()
out["checkpoint_matches"] = torch.equal(plain, x.grad.cpu())
print(json.dumps(out))
"""


@pytest.mark.child_process
@pytest.mark.parametrize("policy", ["default", "always_enqueue"])
def test_seed_and_saved_state_replay_whatever_the_launch_policy(run_python, policy):
    env = ALWAYS_ENQUEUE if policy == "always_enqueue" else {"NPU_EMU_ALWAYS_ENQUEUE": None}
    out = child_json(run_python, RNG_REPLAY, env=env)
    assert out == {"seed_repeats": True, "state_replays": True, "checkpoint_matches": True}


def test_float64_sampling_through_the_fallback_follows_the_npu_seed():
    torch.npu.manual_seed(3)
    a = torch.randn(64, dtype=torch.float64, device="npu")
    torch.randn(10)  # a cpu draw in between must not matter
    torch.npu.manual_seed(3)
    b = torch.randn(64, dtype=torch.float64, device="npu")
    assert torch.equal(a.cpu(), b.cpu())
    torch.npu.manual_seed(4)
    assert not torch.equal(torch.randn(64, dtype=torch.float64, device="npu").cpu(), a.cpu())


def test_npu_generator_deepcopies_and_pickles():
    g = torch.Generator(device="npu").manual_seed(7)
    torch.rand(5, device="npu", generator=g)
    twin = copy.deepcopy(g)
    thawed = pickle.loads(pickle.dumps(g))
    expected = torch.rand(5, device="npu", generator=g).cpu()
    assert torch.equal(torch.rand(5, device="npu", generator=twin).cpu(), expected)
    assert torch.equal(torch.rand(5, device="npu", generator=thawed).cpu(), expected)
    assert g.get_offset() == twin.get_offset() == thawed.get_offset()
    assert twin.device == torch.device("npu", 0)


# ---- processes -------------------------------------------------------------------

FORK = r"""
import json, os, torch
before = torch.npu.is_initialized()
START                                           # the parent starts the npu
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    out = {"bad_fork": torch.npu._is_in_bad_fork(), "initialized": torch.npu.is_initialized()}
    try:
        torch.ones(3, device="npu")
        out["error"] = None
    except RuntimeError as e:
        out["error"] = str(e)
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
_, status = os.waitpid(pid, 0)
child = json.loads(os.read(r, 1 << 16).decode())
child["parent_bad_fork"] = torch.npu._is_in_bad_fork()
child["parent_initialized"] = [before, torch.npu.is_initialized(), torch.npu._initialized]
child["parent_works"] = torch.ones(2, device="npu").sum().item()
print(json.dumps(child))
"""


# torch.npu.init() alone starts the runtime, as torch.cuda.init() does.
@pytest.mark.child_process
@pytest.mark.parametrize("start", ['torch.ones(3, device="npu").sum().item()', "torch.npu.init()"])
def test_a_forked_child_gets_cudas_error_naming_spawn(run_python, start):
    out = child_json(run_python, FORK.replace("START", start))
    assert out["bad_fork"] is True and out["initialized"] is False and out["parent_bad_fork"] is False
    assert out["parent_initialized"] == [False, True, True]
    assert out["error"].startswith("Cannot re-initialize NPU in forked subprocess. To use NPU with "
                                   "multiprocessing, you must use the 'spawn' start method"), out["error"]
    assert out["parent_works"] == 2.0


SPAWN = r"""
import multiprocessing as mp
import torch

def work(q):
    q.put((torch.arange(4., device="npu") * 3).sum().item())

if __name__ == "__main__":
    torch.ones(1, device="npu").item()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=work, args=(q,))
    p.start()
    print(q.get(timeout=60))
    p.join()
"""


@pytest.mark.child_process
def test_a_spawned_child_uses_the_npu(run_python, tmp_path):
    script = tmp_path / "spawn_child.py"
    script.write_text(SPAWN)
    proc = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert last_line(proc) == "18.0"


# ---- edges of the runtime --------------------------------------------------------

def test_record_stream_with_a_stream_that_does_not_exist_raises():
    x = torch.ones(4, device="npu")
    ghost = torch.Stream(stream_id=4242, device_index=0, device_type=torch.npu.current_stream().device_type)
    with pytest.raises(RuntimeError, match="no stream 4242"):
        x.record_stream(ghost)
    del x  # the deleter must not abort the interpreter


@pytest.mark.child_process
def test_pinned_copies_do_not_accumulate_events_and_freeing_does_not_wait(run_python):
    code = r"""
import json, time, torch
src = torch.ones(256).pin_memory()
dst = torch.empty(256, device="npu")
for _ in range(5000):
    dst.copy_(src, non_blocking=True)
queued = torch_npu._C._pinned_pending_uses()   # at most the stream's queue depth (1024)
torch.npu.synchronize()
dst.copy_(src, non_blocking=True)              # prunes what completed
torch.npu.synchronize()
tracked = torch_npu._C._pinned_pending_uses()
buf = torch.ones(1 << 16).pin_memory()
torch.npu._sleep(300)                      # the copy below stays queued for 300 ms
out = torch.empty(1 << 16, device="npu")
out.copy_(buf, non_blocking=True)
t0 = time.perf_counter()
del buf                                    # must not wait for the queued copy
free_ms = (time.perf_counter() - t0) * 1000
ok = bool((out.cpu() == 1).all())
print(json.dumps({"queued": queued, "tracked": tracked, "free_ms": free_ms, "ok": ok}))
"""
    out = child_json(run_python, "import torch_npu\n" + code, env=ALWAYS_ENQUEUE)
    assert out["queued"] <= 1100 and out["tracked"] <= 1, out
    assert out["free_ms"] < 100, out
    assert out["ok"]


@pytest.mark.parametrize("index", [256, 300, -2, 2**40])
def test_device_arguments_are_validated_before_narrowing(index):
    for call in (torch.npu.set_device, torch.npu.memory_allocated, torch.npu.synchronize,
                 torch.npu.get_device_properties):
        with pytest.raises((RuntimeError, ValueError), match=f"invalid device: npu:{index} "):
            call(index)
    assert torch.npu.current_device() == 0


def test_set_refuses_a_storage_of_another_device():
    if torch.npu.device_count() < 2:
        pytest.skip("needs two npu devices")
    a = torch.zeros(4, device="npu:0")
    b = torch.ones(4, device="npu:1")
    with pytest.raises(RuntimeError, match="devices must match"):
        a.set_(b.untyped_storage())
    assert a.device == torch.device("npu", 0)


def test_npu_stream_context_with_a_cpu_stream_says_so():
    cpu_stream = torch.Stream(device="cpu")
    with pytest.raises(ValueError, match="cpu stream"):
        with torch.npu.stream(cpu_stream):
            pass


@pytest.mark.parametrize("name", ["", "aten::", ".", "::", "torch.ops."])
def test_registry_answers_for_names_that_are_no_operator(name):
    assert torch_npu.ops.registry.get(name) is None
    assert torch_npu.ops.registry.contains(name) is False
    assert torch_npu.ops.registry.backends_for_op(name) == []


def test_unknown_op_policy_suggests_the_closest_names():
    with pytest.raises(ValueError, match="did you mean.*isin"):
        torch_npu.NPUFallbackMode.set_op_fallback("isn", "cpu")
    with pytest.raises(ValueError, match="not an operator"):
        torch_npu.NPUFallbackMode.set_op_fallback("not_an_op", "cpu")
    assert torch_npu.NPUFallbackMode.op_fallbacks() == {}


@pytest.mark.child_process
def test_fallback_mode_is_parsed_the_same_from_python_and_the_environment(run_python):
    torch_npu.set_fallback_mode("ERROR")
    assert torch_npu.get_fallback_mode() == "error"
    torch_npu.set_fallback_mode(" Auto ")
    assert torch_npu.get_fallback_mode() == "auto"
    out = run_python("import torch_npu; print(torch_npu.get_fallback_mode())", env={"NPU_FALLBACK_MODE": "ERROR"})
    assert last_line(out) == "error"


@pytest.mark.child_process
@pytest.mark.parametrize("variable, value, expect", [
    ("NPU_EMU_DEVICES", "4294967297", "NPU_EMU_DEVICES='4294967297' is out of range"),
    ("NPU_EMU_DEVICES", "99999999999999999999", "NPU_EMU_DEVICES='99999999999999999999' is out of range"),
    ("NPU_EMU_DEVICES", "two", "is not an integer"),
    ("NPU_EMU_ALWAYS_ENQUEUE", "maybe", "is not a switch"),
    ("NPU_EMU_PROTECT", "perhaps", "is not a switch"),
    ("NPU_HAL", "bogus", "NPU_HAL='bogus' is not a registered HAL; registered: emu"),
    ("NPU_FALLBACK_OPS", "exp,isn", "did you mean"),
    ("NPU_FALLBACK_ON_ERROR", "sure", "is not a switch"),
    ("TASK_QUEUE_ENABLE", "7", "use 0, 1 or 2"),
    ("ASCEND_LAUNCH_BLOCKING", "often", "is not a switch"),
])
def test_bad_environment_values_fail_the_import_naming_the_variable(run_python, variable, value, expect):
    proc = run_python("import torch_npu", env={variable: value}, check=False)
    assert proc.returncode != 0, f"import succeeded with {variable}={value}"
    assert variable in proc.stderr and expect in proc.stderr, proc.stderr[-2000:]


@pytest.mark.child_process
def test_the_ascend_adapters_switch_names_are_ours(run_python):
    show = ("import os, torch, torch_npu; print(torch.npu.device_count(), os.environ.get('NPU_LAUNCH_BLOCKING'), "
            "torch_npu.get_fallback_mode())")
    assert last_line(run_python(show, env={"ASCEND_LAUNCH_BLOCKING": "1"})).split()[1] == "1"
    assert last_line(run_python(show, env={"TORCH_NPU_FALLBACK_CPU_DISABLE": "1"})).split()[2] == "error"
    # ASCEND_RT_VISIBLE_DEVICES masks devices as CUDA_VISIBLE_DEVICES: up to the first id that is not a device
    for mask, count in (("1,3", "2"), ("2", "1"), ("0,7,1", "1"), ("9", "0"), ("3,3", "1")):
        out = run_python(show, env={"NPU_EMU_DEVICES": "4", "ASCEND_RT_VISIBLE_DEVICES": mask})
        assert last_line(out).split()[0] == count, (mask, out.stdout)
    child = run_python("""
        import subprocess, sys, torch, torch_npu
        print(torch.npu.device_count(), subprocess.run([sys.executable, "-c",
              "import torch, torch_npu; print(torch.npu.device_count())"], capture_output=True, text=True).stdout.strip())
    """, env={"NPU_EMU_DEVICES": "4", "ASCEND_RT_VISIBLE_DEVICES": "2,3"})
    assert last_line(child) == "2 2"               # a child process is not masked again
    # A device keeps its uuid whatever index the mask gives it.
    uuid_of = "import torch, torch_npu; print(*[torch.npu.get_device_properties(i).uuid for i in range({n})])"
    unmasked = last_line(run_python(uuid_of.format(n=4), env={"NPU_EMU_DEVICES": "4"})).split()
    masked = last_line(run_python(uuid_of.format(n=2), env={"NPU_EMU_DEVICES": "4",
                                                         "ASCEND_RT_VISIBLE_DEVICES": "3,1"})).split()
    assert masked == [unmasked[3], unmasked[1]] and len(set(unmasked)) == 4
    proc = run_python("import torch_npu", env={"ASCEND_LAUNCH_BLOCKING": "1", "NPU_LAUNCH_BLOCKING": "0"},
                      check=False)
    assert proc.returncode != 0 and "disagree" in proc.stderr


def test_error_mode_messages_name_the_dtype_that_fell_back():
    torch_npu.set_fallback_mode("error")
    with pytest.raises(NotImplementedError) as arange:
        torch.arange(3, dtype=torch.float64, device="npu")
    assert "(dtype Double)" in str(arange.value) and "dtype none" not in str(arange.value)
    d = torch.zeros(3, dtype=torch.float64, device="npu")
    with pytest.raises(NotImplementedError) as mul:
        d * 2
    message = str(mul.value)
    assert "(dtype Double)" in message and "Long" not in message.split("Inputs:")[0], message
    assert "supports Float, Half, BFloat16" in message


# ---- a bounded stress test ----------------------------------------------------------

STRESS = r"""
import threading, torch
errors = []
shared = torch.npu.Stream()
def worker(k):
    own = torch.npu.Stream()
    for i in range(150):
        stream = shared if i % 2 else own
        with torch.npu.stream(stream):
            a = torch.full((4096,), float(k * 100 + i), device="npu")
            b = (a * 2).add_(1)
            done = stream.record_event()
        torch.npu.current_stream().wait_event(done)
        b.record_stream(torch.npu.current_stream())
        c = torch.cat([b, b[:1]])
        del a, b
        total = c.sum().item()
        expect = (2.0 * (k * 100 + i) + 1) * 4097  # exact in float32
        if total != expect:
            errors.append((k, i, total, expect))
threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
torch.npu.synchronize()
print(len(errors), errors[:3])
"""


@pytest.mark.child_process
@pytest.mark.parametrize("policy", ["default", "always_enqueue"])
def test_stress_threads_streams_events_and_record_stream_give_exact_results(run_python, policy):
    env = ALWAYS_ENQUEUE if policy == "always_enqueue" else {"NPU_EMU_ALWAYS_ENQUEUE": None}
    assert last_line(run_python(STRESS, env=env)).startswith("0 ")


# Threads sharing one stream: each thread's ops see exactly its own earlier ops'
# effects (CUDA's promise), whatever the others launch meanwhile. Blocks freed by
# one thread are reused by another on the same stream; a block split off a
# larger one must keep the larger one's last use, or host-executed work (cat)
# gets memory that queued kernels still write.
SHARED_STREAM = r"""
import threading, torch
def chain(a, in_place):
    for _ in range(5):
        a = a * 2 + 1
        if in_place:
            a.add_(1).mul_(1)
    return torch.cat([a, a])
wrong = []
for kind in ("pool", "default"):
    for in_place in (True, False):
        stream = torch.npu.Stream() if kind == "pool" else torch.npu.default_stream()
        def worker(k):
            for i in range(300):
                value = float(k * 1000 + i % 7)
                with torch.npu.stream(stream):
                    got = chain(torch.full((256,), value, device="npu"), in_place).cpu()
                if not torch.equal(got, chain(torch.full((256,), value), in_place)):
                    wrong.append((kind, in_place, k, i, got[0].item()))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
        for t in threads: t.start()
        for t in threads: t.join()
print(len(wrong), wrong[:3])
"""


@pytest.mark.child_process
@pytest.mark.parametrize("policy", ["default", "always_enqueue"])
def test_threads_sharing_a_stream_each_see_exactly_their_own_results(run_python, policy):
    env = ALWAYS_ENQUEUE if policy == "always_enqueue" else {"NPU_EMU_ALWAYS_ENQUEUE": None}
    assert last_line(run_python(SHARED_STREAM, env=env)).startswith("0 ")
