"""torch_npu doctor: each planted trap found at its line, nothing on clean scripts,
reports in text, JSON (validated) and HTML (with its plots), --compare catching a
wrong kernel, and the Doctor context manager."""
import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import torch_npu
from torch_npu.doctor import KINDS, Doctor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAPS = os.path.join(ROOT, "examples", "traps.py")


def doctor_cli(*args, timeout=300):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "torch_npu.doctor", "--no-progress", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def planted_traps():
    """{line: kind} of the `# TRAP: kind` markers of examples/traps.py."""
    traps = {}
    with open(TRAPS) as f:
        for number, text in enumerate(f, 1):
            match = re.search(r"# TRAP: (\w+)", text)
            if match:
                traps[number] = match.group(1)
    return traps


@pytest.fixture(scope="module")
def traps_run(tmp_path_factory):
    """One doctor run of examples/traps.py (profiled), shared by the tests that read its reports."""
    out = tmp_path_factory.mktemp("traps")
    result = doctor_cli("--json", str(out / "report.json"), "--html", str(out / "report.html"), TRAPS,
                        "--steps", "8")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(out / "report.json") as f:
        report = json.load(f)
    return result.stdout, report, out / "report.html"


@pytest.mark.host_timing   # launch_bound: ops under 50 us of host time
def test_every_planted_trap_is_found_at_its_line(traps_run):
    _, report, _ = traps_run
    found = {(f["line"], f["kind"]) for f in report["findings"] if f["file"] and f["file"].endswith("traps.py")}
    planted = planted_traps()
    assert set(planted.values()) >= {"host_to_device_copy", "hidden_sync", "float64", "cpu_fallback",
                                     "launch_bound", "memory_growth", "strided_copy"}
    missing = {(line, kind) for line, kind in planted.items() if (line, kind) not in found}
    assert not missing, f"traps not reported: {missing}; found {sorted(found)}"


def test_no_finding_is_a_false_alarm(traps_run):
    _, report, _ = traps_run
    planted = planted_traps()
    for f in report["findings"]:
        assert planted.get(f["line"]) == f["kind"], f"unplanted finding: {f['kind']} at {f['file']}:{f['line']}"


@pytest.mark.host_timing
def test_findings_carry_cost_count_code_and_remedy(traps_run):
    stdout, report, _ = traps_run
    by_kind = {}
    for f in report["findings"]:
        by_kind.setdefault(f["kind"], f)
        assert f["count"] > 0 and f["remedy"] and "TRAP" in f["code"]
    assert by_kind["cpu_fallback"]["details"]["reason"] == "policy"
    assert by_kind["cpu_fallback"]["details"]["op"].startswith("aten::erfinv")
    assert by_kind["host_to_device_copy"]["bytes"] == 8 * 4 * 4          # 8 copies of 4 float32
    assert by_kind["host_to_device_copy"]["count"] == 8
    assert by_kind["hidden_sync"]["count"] == 8
    assert by_kind["launch_bound"]["count"] >= 32 * 8
    assert by_kind["memory_growth"]["bytes"] > 0
    assert by_kind["float64"]["details"]["fallbacks"] > 0
    # The text report: header, each finding with its line, the ops table and the profile.
    assert "torch_npu doctor: " in stdout and "8 optimizer steps" in stdout
    for f in report["findings"]:
        assert f"traps.py:{f['line']}" in stdout
    assert "Top npu ops by host time" in stdout and "Profile of 3 steps" in stdout


def test_json_report_validates_against_its_schema(traps_run):
    jsonschema = pytest.importorskip("jsonschema")
    from torch_npu.doctor._report import SCHEMA_PATH
    _, report, _ = traps_run
    with open(SCHEMA_PATH) as f:
        schema = json.load(f)
    jsonschema.validate(report, schema)
    assert report["schema"] == "torch_npu.doctor/1" and report["steps"] == 8
    assert report["profile"]["kernels"] > 0 and report["fallback_calls"] > 0
    assert report["step_memory"][-1]["allocated"] > report["step_memory"][1]["allocated"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(report, findings=[{"kind": "nonsense"}]), schema)


def _plots(html):
    return dict(re.findall(r"<img id='plot-([\w-]+)' alt='[^']*' src='data:image/png;base64,([^']+)'>", html))


def test_html_report_is_self_contained_with_its_plots(traps_run):
    image = pytest.importorskip("matplotlib.image")
    _, report, path = traps_run
    html = path.read_text()
    assert "<script" not in html and "http" not in html.replace("https://json-schema", "")
    plots = _plots(html)
    assert set(plots) == {"backends", "host-device", "memory", "fallbacks"}
    for name, data in plots.items():
        pixels = image.imread(io.BytesIO(base64.b64decode(data)), format="png")
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100, name
        assert pixels.std() > 0.01, f"plot {name} is blank"
    for f in report["findings"]:
        assert f"traps.py:{f['line']}" in html


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium (apt-get install chromium)")
def test_html_report_opens_in_a_headless_browser(traps_run, tmp_path):
    _, _, path = traps_run
    # The page's own images, measured by the browser once loaded: 0 when an image is broken.
    probe = tmp_path / "probe.html"
    probe.write_text(path.read_text().replace(
        "</body>", "<script>window.onload = () => { document.title = 'loaded ' + Array.from("
        "document.images).map(i => i.naturalWidth > 0 ? 1 : 0).join(''); };</script></body>"))
    result = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                             "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "<title>loaded 1111</title>" in result.stdout


def test_clean_training_script_gets_a_clean_report(tmp_path):
    out = tmp_path / "lm.json"
    result = doctor_cli("--no-profile", "--json", str(out), "examples/train_lm.py", "--steps", "12",
                        "--log-every", "6")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["steps"] == 12 and report["npu_ops"] > 1000
    assert report["findings"] == [], [(f["kind"], f["line"], f["title"]) for f in report["findings"]]
    assert "No problems found" in result.stdout


def test_clean_cnn_gets_a_clean_report(tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "cnn.json"
    result = doctor_cli("--no-profile", "--json", str(out), "examples/cnn_digits.py", "--epochs", "1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["steps"] > 10
    assert report["findings"] == [], [(f["kind"], f["line"], f["title"]) for f in report["findings"]]


def test_script_that_fails_still_gets_its_report(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import torch\nx = torch.ones(3, device='cuda')\nfor _ in range(12):\n    x.sum().item()\n"
                      "raise ValueError('the script broke')\n")
    result = doctor_cli("--no-profile", str(script))
    assert result.returncode == 1
    assert "ValueError: the script broke" in result.stdout   # in the report's header
    assert "broken.py:4" in result.stdout and "[hidden_sync]" in result.stdout


def test_interrupted_script_that_changed_directory_gets_its_report(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text("import os, torch\nos.chdir('/')\nx = torch.ones(3, device='cuda')\n"
                      "for _ in range(12):\n    x.sum().item()\nraise KeyboardInterrupt\n")
    result = doctor_cli("--no-profile", "--json", "interrupted.json", str(script), timeout=300)
    assert result.returncode == 130 and "interrupted" in result.stderr
    with open(os.path.join(ROOT, "interrupted.json")) as f:   # named from where the doctor started
        report = json.load(f)
    os.remove(os.path.join(ROOT, "interrupted.json"))
    assert report["error"] == "KeyboardInterrupt"
    [f] = report["findings"]
    assert f["file"] == str(script) and f["line"] == 5 and f["code"] == "x.sum().item()"


def test_cli_errors_are_clear():
    result = doctor_cli("no/such/script.py")
    assert result.returncode == 2 and "no such script: no/such/script.py" in result.stderr
    result = subprocess.run([sys.executable, "-c", "import sys; from torch_npu.doctor.__main__ import cli_main; "
                             "sys.argv = ['torch_npu', 'unknown']; cli_main()"], capture_output=True, text=True)
    assert result.returncode == 2 and "torch_npu doctor" in result.stderr


# ---- in process: the Doctor context manager and --compare ----

def _line_of(fn, text):
    import inspect
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_doctor_context_manager_reports_a_sync_in_the_loop():
    def loop():
        w = torch.randn(8, 8, device="npu", requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.01)
        x = torch.randn(4, 8, device="npu")
        total = 0.0
        for _ in range(6):
            loss = (x @ w).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            total += loss.item()   # the sync
        return total

    with Doctor(profile=False) as d:
        with pytest.raises(RuntimeError, match="once the Doctor has stopped"):
            d.report()
        loop()
    assert d.run.steps == 6
    kinds = [(f.kind, f.line) for f in d.findings]
    assert kinds == [("hidden_sync", _line_of(loop, "total += loss.item()"))]
    assert d.findings[0].file == __file__ and ".item()" in d.findings[0].title
    text = str(d.report())
    assert "1 finding, costliest first" in text and ".item()" in text
    # Everything it patched is back.
    assert torch.npu.synchronize.__module__ == "torch_npu.npu._device"
    assert "synchronize" not in vars(torch.npu.Stream) and torch.Tensor.__repr__.__module__ == "torch._tensor"


def test_print_and_shape_syncs_and_steps_marked_by_hand(capsys):
    x = torch.arange(16.0, device="npu")
    with Doctor(profile=False) as d:
        for _ in range(12):
            print(x)                           # printing reads the tensor
            d.step()
        for _ in range(12):
            x[x > 3].sum()                     # a boolean index: the shape depends on the data
            d.step()
    capsys.readouterr()
    titles = {f.title for f in d.findings if f.kind == "hidden_sync"}
    assert any("print" in t for t in titles) and any("depends on the data" in t for t in titles), titles
    assert d.run.steps == 24


def test_each_kind_of_host_read_is_named():
    x = torch.arange(6.0, device="npu")

    def reads():
        for _ in range(12):
            a = x.sum().item()
            b = x.cpu()
            c = x.tolist()
            if x.max() > 2:
                pass
            d.step()

    with Doctor(profile=False) as d:
        reads()
    titles = {f.line: f.title for f in d.findings if f.kind == "hidden_sync"}
    assert set(titles) == {_line_of(reads, text) for text in ("item()", "cpu()", "tolist()", "if x.max()")}, titles
    assert titles[_line_of(reads, "if x.max()")].startswith("a Python number or bool()")
    assert titles[_line_of(reads, "cpu()")].startswith(".cpu() waits")
    [cpu] = [f for f in d.findings if f.line == _line_of(reads, "cpu()")]
    assert cpu.bytes == 12 * 6 * 4


def test_float64_from_numpy_is_found_where_it_enters():
    np = pytest.importorskip("numpy")
    data = np.linspace(0, 1, 32)               # numpy: float64

    def run():
        for _ in range(3):
            t = torch.from_numpy(data).to("npu")
            (t * 2).sum()

    with Doctor(profile=False) as d:
        run()
    [f] = [f for f in d.findings if f.kind == "float64"]
    assert f.line == _line_of(run, "torch.from_numpy") and f.count >= 9


class Block(torch.nn.Module):
    """Attention-like reshapes: views and permutes on every line, once per layer."""

    def __init__(self, width=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        return x + self.out(y.transpose(1, 2).reshape(b, t, c))


def test_a_clean_loop_with_dataloader_accumulation_and_eval_reports_nothing():
    from torch.utils.data import DataLoader, Dataset

    class Pairs(Dataset):
        def __init__(self, n, seed):
            g = torch.Generator().manual_seed(seed)
            self.x, self.y = torch.randn(n, 6, 16, generator=g), torch.randint(0, 4, (n,), generator=g)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return {"x": self.x[i], "y": self.y[i], "mask": torch.ones(6, dtype=torch.bool)}

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block() for _ in range(12)]).npu()
    head = torch.nn.Linear(16, 4).npu()
    params = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 4)
    train = DataLoader(Pairs(64, 0), batch_size=4, shuffle=True)
    val = DataLoader(Pairs(8, 1), batch_size=4)
    losses = []
    with Doctor(profile=False) as d:
        for i, batch in enumerate(train):
            batch = {k: v.to("npu", non_blocking=True) for k, v in batch.items()}
            h = model(batch["x"]).masked_fill(~batch["mask"][..., None], 0).mean(1)
            loss = torch.nn.functional.cross_entropy(head(h), batch["y"]) / 2
            loss.backward()
            if i % 2 == 1:                                   # gradient accumulation over two batches
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad(set_to_none=True)
            if i % 8 == 7:                                   # a periodic evaluation and a logged loss
                losses.append(loss.item())
                with torch.no_grad():
                    correct = sum((head(model(b["x"].npu()).mean(1)).argmax(1) == b["y"].npu()).sum()
                                  for b in val)
                losses.append(correct.item())
    assert d.run.steps == 8 and d.run.total_ops > 1000
    assert d.findings == [], [(f.kind, f.line, f.title) for f in d.findings]


def test_sparse_copies_and_overloaded_fallbacks():
    dense = torch.eye(3)
    torch_npu.NPUFallbackMode.set_op_fallback("mul", "cpu")
    try:
        with Doctor(profile=False) as d:
            for _ in range(12):
                sparse = dense.to_sparse().to("npu")
                scaled = torch.ones(3, device="npu").mul(torch.full((3,), 2.0, device="npu"))
    finally:
        torch_npu.NPUFallbackMode.set_op_fallback("mul", "default")
    assert sparse.is_sparse and scaled.device.type == "npu"
    [f] = [f for f in d.findings if f.kind == "cpu_fallback"]
    assert f.details["op"] == "aten::mul.Tensor" and f.count == 12 and f.seconds > 0 and f.bytes > 0
    assert d.run.fallback_calls == 12 and "12 fell back to the CPU" in str(d.report())


@pytest.fixture(scope="module")
def wrong_npu_kernel():
    """doctor_test::scaled: x * 2 on the cpu; its npu kernel is made wrong on purpose."""
    lib = torch.library.Library("doctor_test", "DEF")
    lib.define("scaled(Tensor x) -> Tensor")
    lib.impl("scaled", lambda x: x * 2, "CPU")
    lib.impl("scaled", lambda x: x * 2 + (x > 0.5).to(x.dtype) * 1e-2, "PrivateUse1")
    lib.define("scaled_into(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
    lib.impl("scaled_into", lambda x, *, out: out.copy_(x * 2), "CPU")
    lib.impl("scaled_into", lambda x, *, out: out.copy_(x * 3), "PrivateUse1")
    yield torch.ops.doctor_test.scaled
    lib._destroy()


def test_compare_catches_a_wrong_npu_kernel(wrong_npu_kernel):
    def model(x):
        y = wrong_npu_kernel(x)                # the wrong one
        return torch.relu(y) + 1

    x = torch.rand(64, device="npu")
    with Doctor(compare=True, profile=False) as d:
        out = model(x)
    assert torch.allclose(out.cpu(), torch.relu(x.cpu() * 2) + 1, atol=0.02)
    [f] = [f for f in d.findings if f.kind == "wrong_result"]
    assert f.details["op"] == "doctor_test::scaled" and f.line == _line_of(model, "the wrong one")
    assert f.details["inputs"] == ["float32[64]"] and 5e-3 < f.details["max_abs_diff"] < 2e-2
    assert d.findings[0] is f                  # wrong results come first
    assert d.run.compared >= 3 and len(d.run.mismatches) == 1
    assert "1 op differ" in str(d.report())


def test_compare_checks_out_arguments(wrong_npu_kernel):
    x, out = torch.rand(8, device="npu"), torch.empty(8, device="npu")
    with Doctor(compare=True, profile=False) as d:
        torch.ops.doctor_test.scaled_into(x, out=out)
    [m] = d.run.mismatches
    assert m.op == "doctor_test::scaled_into" and m.bad_calls == 1


def test_compare_passes_correct_kernels():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16)).npu()
    x = torch.randn(4, 8, device="npu")
    with Doctor(compare=True, profile=False) as d:
        model(x).sum().backward()
    assert d.run.compared > 5 and d.run.mismatches == [] and d.findings == []


def test_kinds_are_documented():
    assert set(KINDS) == {"cpu_fallback", "host_to_device_copy", "hidden_sync", "launch_bound", "strided_copy",
                          "float64", "memory_growth", "wrong_result"}
    assert torch_npu.doctor.Doctor is Doctor
