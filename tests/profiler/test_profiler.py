"""The npu in PyTorch's profiler: device time per op from kernels timed where
they ran, memory per op from the caching allocator, Chrome traces with npu
stream tracks and flow arrows, and torch_npu.profiler.analyse."""
import json
import time
import warnings

import pytest
import torch

import torch_npu
from torch_npu.profiler import ProfilerActivity, profile, schedule

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.NPU]
# The tests read the Ascend adapter's npu_* column names too, which are opt-in.
torch_npu.profiler.enable_npu_column_aliases()


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).npu()


def train_step(model, x):
    model(x).square().mean().backward()


@pytest.fixture(scope="module")
def profiled():
    """One profiled run of a small model, shared by the tests that only read it."""
    model, x = mlp(), torch.randn(16, 32).npu()
    train_step(model, x)  # first calls initialise lazily: keep them out
    torch.npu.synchronize()
    start = time.perf_counter_ns()
    with profile(activities=ACTIVITIES, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        for _ in range(2):
            train_step(model, x)
            prof.step()
        torch.npu.synchronize()
    wall_us = (time.perf_counter_ns() - start) / 1e3
    return prof, wall_us


@pytest.fixture(scope="module")
def chrome_trace(profiled, tmp_path_factory):
    """The shared run's Chrome trace (a profile exports its trace once)."""
    path = tmp_path_factory.mktemp("trace") / "rank-0.json"
    profiled[0].export_chrome_trace(str(path))
    return path


def averages_by_name(prof):
    return {e.key: e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU}


def test_each_native_op_that_launched_a_kernel_has_npu_time(profiled):
    prof, _ = profiled
    ops = averages_by_name(prof)
    for name in ("aten::addmm", "aten::gelu", "aten::mm", "aten::gelu_backward"):
        assert ops[name].device_time_total > 0, name
        assert ops[name].npu_time_total == ops[name].device_time_total
        assert ops[name].self_npu_time_total > 0, name
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert {"aten::addmm", "aten::gelu"} <= {k.key for k in kernels}


def test_kernel_times_fit_inside_the_wall_time(profiled):
    prof, wall_us = profiled
    kernel_us = sum(e.device_time_total for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU
                    and e.cpu_parent is None)
    assert 0 < kernel_us <= wall_us


def test_table_has_npu_columns_and_accepts_the_seed_sort_keys(profiled):
    prof, _ = profiled
    averages = prof.key_averages()
    for key in ("cpu_time_total", "npu_time_total", "self_npu_memory_usage", "self_cuda_memory_usage",
                "self_npu_time_total", "device_time_total"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the cuda_* names
            table = averages.table(sort_by=key, row_limit=5)
        assert "Self NPU" in table and "NPU total" in table and "NPU Mem" in table
    event = next(e for e in prof.events() if e.name == "aten::addmm")
    assert event.npu_time_total == event.device_time_total
    assert event.npu_memory_usage == event.device_memory_usage
    assert event.self_npu_memory_usage == event.self_device_memory_usage


def test_memory_per_op_matches_the_allocator(clean_npu, tmp_path):
    torch.npu.synchronize()
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        kept = torch.empty(256, 1024, device="npu")  # 1 MiB
        kept.fill_(1.0)
        torch.npu.synchronize()
    assert averages_by_name(prof)["aten::empty"].self_npu_memory_usage == 1 << 20
    stats = torch.npu.memory_stats()
    # The last record's totals are the allocator's own numbers.
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    records = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
               if e.get("name") == "[memory]" and e["args"].get("Device Type") == 20]  # 20: PrivateUse1
    assert records[-1]["args"]["Total Allocated"] == stats["allocated_bytes.all.current"]
    assert records[-1]["args"]["Total Reserved"] == stats["reserved_bytes.all.current"]
    assert records[-1]["args"]["Bytes"] == 1 << 20
    del kept


@pytest.mark.child_process
def test_work_on_stream_workers_is_timed_there_and_reports_memory(run_python):
    """With every kernel queued to its stream's worker thread, kernels still link
    to the op that launched them and start after the work before them, what they
    allocate is reported, and the host's wait for them is a sync activity."""
    run_python("""
        import torch, torch_npu
        from torch_npu.profiler import profile, ProfilerActivity
        torch_npu.profiler.enable_npu_column_aliases()   # the npu_* column names
        NPU = torch.autograd.DeviceType.PrivateUse1
        x = torch.randn(64, 64).npu()
        torch.npu.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU], profile_memory=True) as prof:
            torch.npu._sleep(20)
            y = torch.mm(x, x)
            torch.npu._sleep(5)
            s = torch.mm(torch.mm(x, x), x)  # the inner result's last owner is the queued outer mm
            torch.npu.synchronize()
        events = prof.profiler.kineto_results.events()
        kernels = {}
        for e in events:
            if e.device_type() == NPU and e.name() != "[memory]":
                kernels.setdefault(e.name(), e)  # the first of each name
        sleep = kernels["npu._sleep"]
        assert sleep.duration_ns() >= 20e6
        assert kernels["aten::mm"].start_ns() >= sleep.start_ns() + sleep.duration_ns()
        mm = {e.key: e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU}["aten::mm"]
        # three results; the inner one is freed on the worker, outside any op (the timeline has it)
        assert mm.device_time_total > 0 and mm.self_npu_memory_usage == 3 * 64 * 64 * 4, mm.self_npu_memory_usage
        waits = [e for e in events if e.name() == "npuStreamSynchronize"]  # the sync waited for the sleeps
        assert waits and max(w.duration_ns() for w in waits) > 1e6, "the host waited for the sleep"
        torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())
        import json, tempfile
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            memory = [e["args"] for e in json.load(open(f.name))["traceEvents"]
                      if e.get("name") == "[memory]" and e["args"].get("Device Type") == 20]
        assert memory[-1]["Bytes"] == -64 * 64 * 4, "the free on the worker is reported"
        assert memory[-1]["Total Allocated"] == torch.npu.memory_allocated()
    """, env={"NPU_EMU_ALWAYS_ENQUEUE": "1"})


def test_copies_are_memcpy_activities_and_fallbacks_are_marked():
    x = torch.randn(1000).npu()
    torch_npu.NPUOpsFallback.set_op_fallback("aten::erfinv", "cpu")
    try:
        with profile(activities=ACTIVITIES) as prof:
            host = x.cpu()
            torch.erfinv(x.clamp(-0.5, 0.5))
            torch.randn(10).npu()
            torch.npu.synchronize()
    finally:
        torch_npu.NPUOpsFallback.clear_op_fallbacks()
    device = [e for e in prof.profiler.kineto_results.events()
              if e.device_type() == torch.autograd.DeviceType.PrivateUse1 and e.name() != "[memory]"]
    names = [e.name() for e in device]
    assert "Memcpy DtoH" in names and "Memcpy HtoD" in names
    assert "cpu_fallback: aten::erfinv" in names
    ops = averages_by_name(prof)
    assert "npu::cpu_fallback" in ops  # the round trip's host time, inside aten::erfinv
    assert ops["aten::erfinv"].device_time_total > 0
    assert host.numel() == 1000


def test_chrome_trace_has_stream_tracks_nesting_and_flows(chrome_trace):
    events = json.loads(chrome_trace.read_text())["traceEvents"]
    names = {(e["name"], e["args"].get("name")) for e in events if e.get("ph") == "M"}
    assert ("process_name", "NPU 0") in names and ("thread_name", "Stream 0") in names
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op" and "External id" in e["args"]}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert kernels and all(isinstance(e["ts"], (int, float)) for e in kernels)
    for kernel in kernels:
        assert (kernel["pid"], kernel["tid"]) == (0, 0)  # NPU 0, Stream 0
        op = ops[kernel["args"]["External id"]]
        assert kernel["name"] == op["name"]
        # Inline kernels run inside the op that launched them.
        assert op["ts"] <= kernel["ts"] and kernel["ts"] + kernel["dur"] <= op["ts"] + op["dur"] + 1
    starts = {e["id"]: e for e in events if e.get("cat") == "ac2g" and e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e.get("cat") == "ac2g" and e["ph"] == "f"}
    assert ends and set(ends) <= set(starts)
    for flow_id, end in ends.items():
        assert starts[flow_id]["tid"] != 0 and end["pid"] == 0


def test_holistic_trace_analysis_reads_the_trace(chrome_trace):
    hta = pytest.importorskip("hta.trace_analysis")
    analyzer = hta.TraceAnalysis(trace_dir=str(chrome_trace.parent))
    assert not analyzer.get_temporal_breakdown(visualize=False).empty


def test_schedule_produces_one_trace_per_active_cycle(tmp_path):
    model, x = mlp(), torch.randn(4, 32).npu()
    ready = []
    handler = torch_npu.profiler.tensorboard_trace_handler(str(tmp_path), worker_name="npu")

    def on_ready(prof):
        ready.append(prof.step_num)
        handler(prof)

    with profile(activities=ACTIVITIES, schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                 on_trace_ready=on_ready) as prof:
        for _ in range(8):
            train_step(model, x)
            prof.step()
    assert ready == [4, 8]
    traces = sorted(tmp_path.glob("npu.*.pt.trace.json"))
    assert len(traces) == 2
    for trace in traces:
        events = json.loads(trace.read_text())["traceEvents"]
        assert any(e.get("cat") == "kernel" for e in events)
        steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
        assert len(steps) == 2


def test_torch_profiler_and_the_autograd_profiler_are_the_same_profiler():
    model, x = mlp(), torch.randn(8, 32).npu()
    train_step(model, x)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        train_step(model, x)
    assert averages_by_name(prof)["aten::addmm"].device_time_total > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it used to warn on every op
        with torch.autograd.profiler.profile(use_device="npu") as legacy:
            train_step(model, x)
    addmm = {e.key: e for e in legacy.key_averages() if e.device_type == torch.autograd.DeviceType.CPU}["aten::addmm"]
    assert addmm.device_time_total > 0 and 0 < addmm.cpu_time_total < 1e6
    # use_kineto=False: each op timed with npu events on its stream.
    with torch.autograd.profiler.profile(use_device="npu", use_kineto=False) as events_only:
        train_step(model, x)
    addmm = {e.key: e for e in events_only.key_averages()
             if e.device_type == torch.autograd.DeviceType.CPU}["aten::addmm"]
    assert 0 < addmm.cpu_time_total < 1e6 and 0 <= addmm.device_time_total < 1e6


def test_analyse_answers_the_three_questions(clean_npu):
    x = torch.randn(8).npu()
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            for _ in range(30):
                x = x * 1.0001  # a Python loop of tiny kernels
            prof.step()
    tiny = torch_npu.profiler.analyse(prof)
    assert tiny.kernels >= 90 and tiny.launch_bound and tiny.bound == "host"
    assert 0 < tiny.device_busy_us < tiny.wall_us
    assert tiny.device_idle_us == pytest.approx(tiny.wall_us - tiny.device_busy_us)
    assert not tiny.memory_grows
    assert "launch-bound" in str(tiny)

    kept = []
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(5):
            kept.append(torch.randn(64, 1024).npu())  # a leak: tensors kept across steps
            prof.step()
    leak = torch_npu.profiler.analyse(prof)
    assert leak.memory_grows and leak.memory_growth_per_step == 64 * 1024 * 4
    assert "grows every step" in str(leak)

    big = torch.randn(512, 512).npu()
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            big = big @ big / 512
        torch.npu.synchronize()
    heavy = torch_npu.profiler.analyse(prof)
    assert heavy.bound == "device" and not heavy.launch_bound


def test_cpu_only_profiling_records_no_npu_activity():
    model, x = mlp(), torch.randn(16, 32).npu()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_step(model, x)
        torch.npu.synchronize()
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert device == []
    assert averages_by_name(prof)["aten::addmm"].device_time_total == 0
