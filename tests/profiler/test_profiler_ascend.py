"""The Ascend adapter's profiler surface: _ExperimentalConfig and its enums, the Text
export (<worker>_<ts>_ascend_pt/ASCEND_PROFILER_OUTPUT/) in the adapter's column layouts,
the Db export (its SQLite tables), and msprof-analyze (advisor, compare, cluster) reading them."""
import csv
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_npu
import torch_npu.profiler as npu_profiler
from torch_npu.profiler import ProfilerActivity, schedule
from torch_npu.profiler import _ascend_export as ascend

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.NPU]
CHIP = "ascend910b2"


def msprof_analyze():
    """The msprof-analyze command next to this Python, else on PATH; skips without it."""
    beside = Path(sys.executable).with_name("msprof-analyze")
    found = str(beside) if beside.exists() else shutil.which("msprof-analyze")
    if found is None:
        pytest.skip("msprof-analyze is not installed (pip install msprof-analyze; `make test` installs it)")
    return found


def run_msprof(args, cwd, expected_errors=()):
    result = subprocess.run([msprof_analyze(), *args], cwd=cwd, capture_output=True, text=True, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    errors = [line for line in output.splitlines() if ("[ERROR]" in line or "Traceback" in line)
              and not any(e in line for e in expected_errors)]
    assert not errors, "\n".join(errors)
    return output


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    return rows[0], [dict(zip(rows[0], row)) for row in rows[1:]]


def workload(prof, steps):
    """A dominant matmul, small elementwise ops, and erfinv through the CPU fallback."""
    big = torch.randn(384, 384, device="npu")
    small = torch.randn(32, 32, device="npu")
    for _ in range(steps):
        out = big @ big @ big
        for _ in range(4):
            small = small.relu() + 1
        torch.erfinv(small.clamp(-0.5, 0.5))
        out.sum().item()
        prof.step()


def profile_to(dir_name, worker, config=None, project=True):
    torch_npu.NPUOpsFallback.set_op_fallback("aten::erfinv", "cpu")
    if project:
        npu_profiler.set_projection_target(CHIP)
    try:
        with npu_profiler.profile(activities=ACTIVITIES, record_shapes=True, profile_memory=True,
                                  schedule=schedule(wait=1, warmup=1, active=2), experimental_config=config,
                                  on_trace_ready=npu_profiler.tensorboard_trace_handler(dir_name, worker)) as prof:
            workload(prof, 4)
    finally:
        if project:
            npu_profiler.set_projection_target(None)
        torch_npu.NPUOpsFallback.clear_op_fallbacks()
    return prof


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("ascend_prof")
    prof = profile_to(str(base), "npu", config=npu_profiler._ExperimentalConfig())
    root = Path(prof.npu_ascend_output)
    return base, root, root / ascend.OUTPUT


# ---- _ExperimentalConfig -----------------------------------------------------

def test_experimental_config_names_and_defaults():
    cfg = npu_profiler._ExperimentalConfig()
    assert cfg.profiler_level == npu_profiler.ProfilerLevel.Level0 == "Level0"
    assert cfg.aic_metrics == npu_profiler.AiCMetrics.AiCoreNone
    assert cfg.export_type == [npu_profiler.ExportType.Text] == ["text"]
    assert cfg.to_dict()["_data_simplification"] is True and cfg.record_op_args is False
    # Above Level0 the adapter's default metrics are the pipe utilization.
    assert npu_profiler._ExperimentalConfig(profiler_level=npu_profiler.ProfilerLevel.Level1).aic_metrics \
        == npu_profiler.AiCMetrics.PipeUtilization
    assert npu_profiler.ProfilerLevel.Level_none == "Level_none"
    assert npu_profiler.supported_profiler_level() == {"Level0", "Level1", "Level2"}
    assert npu_profiler.ExportType.Db in npu_profiler.supported_export_type()


@pytest.mark.parametrize("kwargs, match", [
    ({"profiler_level": "Level3"}, "profiler_level"),
    ({"aic_metrics": "ACL_AICORE_NOPE", "profiler_level": "Level1"}, "aic_metrics"),
    ({"aic_metrics": "ACL_AICORE_PIPE_UTILIZATION"}, "Level1 or Level2"),
    ({"l2_cache": "yes"}, "l2_cache"),
    ({"export_type": "csv"}, "export_type"),
    ({"op_attr": True}, "op_attr is only valid with export_type=ExportType.Db"),
    ({"gc_detect_threshold": -1}, "gc_detect_threshold"),
])
def test_experimental_config_rejects_what_it_cannot_do(kwargs, match):
    with pytest.raises(ValueError, match=match):
        npu_profiler._ExperimentalConfig(**kwargs)


def test_pytorch_experimental_config_still_works():
    config = torch._C._profiler._ExperimentalConfig(verbose=False)
    with npu_profiler.profile(activities=ACTIVITIES, experimental_config=config) as prof:
        (torch.randn(8, 8, device="npu") * 2).sum().item()
    assert prof.npu_experimental_config is None
    assert any(e.key == "aten::mul" for e in prof.key_averages())


def test_record_op_args_records_shapes(tmp_path):
    config = npu_profiler._ExperimentalConfig(record_op_args=True)
    with npu_profiler.profile(activities=ACTIVITIES, experimental_config=config) as prof:
        torch.randn(8, 4, device="npu").relu().sum().item()
    assert prof.record_shapes
    root = Path(prof.export_ascend(str(tmp_path)))
    _, rows = read_csv(root / ascend.OUTPUT / "kernel_details.csv")
    assert next(r for r in rows if r["Name"] == "aten::relu")["Input Shapes"] == "8,4"


def test_level_none_writes_host_ops_only(tmp_path):
    config = npu_profiler._ExperimentalConfig(profiler_level=npu_profiler.ProfilerLevel.Level_none)
    with npu_profiler.profile(activities=ACTIVITIES, experimental_config=config) as prof:
        torch.randn(8, 8, device="npu").relu().sum().item()
    out = Path(prof.export_ascend(str(tmp_path))) / ascend.OUTPUT
    assert sorted(p.name for p in out.iterdir()) == ["operator_details.csv", "trace_view.json"]
    names = {e.get("args", {}).get("name") for e in json.loads((out / "trace_view.json").read_text())}
    assert "Python" in names and "Ascend Hardware" not in names


def test_export_before_results_is_a_clear_error(tmp_path):
    prof = npu_profiler.profile(activities=ACTIVITIES)
    with pytest.raises(RuntimeError, match="no results to export"):
        prof.export_ascend(str(tmp_path))


# ---- The Text export ------------------------------------------------------------

def test_layout_next_to_the_chrome_trace(exported):
    base, root, out = exported
    assert re.fullmatch(r"npu_\d{17}_ascend_pt", root.name)
    assert len(list(base.glob("npu.*.pt.trace.json"))) == 1, "the Chrome/TensorBoard trace beside it"
    assert sorted(p.name for p in out.iterdir()) == sorted([
        "trace_view.json", "kernel_details.csv", "op_statistic.csv", "operator_details.csv",
        "step_trace_time.csv", "memory_record.csv", "operator_memory.csv"])
    info = json.loads((root / "profiler_info.json").read_text())
    assert info["config"]["experimental_config"]["_profiler_level"] == "Level0"
    assert info["config"]["common_config"]["record_shapes"] is True
    assert info["projected_on"] == "Ascend910B2"


def test_kernel_details_and_op_statistic_name_the_dominant_op(exported):
    _, _, out = exported
    header, kernels = read_csv(out / "kernel_details.csv")
    assert header == ascend.KERNEL_DETAILS + ["Projected Duration(us)"]
    mm = [k for k in kernels if k["Name"] == "aten::mm"]
    assert len(mm) == 4 and {k["Type"] for k in mm} == {"MatMulV2"}      # 2 active steps x 2 matmuls
    assert {k["Step Id"] for k in kernels} == {"2", "3"}
    assert all(k["Start Time(us)"].endswith("\t") for k in kernels)      # the adapter's Excel guard
    assert mm[0]["Input Shapes"] == "384,384;384,384" and mm[0]["Input Data Types"] == "FLOAT;FLOAT"
    assert all(float(k["Projected Duration(us)"]) > 0 for k in mm)
    fallback = [k for k in kernels if k["Name"] == "cpu_fallback: aten::erfinv"]
    assert len(fallback) == 2 and fallback[0]["Accelerator Core"] == "AI_CPU"

    header, stats = read_csv(out / "op_statistic.csv")
    assert header == ascend.OP_STATISTIC + ["Projected Total Time(us)"]
    by_type = {(s["OP Type"], s["Core Type"]): s for s in stats}
    matmul = by_type[("MatMulV2", "AI_CORE")]
    assert int(matmul["Count"]) == 4
    assert float(matmul["Total Time(us)"]) == pytest.approx(sum(float(k["Duration(us)"]) for k in mm), abs=0.01)
    computing = [s for s in stats if s["Core Type"] != "MEMCPY_ASYNC"]
    assert max(computing, key=lambda s: float(s["Total Time(us)"]))["OP Type"] in ("MatMulV2", "erfinv")
    assert float(matmul["Total Time(us)"]) > 10 * float(by_type[("relu", "AI_CORE")]["Total Time(us)"])
    assert sum(float(s["Ratio(%)"]) for s in stats) == pytest.approx(100, abs=0.1)


def test_operator_details_steps_and_memory(exported):
    _, _, out = exported
    header, ops = read_csv(out / "operator_details.csv")
    assert header == ascend.OPERATOR_DETAILS
    mm = [o for o in ops if o["Name"] == "aten::mm"]
    assert len(mm) == 4 and all(float(o["Device Self Duration(us)"]) > 0 for o in mm)
    matmul = [o for o in ops if o["Name"] == "aten::matmul"]
    assert all(float(o["Device Self Duration(us)"]) == 0 < float(o["Device Total Duration(us)"]) for o in matmul)
    erfinv = next(o for o in ops if o["Name"] == "aten::erfinv")
    assert float(erfinv["Device Total Duration(us)"]) > 0 == float(erfinv["Device Total Duration With AICore(us)"])

    header, steps = read_csv(out / "step_trace_time.csv")
    assert header == ascend.STEP_TRACE_TIME and [s["Step"] for s in steps] == ["2", "3"]
    _, kernels = read_csv(out / "kernel_details.csv")
    compute = sum(float(k["Duration(us)"]) for k in kernels if k["Accelerator Core"] != "MEMCPY_ASYNC")
    assert sum(float(s["Computing"]) for s in steps) == pytest.approx(compute, rel=0.01)

    header, memory = read_csv(out / "memory_record.csv")
    assert header == ascend.MEMORY_RECORD and memory
    assert {m["Component"] for m in memory} == {"PTA"} and {m["Device Type"] for m in memory} == {"NPU:0"}
    assert max(float(m["Total Allocated(MB)"]) for m in memory) >= 3 * 384 * 384 * 4 / 2**20

    header, allocations = read_csv(out / "operator_memory.csv")
    assert header == ascend.OPERATOR_MEMORY
    by_mm = [a for a in allocations if a["Name"] == "aten::mm"]
    assert len(by_mm) == 4 and all(a["Size(KB)"] == f"{384 * 384 * 4 / 1024:.2f}" for a in by_mm)
    released = [a for a in by_mm if a["Release Time(us)"]]
    assert released and all(float(a["Duration(us)"]) > 0 for a in released)


def test_trace_view(exported):
    _, _, out = exported
    events = json.loads((out / "trace_view.json").read_text())
    pids = {e["args"]["name"]: e["pid"] for e in events if e.get("name") == "process_name"}
    assert set(pids) == {"Python", "Ascend Hardware", "Overlap Analysis"}
    kernels = [e for e in events if e.get("pid") == pids["Ascend Hardware"] and e.get("ph") == "X"
               and e.get("cat") != "npu_projected"]
    assert sum(e["name"] == "aten::mm" for e in kernels) == 4
    assert {e["args"]["Task Type"] for e in kernels} >= {"AI_CORE", "AI_CPU", "MEMCPY_ASYNC"}
    flows = [e for e in events if e.get("cat") == "async_npu"]
    assert len(flows) == 2 * len(kernels)
    projected = [e for e in events if e.get("cat") == "npu_projected"]
    assert len(projected) == sum("projected_us" in e["args"] for e in kernels) > 0
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert "Stream 0: projected on Ascend910B2 (estimate)" in tracks


def test_no_projection_columns_without_a_chip(tmp_path):
    prof = profile_to(str(tmp_path), "plain", project=False)
    out = Path(prof.npu_ascend_output) / ascend.OUTPUT
    if torch_npu.npu.get_profile() != "generic":
        pytest.skip("the active chip profile projects kernels by itself")
    assert read_csv(out / "kernel_details.csv")[0] == ascend.KERNEL_DETAILS
    assert read_csv(out / "op_statistic.csv")[0] == ascend.OP_STATISTIC


# ---- msprof-analyze -----------------------------------------------------------

def test_advisor_all_names_the_fallback_and_the_time(exported, tmp_path):
    _, root, out = exported
    output = run_msprof(["advisor", "all", "-d", str(root)], cwd=tmp_path)
    # The CPU fallback is what the advisor calls an AI-CPU operator, by name.
    assert "AICPU" in output and "erfinv" in output
    # Its overall summary: the computing time the export carries.
    found = re.search(r"计算时长是([\d.]+)ms", output)
    assert found, output
    events = json.loads((out / "trace_view.json").read_text())
    overlap = next(e["pid"] for e in events if e.get("name") == "process_name"
                   and e["args"]["name"] == "Overlap Analysis")
    computing_ms = sum(float(e["dur"]) for e in events
                       if e.get("pid") == overlap and e.get("name") == "Computing") / 1e3
    assert float(found.group(1)) == pytest.approx(computing_ms, rel=0.02, abs=0.01)
    assert list(tmp_path.glob("mstt_advisor_*.html"))


def test_compare_reads_two_profiles(exported, tmp_path):
    _, root, out = exported
    output = run_msprof(["compare", "-d", str(root), "-bp", str(root), "-o", str(tmp_path / "cmp")], cwd=tmp_path)
    assert "Computing Time" in output
    results = list((tmp_path / "cmp").glob("performance_comparison_result_*.xlsx"))
    assert len(results) == 1
    pd = pytest.importorskip("pandas")
    sheets = pd.read_excel(results[0], sheet_name=None, header=None)

    def table(name):   # the sheet's rows under its header row (the one naming "Top" or "Order Id")
        frame = sheets[name]
        at = next(i for i, row in frame.iterrows() if row.iloc[0] in ("Top", "Order Id"))
        return [dict(zip(frame.iloc[at], row)) for _, row in frame.iloc[at + 1:].iterrows()]

    _, kernels = read_csv(out / "kernel_details.csv")
    mm_us = sum(float(k["Duration(us)"]) for k in kernels if k["Name"] == "aten::mm")
    # The dominant op heads compare's operator and kernel statistics, with its time.
    top = table("OperatorCompareStatistic")[0]
    assert top["Operator Name"] == "aten::matmul" and int(top["Base Operator Number"]) == 4
    assert float(top["Base Device Duration(ms)"]) * 1e3 == pytest.approx(mm_us, rel=0.01)
    top = table("KernelCompare")[0]
    assert top["Kernel"] == "MatMulV2" and int(top["Calls"]) == 4
    assert float(top["Total Duration(us)"]) == pytest.approx(mm_us, rel=0.01)


def test_cluster_reads_two_ranks(tmp_path):
    runs = tmp_path / "cluster"
    step_computing = {}
    before = os.environ.get("RANK")
    for rank in (0, 1):
        os.environ["RANK"] = str(rank)      # as torchrun sets it
        try:
            prof = profile_to(str(runs), f"rank{rank}", project=False)
        finally:
            if before is None:
                del os.environ["RANK"]
            else:
                os.environ["RANK"] = before
        root = Path(prof.npu_ascend_output)
        assert (root / f"profiler_info_{rank}.json").exists()
        _, steps = read_csv(root / ascend.OUTPUT / "step_trace_time.csv")
        step_computing[rank] = {s["Step"]: float(s["Computing"]) for s in steps}
    run_msprof(["cluster", "-d", str(runs), "-o", str(tmp_path / "out")], cwd=tmp_path)
    _, rows = read_csv(tmp_path / "out" / "cluster_analysis_output" / "cluster_step_trace_time.csv")
    ranks = [r for r in rows if r["Type"] == "rank"]
    assert {int(r["Index"]) for r in ranks} == {0, 1}
    for r in ranks:
        assert float(r["Computing"]) == pytest.approx(step_computing[int(r["Index"])][r["Step"]], abs=0.01)


def test_handler_keeps_pytorchs_use_gzip(tmp_path):
    handler = npu_profiler.tensorboard_trace_handler(str(tmp_path), "gz", use_gzip=True)
    with npu_profiler.profile(activities=ACTIVITIES, profile_memory=True, on_trace_ready=handler) as prof:
        (torch.randn(64, 64, device="npu") @ torch.randn(64, 64, device="npu")).sum().item()
    assert len(list(tmp_path.glob("gz.*.pt.trace.json.gz"))) == 1
    out = Path(prof.npu_ascend_output) / ascend.OUTPUT
    _, memory = read_csv(out / "memory_record.csv")
    assert memory, "the memory samples are read from the gzipped trace"


def test_handler_without_analyse_writes_the_trace_only(tmp_path):
    handler = npu_profiler.tensorboard_trace_handler(str(tmp_path), "only", analyse_flag=False)
    with npu_profiler.profile(activities=ACTIVITIES, on_trace_ready=handler):
        torch.randn(8, device="npu").sum().item()
    assert [p.name.endswith(".pt.trace.json") for p in tmp_path.iterdir()] == [True]


def test_gc_detect_threshold_records_collections_the_advisor_reports(tmp_path):
    import gc
    config = npu_profiler._ExperimentalConfig(gc_detect_threshold=0)
    garbage = []
    with npu_profiler.profile(activities=ACTIVITIES, experimental_config=config) as prof:
        for _ in range(3):
            x = torch.randn(64, 64, device="npu").relu()
            for _ in range(20000):          # cycles for the collector to find
                a = []
                a.append(a)
            garbage.append(gc.collect())
            x.sum().item()
    assert prof.npu_gc_recorder is not None and len(prof.npu_gc_recorder.events) >= 3
    root = Path(prof.export_ascend(str(tmp_path / "prof")))
    events = json.loads((root / ascend.OUTPUT / "trace_view.json").read_text())
    collections = [e for e in events if e.get("cat") == "GC"]
    assert len(collections) >= 3 and all(float(e["dur"]) > 0 for e in collections)
    output = run_msprof(["advisor", "all", "-d", str(root)], cwd=tmp_path)
    found = re.search(r"GC）事件(\d+)次，总时间为([\d.]+)毫秒", output)   # "abnormal GC events: N, total T ms"
    assert found, output
    assert int(found.group(1)) >= 3
    assert float(found.group(2)) <= sum(float(e["dur"]) for e in collections) / 1e3 + 0.01


def test_level1_adds_the_cann_layer(tmp_path):
    def cann_events(level):
        config = npu_profiler._ExperimentalConfig(profiler_level=level)
        with npu_profiler.profile(activities=ACTIVITIES, experimental_config=config) as prof:
            x = torch.randn(16, 16, device="npu")
            for _ in range(3):
                x = x.relu() + 1
            x.sum().item()
        launches = sum(e.name == "npuLaunchKernel" for e in prof.events())
        root = Path(prof.export_ascend(str(tmp_path / level)))
        events = json.loads((root / ascend.OUTPUT / "trace_view.json").read_text())
        return launches, [e for e in events if e.get("cat") == "cann_api"]

    launches, events = cann_events(npu_profiler.ProfilerLevel.Level1)
    assert launches >= 6 and sum(e["name"] == "Node@launch" for e in events) == launches
    assert cann_events(npu_profiler.ProfilerLevel.Level0)[1] == []


def test_cpu_only_profile_writes_no_device_files(tmp_path):
    with npu_profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.randn(8, device="npu").relu().sum().item()
    out = Path(prof.export_ascend(str(tmp_path))) / ascend.OUTPUT
    assert sorted(p.name for p in out.iterdir()) == ["operator_details.csv", "trace_view.json"]


# ---- the Db export ------------------------------------------------------------

def query(path, sql):
    with sqlite3.connect(path) as db:
        return db.execute(sql).fetchall()


def test_db_export_holds_what_the_text_export_holds(tmp_path):
    both = npu_profiler._ExperimentalConfig(export_type=[npu_profiler.ExportType.Text, npu_profiler.ExportType.Db])
    prof = profile_to(str(tmp_path), "both", config=both, project=False)
    out = Path(prof.npu_ascend_output) / ascend.OUTPUT
    db, analysis = out / "ascend_pytorch_profiler.db", out / "analysis.db"
    assert db.exists() and analysis.exists() and (out / "kernel_details.csv").exists()
    _, kernels = read_csv(out / "kernel_details.csv")
    tasks = query(db, "SELECT t.endNs - t.startNs, t.streamId, s.value FROM TASK t JOIN STRING_IDS s ON s.id = t.taskType")
    assert len(tasks) == len(kernels) > 0
    assert sum(d for d, _, _ in tasks) / 1e3 == pytest.approx(sum(float(k["Duration(us)"]) for k in kernels), rel=1e-3)
    assert sorted(core for _, _, core in tasks) == sorted(k["Accelerator Core"] for k in kernels)
    # every kernel's operator type, as op_statistic counts them (copies have no compute task)
    _, stats = read_csv(out / "op_statistic.csv")
    counted = dict(query(db, "SELECT s.value, COUNT(*) FROM COMPUTE_TASK_INFO c JOIN STRING_IDS s ON s.id = c.opType "
                             "GROUP BY s.value"))
    assert counted == {r["OP Type"]: int(r["Count"]) for r in stats if r["Core Type"] != "MEMCPY_ASYNC"}
    assert counted["MatMulV2"] == 4 and counted["erfinv"] == 2
    # each kernel joins the host op that launched it
    launched = query(db, "SELECT COUNT(*) FROM TASK t JOIN PYTORCH_API p ON p.connectionId = t.connectionId "
                         "JOIN STRING_IDS s ON s.id = p.name WHERE s.value = 'aten::mm'")
    assert launched == [(4,)]
    _, steps = read_csv(out / "step_trace_time.csv")
    assert [(s, pytest.approx(c, abs=1e-3), pytest.approx(f, abs=1e-3))
            for s, c, f in query(analysis, "SELECT step, computing, free FROM StepTraceTime")] == \
        [(r["Step"], float(r["Computing"]), float(r["Free"])) for r in steps]
    assert [str(i) for i, in query(db, "SELECT id FROM STEP_TIME")] == [r["Step"] for r in steps]
    _, allocations = read_csv(out / "operator_memory.csv")
    rows = query(db, "SELECT s.value, m.size FROM OP_MEMORY m JOIN STRING_IDS s ON s.id = m.name")
    assert [(n, pytest.approx(b / 1024, abs=0.01)) for n, b in rows] == [(a["Name"], float(a["Size(KB)"]))
                                                                            for a in allocations]
    _, records = read_csv(out / "memory_record.csv")
    assert len(query(db, "SELECT * FROM MEMORY_RECORD")) == len(records) > 0


def test_db_only_export_and_cluster_analyses_read_it(tmp_path):
    runs = tmp_path / "cluster"
    config = npu_profiler._ExperimentalConfig(export_type=npu_profiler.ExportType.Db)
    computing, matmuls = {}, 0
    before = os.environ.get("RANK")
    for rank in (0, 1):
        os.environ["RANK"] = str(rank)
        try:
            prof = profile_to(str(runs), f"rank{rank}", config=config, project=False)
        finally:
            if before is None:
                del os.environ["RANK"]
            else:
                os.environ["RANK"] = before
        out = Path(prof.npu_ascend_output) / ascend.OUTPUT
        assert sorted(p.name for p in out.iterdir()) == ["analysis.db", f"ascend_pytorch_profiler_{rank}.db"]
        computing[rank] = dict(query(out / "analysis.db", "SELECT step, computing FROM StepTraceTime"))
        matmuls += query(out / f"ascend_pytorch_profiler_{rank}.db",
                         "SELECT COUNT(*) FROM COMPUTE_TASK_INFO c JOIN STRING_IDS s ON s.id = c.opType "
                         "WHERE s.value = 'MatMulV2'")[0][0]
    # (a run without communication has no communication groups, which the Db analysis reports as errors)
    no_groups = ["There is no CommunicationGroupMapping data", "Create CommunicationGroupMap table failed"]
    run_msprof(["cluster", "-d", str(runs), "-o", str(tmp_path / "out")], cwd=tmp_path, expected_errors=no_groups)
    result = tmp_path / "out" / "cluster_analysis_output" / "cluster_analysis.db"
    rows = query(result, "SELECT step, \"index\", computing FROM ClusterStepTraceTime WHERE type = 'rank'")
    assert {int(i) for _, i, _ in rows} == {0, 1}
    for step, index, value in rows:
        assert value == pytest.approx(computing[int(index)][step], abs=1e-3)
    run_msprof(["cluster", "-d", str(runs), "-m", "compute_op_sum", "-o", str(tmp_path / "ops")], cwd=tmp_path)
    stats = tmp_path / "ops" / "cluster_analysis_output" / "cluster_analysis.db"
    with sqlite3.connect(stats) as db:
        db.row_factory = sqlite3.Row
        by_type = {r["OpType"]: r for r in db.execute("SELECT * FROM ComputeOpAllRankStats")}
    assert matmuls == 8 and int(by_type["MatMulV2"]["Count"]) == matmuls

