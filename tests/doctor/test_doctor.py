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
from helpers import REPO_ROOT
from torch_npu.doctor import KINDS, Doctor

ROOT = REPO_ROOT
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
    # and, with the CLI's default --target, measured against projected device time per op
    assert set(plots) == {"backends", "host-device", "memory", "fallbacks", "projected"}
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


@pytest.mark.child_process
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
    # Each names the expression, and gets the remedy of its kind of read.
    assert titles[_line_of(reads, "if x.max()")].startswith("`if x.max() > 2:` branches on an npu tensor")
    assert titles[_line_of(reads, "cpu()")].startswith("`x.cpu()` copies to the host")
    assert titles[_line_of(reads, "item()")].startswith("`x.sum().item()` waits")
    assert titles[_line_of(reads, "tolist()")].startswith("`x.tolist()` waits")
    remedies = {f.details["form"]: f.remedy for f in d.findings}
    assert set(remedies) == {"item", "to_host", "tolist", "branch"}
    assert "torch.where" in remedies["branch"] and "torch.cat" in remedies["to_host"]
    assert ".tolist() once" in remedies["tolist"] and remedies["item"].startswith("keep the value on the npu")
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
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    table = set(re.findall(r"^\| `([a-z0-9_]+)` \|", (root / "docs/guide/doctor.md").read_text(), re.MULTILINE))
    assert set(KINDS) <= table, set(KINDS) - table                    # a row of the guide's table each
    schema = json.loads((root / "python/torch_npu/doctor/report.schema.json").read_text())
    assert schema["properties"]["findings"]["items"]["properties"]["kind"]["enum"] == list(KINDS)
    assert torch_npu.doctor.Doctor is Doctor


# ---- the second edition: loops without an optimizer, fresh host tensors, one remedy per read ----

class _Stack(torch.nn.Module):
    """A model whose forward loops over its layers on two lines (a loop inside each iteration)."""

    def __init__(self, width=16, depth=3):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
            x = torch.relu(x)
        return x


def test_an_inference_loop_without_optimizer_has_its_iterations():
    model = _Stack().npu().eval()
    batches = [torch.randn(8, 16) for _ in range(10)]

    def evaluate():
        correct = 0
        with torch.no_grad():
            for xb in batches:
                out = model(xb.npu())
                correct += (out.argmax(1) == 0).sum().item()     # a read per batch
        return correct

    with Doctor(profile=False) as d:
        evaluate()
    assert d.clock == "loop" and 9 <= d.run.steps <= 10, d.run.steps
    assert len(d.run.step_memory) == d.run.steps
    [f] = d.findings
    assert (f.kind, f.line) == ("hidden_sync", _line_of(evaluate, "correct +="))
    assert f.title.startswith("`(out.argmax(1) == 0).sum().item()` waits for the npu, 10 times")


def test_a_generation_loop_is_found_inside_its_function_and_profiled():
    model = _Stack(depth=4).npu().eval()

    def generate(x, steps):
        outs = []
        with torch.no_grad():
            for _ in range(steps):
                x = model(x)
                outs.append(x[:, :1])
        return torch.cat(outs, 1)

    with Doctor() as d:
        generate(torch.randn(2, 16, device="npu"), 12)
    assert 11 <= d.run.steps <= 12 and d.monitor.primary_loop.function == "generate"
    assert d.run.profile is not None and d.run.profile.get("steps") == 3   # the profiled window opened
    assert d.findings == [], [(f.kind, f.line, f.title) for f in d.findings]


def test_a_validation_loop_read_per_batch_is_in_the_loop_though_few_optimizer_steps_see_it():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(4)]
    val = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(6)]

    def fit(clean):
        for _ in range(3):
            for x, y in train:
                loss = torch.nn.functional.cross_entropy(model(x.npu()), y.npu())
                opt.zero_grad()
                loss.backward()
                opt.step()
            total = torch.zeros((), device="npu")
            with torch.no_grad():
                for x, y in val:
                    val_loss = torch.nn.functional.cross_entropy(model(x.npu()), y.npu())
                    if clean:
                        total += val_loss
                    else:
                        total += val_loss.item()      # a read per validation batch
            last = total.item()                        # once per epoch: fine
        return last

    with Doctor(profile=False) as d:
        fit(clean=False)
    assert d.clock == "optimizer" and d.run.steps == 12
    [f] = d.findings
    assert (f.kind, f.line) == ("hidden_sync", _line_of(fit, "total += val_loss.item()")), f
    with Doctor(profile=False) as d:
        fit(clean=True)
    assert d.findings == [], [(f.kind, f.line, f.title) for f in d.findings]


def test_steps_at_a_line_marks_the_iterations():
    x = torch.ones(4, device="npu")

    def run():
        for i in range(7):
            y = x * i                         # the step line
            y.sum()

    with Doctor(profile=False, steps_at=f"{__file__}:{_line_of(run, 'the step line')}") as d:
        run()
    assert d.clock == "line" and d.run.steps == 7
    with Doctor(profile=False, steps_at=("test_doctor.py", _line_of(run, "for i in range(7)"))) as d:
        run()
    assert d.run.steps == 8                   # a for line runs once more, to end the loop
    assert sys.gettrace() is None             # the tracer is gone
    for bad in ("train.py", "train.py:x", ":3", "train.py:0"):
        with pytest.raises(ValueError, match="steps_at"):
            Doctor(steps_at=bad)


def test_host_tensors_made_in_the_loop_and_copied_in_name_the_line_that_made_them():
    device = "npu"
    x_cpu = torch.randn(16, 16)

    def loop():
        x = torch.zeros(16, 16, device=device)
        for _ in range(8):
            x = x + torch.randn(16, 16).npu()                # made and copied on one line
            w = torch.randn(16, 16)                          # made here ...
            w = w.to(device)                                 # ... copied here
            noise = (torch.randn_like(x_cpu) * 0.1).to(device)   # computed from a fresh one
            x = x @ w + noise
        return x

    with Doctor(profile=False) as d:
        loop()
    copies = {f.line: f for f in d.findings if f.kind == "host_to_device_copy"}
    assert set(copies) == {_line_of(loop, text) for text in ("one line", "copied here", "randn_like")}, copies
    w = copies[_line_of(loop, "copied here")]
    assert w.details["made_at"]["line"] == _line_of(loop, "made here") and w.count == 8
    assert f"made by torch.randn at line {_line_of(loop, 'made here')}" in w.title
    assert "device=" in w.remedy
    assert "torch.randn_like(x_npu)" in copies[_line_of(loop, "randn_like")].remedy


def test_batches_of_a_host_dataset_are_not_fresh_host_tensors():
    from torch.utils.data import DataLoader, TensorDataset
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    X = torch.randn(64, 8)

    def batches():                 # a generator making random batches on the host
        for _ in range(8):
            yield torch.randn(8, 8)

    def loop():
        total = torch.zeros((), device="npu")
        for (xb, yb), i, gb in zip(DataLoader(data, batch_size=8), range(8), batches()):
            total += xb.npu().sum() + yb.npu().sum()
            total += X[i * 8:(i + 1) * 8].npu().sum()         # slices of a host tensor made once
            total += gb.npu().sum()
        return total

    with Doctor(profile=False) as d:
        loop()
    assert d.findings == [], [(f.kind, f.line, f.title) for f in d.findings]


def test_each_read_gets_its_remedy_end_of_sequence_index_int_and_print(capsys):
    vocab = ["a", "b", "c", "d"]
    logits = torch.randn(12, 4, device="npu")

    def generate():
        out, text = [], []
        for step in range(12):
            token = logits[step].argmax()
            text.append(vocab[token])                # a 0-dim tensor as an index
            out.append(int(token))                   # int() of a tensor
            print(logits[step, :2])                  # printing a tensor
            if token == 99:                          # an end-of-sequence check
                break
        return out

    with Doctor(profile=False) as d:
        generate()
    capsys.readouterr()
    forms = {f.line: f.details["form"] for f in d.findings if f.kind == "hidden_sync"}
    assert forms == {_line_of(generate, "as an index"): "index", _line_of(generate, "int() of"): "convert",
                     _line_of(generate, "printing"): "print", _line_of(generate, "end-of-sequence"): "stop"}, forms
    by_form = {f.details["form"]: f for f in d.findings}
    assert "finished" in by_form["stop"].remedy and "torch.gather" in by_form["index"].remedy
    assert by_form["index"].title.startswith("`vocab[token]` uses a 0-dim npu tensor")
    assert not [f for f in d.findings if f.kind == "cpu_fallback"]   # printing's own reductions are not the user's


def test_grad_scaler_work_is_not_the_users():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("npu")
    x, y = torch.randn(8, 16, device="npu"), torch.randint(0, 4, (8,), device="npu")
    with Doctor(profile=False) as d:
        for _ in range(8):
            with torch.autocast("npu", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    assert d.run.steps >= 1
    assert d.findings == [], [(f.kind, f.line, f.title) for f in d.findings]


def test_memory_growth_names_the_line_that_keeps_the_tensors():
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).npu()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def train():
        history = []
        for _ in range(10):
            loss = model(torch.randn(64, 32, device="npu")).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(loss)                     # keeps every step's graph
        return history

    def infer():
        outputs = []
        for _ in range(10):
            outputs.append(model(torch.randn(64, 32, device="npu")))   # no torch.no_grad(): graphs kept
        return outputs

    for fn, text, name in ((train, "history.append", "history"), (infer, "outputs.append", "outputs")):
        with Doctor(profile=False) as d:
            fn()
        [f] = [f for f in d.findings if f.kind == "memory_growth"]
        assert f.line == _line_of(fn, text) and f.details["holder"]["name"] == name, (f.line, f.title)
        assert f"`{name}` keeps tensors with their autograd graphs" in f.title and "detach" in f.remedy
        assert "_record_memory_history()" in f.remedy and "_dump_snapshot(" in f.remedy


@pytest.mark.host_timing   # the floor: a share of the npu op time
def test_findings_below_the_cost_floor_are_minor():
    big = torch.randn(512, 512, device="npu")
    small = torch.ones(4, device="npu")

    def loop(matmuls):
        for _ in range(12):
            for _ in range(matmuls):
                big @ big                            # the run's npu time
            small.sum().item()                       # a read: cheap next to the matmuls
            (small + 1).cpu()

    with Doctor(profile=False) as d:
        loop(12)
    syncs = [f for f in d.findings if f.kind == "hidden_sync"]
    assert len(syncs) == 2 and all(f.minor for f in syncs), [(f.title, f.seconds, d.run.op_ns) for f in syncs]
    assert all(f.as_dict()["minor"] for f in syncs)
    assert d.findings[-len(syncs):] == syncs        # listed after the others
    with Doctor(profile=False) as d:                 # the same reads are the cost of a run without the matmuls
        loop(0)
    assert len(d.findings) == 2 and not any(f.minor for f in d.findings)


def test_findings_are_ranked_by_their_projected_cost_on_the_target():
    from torch_npu._emu import profiles as _profiles
    big = torch.randn(512, 512, device="npu")
    small = torch.ones(4, device="npu")

    def loop():
        for _ in range(12):
            for _ in range(8):
                big @ big
            small.sum().item()                       # a read per step

    with Doctor(profile=False) as plain:             # no target: no projection
        loop()
    assert all(f.projected_s is None for f in plain.findings) and plain.run.verdict is None
    runs = []
    for _ in range(2):
        with Doctor(target="ascend910b2") as d:
            loop()
        runs.append(d)
    d = runs[0]
    v = d.run.verdict
    assert v is not None and v.steps == 3 and v.step is not None and v.exact == (torch.npu.get_profile() == "ascend910b2")
    assert v.kernels_per_step == pytest.approx(9)    # 8 matmuls and the sum, per step
    cost = _profiles.load("ascend910b2").cost
    [sync] = [f for f in d.findings if f.kind == "hidden_sync"]
    # A read's cost there: the wait's latency and the dispatch that restarts the chip, per read.
    assert sync.projected_s == pytest.approx(sync.count * (cost["sync_us"] + cost["host_dispatch_us"]) * 1e-6)
    major = [f for f in d.findings if not f.minor]
    costs = [f.projected_s or 0.0 for f in major if f.kind != "wrong_result"]
    assert costs == sorted(costs, reverse=True)
    assert [r.kind for r in v.ranked] == [f.kind for f in d.findings if f.projected_s]
    assert "projected on Ascend910B2" in str(d.report())
    # Counts and the profile's figures decide the rank and the split, not this machine's timings.
    assert [(f.kind, f.line, f.minor) for f in runs[0].findings] == [(f.kind, f.line, f.minor) for f in runs[1].findings]
    with pytest.raises(ValueError, match="no chip"):
        Doctor(target="generic")


def test_float16_overflow_is_named_for_a_chip_that_saturates():
    x = torch.full((8,), 300.0, device="npu", dtype=torch.float16)

    def loop():
        for _ in range(6):
            x * x                       # 90000: past float16's range, inf here
            (x + 1) * 0.5               # in range

    with Doctor(target="ascend910a", profile=False) as d:     # 910A saturates to +-65504
        loop()
    line = _line_of(loop, "x * x")
    assert d.run.verdict.overflow_sites == [(__file__, line, 6)]
    assert any("past +-65504 in 6 op calls" in t and "saturates" in t for t in d.run.verdict.refused_dtypes)
    [overflow] = [f for f in d.findings if f.kind == "float16_overflow"]
    assert (overflow.line, overflow.count, overflow.minor) == (line, 6, False)
    assert d.report().as_dict()["target"]["float16_overflows"] == [{"file": __file__, "line": line, "calls": 6}]
    with Doctor(target="ascend910b2", profile=False) as d:    # gives inf as here: nothing to count
        loop()
    assert not d.monitor.watch_overflow and d.run.verdict.overflow_sites == []
    assert not [f for f in d.findings if f.kind == "float16_overflow"]


def test_graph_breaks_and_recompilations_are_findings():
    import torch._dynamo

    @torch.compile(backend="eager")          # dynamo's own records do not depend on the backend
    def damp(x):
        y = torch.tanh(x)
        if y.sum() > 0:                       # the graph break
            y = y * 0.5
        return y

    @torch.compile(backend="eager", dynamic=False)
    def scale(x):
        return x * 2

    torch._dynamo.reset()
    try:
        with Doctor(profile=False) as d:
            for n in range(2, 7):
                damp(torch.ones(4, device="npu"))
                scale(torch.ones(n, device="npu"))      # a new shape every call: recompiled every time
    finally:
        torch._dynamo.reset()
    found = {f.details["what"]: f for f in d.findings if f.kind == "compile"}
    brk, again = found["graph_break"], found["recompile"]
    assert brk.line == _line_of(damp, "if y.sum() > 0") and "torch.where" in brk.remedy
    assert brk.details["function"] == "damp" and brk.seconds > 0
    assert again.count == 4 and again.details["function"] == "scale" and again.seconds > 0
    assert "mark_dynamic(x, 0)" in again.remedy and "size mismatch" in again.title
    header = d.report().header_lines()[3]
    assert "1 graph break, 4 recompilations" in header and "damp" in header and "scale" in header, header
    assert {"compile", "hidden_sync"} <= {f.kind for f in d.findings}


def test_inference_mode_copies_and_reads_are_seen():
    # Under inference_mode PyTorch hands the mode aten::to, aten::item and aten::is_nonzero
    # undecomposed: they are still copies and reads.
    model = torch.nn.Linear(8, 4).npu()
    data = [torch.randn(4, 8) for _ in range(8)]

    def infer():
        outs, n = [], 0
        with torch.inference_mode():
            for xb in data:
                probs = model(xb.to("npu")).softmax(-1)
                outs.append(probs.cpu())                     # a copy to the host per batch
                n += probs.argmax(1).sum().item()             # a read per batch
                if probs.max() > 2:                           # a branch per batch
                    n += 1
        return outs, n

    with Doctor(profile=False) as d:
        infer()
    forms = {f.details["form"]: f.line for f in d.findings if f.kind == "hidden_sync"}
    assert forms == {"to_host": _line_of(infer, "probs.cpu()"), "item": _line_of(infer, ".item()"),
                     "branch": _line_of(infer, "if probs.max()")}, forms
    assert sum(s.h2d for s in d.run.sites) == 8       # the batches' copies, seen as copies


def test_one_value_repeated_into_a_host_list_each_iteration_is_found():
    x = torch.randn(16, 4, device="npu")

    def sample():
        nonlocal x
        for t in range(10):
            t_batch = torch.tensor([t] * 16, device="npu")      # one value, a list, a copy
            tokens = torch.tensor([t, 2 * t, 3, 4], device="npu")  # data from the host: fine
            x = x + t_batch[:, None] * 0.1 + tokens[None, :]
        return x

    with Doctor(profile=False) as d:
        sample()
    [f] = d.findings
    assert (f.kind, f.line) == ("host_to_device_copy", _line_of(sample, "one value, a list"))
    assert "torch.full" in f.remedy


@pytest.mark.host_timing   # launch_bound: ops under 50 us of host time
def test_a_function_of_small_ops_called_per_sample_is_launch_bound():
    batches = [torch.randn(48, 8) for _ in range(6)]

    def normalize(sample):
        return (sample - sample.mean()) / (sample.std() + 1e-6)      # the tiny ops

    def pipeline():
        out = []
        for batch in batches:
            batch = batch.npu()
            out.append(torch.stack([normalize(s) for s in batch]).amax(1))
        return torch.cat(out)

    with Doctor(profile=False) as d:
        pipeline()
    [f] = d.findings
    assert (f.kind, f.line) == ("launch_bound", _line_of(normalize, "the tiny ops")), (f.kind, f.line, f.title)


COMPILED = """\
import torch
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).npu()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
step = torch.compile(lambda x: m(x).square().mean())
for i in range(8):
    loss = step(torch.randn(8, 16, device="npu"))
    loss.backward()
    opt.step()
    opt.zero_grad()
import torch._dynamo.utils as u
print("graphs", u.counters["stats"]["unique_graphs"])
"""


@pytest.mark.child_process
def test_compiled_code_runs_compiled_under_the_doctor(tmp_path):
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "torch_npu.doctor", "--no-progress", "--no-profile", "--target",
                           "none", "--json", str(out), str(script)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "graphs 1" in proc.stdout                         # dynamo compiled it, under the doctor's mode
    assert "torch.compile: " in proc.stdout and "compiled into 1 graph, 0 graph breaks" in proc.stdout
    report = json.loads(out.read_text())
    assert report["compile"]["graphs"] == 1 and report["compile"]["graph_breaks"] == {}
    # the generated code's ops are the compiled function's: no finding points into inductor's cache
    assert all("torchinductor" not in (f["file"] or "") for f in report["findings"]), report["findings"]
