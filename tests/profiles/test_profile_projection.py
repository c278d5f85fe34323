"""The profiler under a device profile with a cost model: each kernel's, copy's and
fallback's projected time on the chip (csrc/profiler keeps them per session), the
"NPU projected" column of tables, the projected track of Chrome traces and the
chip's line of analyse(), none of which counts as the emulator's device time; and
under the generic profile none of it.

A profile is chosen before the npu starts: the chip's checks run in one child
process with NPU_EMU_PROFILE=ascend910b2, which prints what the tests read."""
import json

import pytest
import torch

import torch_npu
from torch_npu.profiler import ProfilerActivity, analyse, profile

from helpers import last_line, run_python

CHIP = "ascend910b2"

CHIP_RUN = r"""
import json, os, re, sys, tempfile
import torch, torch_npu
from torch_npu.profiler import ProfilerActivity, analyse, profile
from torch_npu.profiler._analyse import projections
torch_npu.profiler.enable_npu_column_aliases()   # sort_by="npu_time_total" below: the opt-in names

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.NPU]
NPU, CPU = torch.autograd.DeviceType.PrivateUse1, torch.autograd.DeviceType.CPU
chip = torch_npu._emu.profiles.active()
out = {"profile": chip.name, "device_name": chip.device_name, "cost": chip.cost}

x = torch.randn(1024, 1024, dtype=torch.float16).npu()
a = torch.randn(65536).npu()
torch.npu.synchronize()
with profile(activities=ACTIVITIES) as prof:
    y = x @ x
    z = a + a
    torch.npu.synchronize()

found = projections(prof)
out["projections"] = [p._asdict() for p in found]
events = prof.events()
def own(name, device_type):
    return [e.npu_projected_time_total for e in events if e.name == name and e.device_type == device_type]
out["mm_op_us"], out["mm_kernel_us"] = own("aten::mm", CPU), own("aten::mm", NPU)
out["matmul_op_us"], out["add_op_us"] = own("aten::matmul", CPU), own("aten::add", CPU)

# Device time stays the emulator's: one device event per kernel, the kernels' own durations.
results = prof.profiler.kineto_results
device = [e for e in results.events() if e.device_type() == NPU]
out["kineto_device_events"] = len(device)
out["kineto_device_us"] = sum(e.duration_ns() for e in device) / 1e3
out["device_function_events"] = sum(e.device_type == NPU for e in events)
averages = prof.key_averages()
out["self_device_us"] = sum(e.self_device_time_total for e in averages if e.device_type == NPU)  # the table's total
out["device_total_of_ops"] = {e.key: e.device_time_total for e in averages if e.device_type == CPU}
out["projected_of_ops"] = {e.key: e.npu_projected_time_total for e in averages if e.device_type == CPU}
out["table"] = averages.table(sort_by="npu_projected_time_total", row_limit=12)
out["table_ms"] = averages.table(sort_by="npu_time_total", row_limit=12, time_unit="ms", header="HEADER")

path = os.path.join(tempfile.mkdtemp(), "trace.json")
prof.export_chrome_trace(path)
with open(path) as f:
    trace = json.load(f)["traceEvents"]
out["trace_projected"] = [e for e in trace if e.get("cat") == "npu_projected"]
out["trace_device"] = [e for e in trace if e.get("cat") in ("kernel", "gpu_memcpy")]
out["trace_threads"] = {str(e["tid"]): e["args"]["name"] for e in trace
                        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") == 0}

# A loop of tiny adds: launch overhead dominates on the chip.
b = torch.ones(8).npu()
b = b + 1
torch.npu.synchronize()
with profile(activities=ACTIVITIES) as loop:
    for _ in range(200):
        b = b + 1
    torch.npu.synchronize()
analysis = analyse(loop)
out["loop"] = {k: getattr(analysis, k) for k in ("profile", "projected_kernels", "projected_copies",
                                                 "projected_device_us", "projected_step_us",
                                                 "projected_host_us", "projected_bound", "wall_us")}
p = analysis.projection
out["loop"].update(dispatch_us=p.dispatch_us, launches=p.launches, overhead_us=p.overhead_us, waits=p.waits,
                   python_us=p.python_us, terms=p.terms)
out["loop_text"] = str(analysis)
# A CPU fallback: its copies both ways over the link and its host work, its copies not again.
torch_npu.NPUFallbackMode.set_op_fallback("aten::neg", "cpu")
n = torch.randn(4096).npu()
torch.npu.synchronize()
with profile(activities=ACTIVITIES) as fallback:
    torch.neg(n)
    torch.npu.synchronize()
torch_npu.NPUFallbackMode.set_op_fallback("aten::neg", "default")
out["fallback_projections"] = [p._asdict() for p in projections(fallback)]
out["fallback_device_events"] = [[e.name(), e.duration_ns()] for e in fallback.profiler.kineto_results.events()
                                  if e.device_type() == NPU]

# A replayed graph: one launch from the host, its kernels at the graph's overhead.
g_in = torch.randn(256, device="npu")
graph = torch.npu.NPUGraph()
with torch.npu.graph(graph):
    g_out = torch.tanh(g_in * 2 + 1)
graph.replay()
torch.npu.synchronize()
with profile(activities=ACTIVITIES) as replayed:
    for _ in range(5):
        graph.replay()
    torch.npu.synchronize()
p = analyse(replayed).projection
out["graph"] = {"launches": p.launches, "kernels": p.kernels, "graph_kernels": p.graph_kernels,
                "overhead_us": p.overhead_us, "dispatch_us": p.dispatch_us,
                "names": sorted({q.name for q in projections(replayed)}),
                "in_graph": sorted({q.in_graph for q in projections(replayed)})}
# torch.compile's generated kernels: one launch each, their work from their tensors.
fused = torch.compile(lambda t: torch.sigmoid(t * 3) + t)
c_in = torch.randn(4096, device="npu")
fused(c_in)
torch.npu.synchronize()
with profile(activities=ACTIVITIES) as compiled:
    fused(c_in)
    torch.npu.synchronize()
p = analyse(compiled).projection
out["compiled"] = {"kernels": p.kernels, "launches": p.launches,
                   "projections": [q._asdict() for q in projections(compiled)]}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def chip():
    proc = run_python(CHIP_RUN, env={"NPU_EMU_PROFILE": CHIP}, timeout=300)
    return json.loads(last_line(proc))


def table_body(table):
    """The separator, header and row lines of a profiler table (between its first and last separator)."""
    lines = table.splitlines()
    seps = [i for i, line in enumerate(lines) if line.strip() and set(line) <= {"-", " "}]
    return lines[seps[0]:seps[-1] + 1]


def kernel(chip, name):
    found = [p for p in chip["projections"] if p["name"] == name]
    assert len(found) == 1, chip["projections"]
    return found[0]


def test_a_float16_matmul_is_projected_at_the_cube_units_peak(chip):
    cost = chip["cost"]
    flops = 2 * 1024 ** 3
    compute_ns = flops / (cost["cube_fp16_tflops"] * 1e3)
    memory_ns = 2 * 1024 * 1024 * 2 / cost["memory_gbps"]   # the two operands
    assert compute_ns > memory_ns                              # compute-bound on the cube
    mm = kernel(chip, "aten::mm")
    assert mm["kind"] == "kernel"
    assert abs(mm["projected_ns"] - (compute_ns + cost["kernel_overhead_us"] * 1e3)) <= 1
    assert (mm["matrix"], mm["bits"], mm["known"], mm["flops"]) == (True, 16, True, flops)
    # The kernel's event, the op that launched it and its parent carry it (in microseconds).
    assert chip["mm_kernel_us"] == chip["mm_op_us"] == chip["matmul_op_us"] == [mm["projected_ns"] / 1e3]


def test_an_elementwise_float32_add_is_projected_as_memory_bound(chip):
    cost = chip["cost"]
    n = 65536
    moved = 3 * n * 4                                         # two operands and the result, float32
    assert n / (cost["vector_fp16_tflops"] / 2 * 1e3) < moved / cost["memory_gbps"]
    add = kernel(chip, "aten::add")
    assert abs(add["projected_ns"] - (cost["kernel_overhead_us"] * 1e3 + moved / cost["memory_gbps"])) <= 1
    assert chip["add_op_us"] == [add["projected_ns"] / 1e3]


def test_the_table_has_the_projected_column_under_the_chip(chip):
    table = chip["table"]
    body = table_body(table)
    assert "NPU projected" in body[1] and "NPU total" in body[1]
    assert len({len(line) for line in body}) == 1, table     # every row lines up with the header
    # Sorted by the projection: the matmul first, its projected time in the column.
    mm_us = kernel(chip, "aten::mm")["projected_ns"] / 1e3
    first_row = body[3]
    assert first_row.split()[0] in ("aten::matmul", "aten::mm") and f"{mm_us:.3f}us" in first_row, table
    assert "NPU projected time total:" in table and "on Ascend910B2, estimate" in table
    assert chip["projected_of_ops"]["aten::matmul"] == pytest.approx(mm_us)
    # time_unit and header= as PyTorch's own columns.
    assert f"{mm_us / 1e3:.3f}ms" in chip["table_ms"] and "HEADER" in chip["table_ms"]
    lines = chip["table_ms"].splitlines()
    assert len(lines[0]) == len(table_body(chip["table_ms"])[0].rstrip())   # the "=" rule spans the new column


def test_the_trace_has_the_projected_track_and_device_time_is_not_counted_twice(chip):
    found = chip["projections"]
    projected, device = chip["trace_projected"], chip["trace_device"]
    assert len(projected) == len(device) == len(found) == 2    # the matmul and the add
    assert chip["trace_threads"]["1000000"] == "Stream 0: projected on Ascend910B2 (estimate)"
    by_name = {e["name"]: e for e in projected}
    for p in found:
        e = by_name[p["name"]]
        assert (e["pid"], e["tid"], e["args"]["correlation"]) == (0, 1000000, p["correlation"])
        assert e["dur"] == pytest.approx(p["projected_ns"] / 1e3, abs=1e-3)
    # The emulator's kernels carry their projection as an argument.
    assert sorted(e["args"]["projected_us"] for e in device) == sorted(p["projected_ns"] / 1e3 for p in found)
    # Laid out in stream order: the add starts after the matmul ends on the chip, and none before its launch.
    mm, add = by_name["aten::mm"], by_name["aten::add"]
    assert add["ts"] >= mm["ts"] + mm["dur"] - 1e-3
    measured = {e["name"]: e for e in device}
    assert mm["ts"] <= measured["aten::mm"]["ts"] + 1e-3

    # Device time is the emulator's alone: one device event per kernel, and the
    # averages' device totals are the kernels' own durations.
    assert chip["kineto_device_events"] == chip["device_function_events"] == 2
    assert chip["self_device_us"] == pytest.approx(chip["kineto_device_us"], abs=0.01)
    assert chip["device_total_of_ops"]["aten::matmul"] == pytest.approx(
        sum(e["dur"] for e in device if e["name"] == "aten::mm"), abs=0.01)


def test_analyse_projects_a_loop_of_tiny_adds_as_host_bound(chip):
    loop, cost = chip["loop"], chip["cost"]
    assert loop["profile"] == "Ascend910B2" and loop["projected_kernels"] == 200 and loop["projected_copies"] == 0
    # The host: the adapter's dispatch per launch (the profile's figure), plus the Python measured here.
    assert loop["launches"] == 200 and loop["dispatch_us"] == pytest.approx(200 * cost["host_dispatch_us"])
    assert loop["projected_host_us"] == pytest.approx(loop["dispatch_us"] + loop["python_us"])
    # The device: each tiny add at its overhead, in stream order; one wait at the end.
    assert loop["overhead_us"] == pytest.approx(200 * cost["kernel_overhead_us"])
    assert loop["overhead_us"] <= loop["projected_device_us"] < loop["overhead_us"] + 10
    assert loop["waits"] == 1
    assert loop["projected_step_us"] >= loop["projected_host_us"]
    assert loop["projected_bound"] == "host"   # 200 dispatches against 200 tiny kernels: by the figures alone
    # Each figure is named with its basis and source.
    assert loop["terms"]["host_dispatch_us"].startswith(f"{cost['host_dispatch_us']:g} (transferred: ")
    text = chip["loop_text"]
    assert "on Ascend910B2 (projected, an estimate):" in text and "host-bound" in text, text
    assert "dispatch of 200 launches" in text and "host_dispatch_us" in text and "kernel_overhead_us" in text


def test_a_cpu_fallback_is_projected_with_its_copies_and_its_host_work(chip):
    cost = chip["cost"]
    fallback, = chip["fallback_projections"]                  # its copies are part of it
    assert (fallback["kind"], fallback["name"]) == ("fallback", "cpu_fallback: aten::neg")
    measured = dict(chip["fallback_device_events"])
    assert sorted(measured) == ["Memcpy DtoH", "Memcpy HtoD", "cpu_fallback: aten::neg"]
    host_ns = measured["cpu_fallback: aten::neg"] - measured["Memcpy DtoH"] - measured["Memcpy HtoD"]
    link_ns = 2 * 4096 * 4 / cost["link_gbps"]                 # the input to the host, the result back
    assert abs(fallback["projected_ns"] - (cost["kernel_overhead_us"] * 1e3 + link_ns + host_ns)) <= 1
    assert fallback["host_ns"] == host_ns


def test_a_graph_replay_is_one_launch_and_its_kernels_run_at_the_graphs_overhead(chip):
    graph, cost = chip["graph"], chip["cost"]
    assert graph["names"] == ["aten::add", "aten::mul", "aten::tanh"] and graph["in_graph"] == [True]
    assert graph["kernels"] == graph["graph_kernels"] == 15              # 5 replays of 3 kernels
    assert graph["launches"] == 5 and graph["dispatch_us"] == pytest.approx(5 * cost["host_dispatch_us"])
    assert graph["overhead_us"] == pytest.approx(15 * cost["graph_kernel_overhead_us"])


def test_compiled_kernels_are_projected_as_launches_with_their_work(chip):
    compiled = chip["compiled"]
    kernels = [p for p in compiled["projections"] if p["kind"] == "kernel"]
    assert kernels and compiled["kernels"] == len(kernels) == compiled["launches"]
    for p in kernels:
        assert p["name"].startswith("cpp_fused") and p["known"] and p["bytes"] >= 2 * 4096 * 4, p
        assert not p["matrix"] and p["bits"] == 32


def test_the_column_lines_up_with_rows_that_have_stacks():
    # Rows with a stack take a line per frame and a blank one (PyTorch's table of events that
    # carry stacks): the column is added to each, and to tables without device columns.
    from torch.autograd import profiler_util
    from torch_npu import _patches
    import torch_npu.profiler as npu_profiler

    events = profiler_util.EventList([
        profiler_util.FunctionEvent(id=i, name=f"op{i}", thread=0, start_us=10 * i, end_us=10 * i + 5,
                                    stack=[f"model.py({i}): forward", "train.py(3): step"][:i + 1], use_device="npu")
        for i in range(2)], use_device="npu")
    events[0]._npu_projected_us, events[1]._npu_projected_us = 3.0, 40.0
    table = _patches.original(profiler_util, "_build_table")(events, sort_by="npu_projected_time_total")
    assert "Source Location" in table
    with_column = npu_profiler._with_projected_column(table, events, "Chip", "npu_projected_time_total", 100, False,
                                                      None)
    body = table_body(with_column)
    assert "NPU projected" in body[1] and len({len(line) for line in body}) == 1, with_column
    assert "40.000us" in body[3] and "op1" in body[3] and "3.000us" in body[6] and "op0" in body[6], with_column
    assert len(body) == len(table_body(table))


@pytest.mark.skipif(torch_npu._emu.profiles.active().cost is not None, reason="the test session runs under a chip profile")
def test_none_of_it_under_the_generic_profile(tmp_path):
    assert torch_npu._emu.profiles.active().name == "generic"
    a = torch.randn(256).npu()
    torch.npu.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as prof:
        for _ in range(3):
            a = a + 1
        a.cpu()
    assert torch_npu._C._profiler_projections() == []
    assert all(e.npu_projected_time_total == 0 for e in prof.events())
    table = prof.key_averages().table(sort_by="npu_projected_time_total")
    assert "NPU total" in table and "projected" not in table
    analysis = analyse(prof)
    assert analysis.kernels == 4 and analysis.profile == "" and analysis.projected_bound == ""
    assert "projected" not in str(analysis)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    text = path.read_text()
    assert "projected" not in text and '"Stream 0"' in text
