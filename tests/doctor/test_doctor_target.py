"""The doctor answers for the target chip: it runs the script as that chip (its support
set, dtypes and numerics), reports what falls back there at the user's line (through
PyTorch's composites, the chip's decompositions, the backward pass and installed
packages), float16 saturation and bfloat16 refusal as findings, answers for other chips
from the same run, keeps third-party noise out of its output, and gives the same
findings and split from run to run."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO_ROOT

ROOT = REPO_ROOT


def doctor(script, *args, tmp_path, timeout=300, env=None):
    """Runs the doctor CLI on ``script`` (text); returns (process, JSON report)."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "torch_npu.doctor", "--no-progress", "--json", str(report), *args,
                           str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(report.read_text())


def line_of(script, text):
    lines = textwrap.dedent(script).splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def findings(report, kind=None):
    return [f for f in report["findings"] if kind is None or f["kind"] == kind]


CHIP_ONLY = """\
import torch
import torch.nn.functional as F
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
w = torch.randn(16, 10, device=device, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.01)
for step in range(6):
    h = torch.randn(20, 4, 16, device=device) @ w
    a = torch.logcumsumexp(h, dim=2).mean()
    logp = h.log_softmax(2)
    targets = torch.randint(1, 10, (4, 5), device=device)
    lengths = torch.full((4,), 20, dtype=torch.long, device=device)
    b = F.ctc_loss(logp, targets, lengths, torch.full((4,), 5, dtype=torch.long, device=device))
    c = torch.lgamma(h.exp() + 1).mean()
    loss = a + b + c
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_the_target_is_run_and_its_fallbacks_are_found_at_the_users_lines(tmp_path):
    proc, report = doctor(CHIP_ONLY, "--no-profile", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Ascend910B2" in report["device"] and report["target"]["exact"] is True
    by_op = {f["details"]["op"]: f for f in findings(report, "cpu_fallback")}
    lcse, ctc, lgamma = (line_of(CHIP_ONLY, t) for t in ("logcumsumexp", "ctc_loss", "lgamma"))
    # The chip decomposes logcumsumexp; its _logcumsumexp falls back in the backward pass.
    assert by_op["aten::_logcumsumexp"]["line"] == lcse
    assert "backward pass" in by_op["aten::_logcumsumexp"]["title"]
    # ctc_loss with tensor lengths: the forward and its backward, both at the user's line.
    assert by_op["aten::_ctc_loss.Tensor"]["line"] == ctc
    assert by_op["aten::_ctc_loss_backward.Tensor"]["line"] == ctc
    assert by_op["aten::_ctc_loss_backward.Tensor"]["details"]["backward_calls"] == 6
    # lgamma reaches lgamma.out through the chip's decomposition; digamma in the backward.
    assert by_op["aten::lgamma.out"]["line"] == lgamma and "inside aten::lgamma" in by_op["aten::lgamma.out"]["title"]
    assert by_op["aten::digamma.out"]["line"] == lgamma
    assert all(f["file"] for f in report["findings"])                 # every one at a line of the script
    assert {f["op"] for f in report["target"]["fallbacks"]} == set(by_op)
    # The ideal npu has these kernels: nothing falls back, and there is no chip verdict.
    proc, generic = doctor(CHIP_ONLY, "--no-profile", "--target", "generic", tmp_path=tmp_path)
    assert proc.returncode == 0 and not findings(generic, "cpu_fallback") and generic["target"] is None
    assert "Emulated NPU" in generic["device"]


def test_an_installed_packages_work_is_reported_at_the_line_that_called_it(tmp_path):
    package = tmp_path / "site-packages" / "vendorlib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent("""\
        import torch
        def score(x):
            total = 0.0
            for row in x:
                total += float(row.sum())           # a host read per row, inside the package
            return torch.logcumsumexp(x, dim=1), total
        """))
    script = f"""\
    import sys
    sys.path.insert(0, {str(tmp_path / "site-packages")!r})
    import torch
    import vendorlib
    x = torch.randn(8, 32, device="npu")
    for step in range(6):
        y, total = vendorlib.score(x)
    """
    proc, report = doctor(script, "--no-profile", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    call = line_of(script, "vendorlib.score(x)")
    sync, = findings(report, "hidden_sync")
    fallback, = findings(report, "cpu_fallback")
    for f in (sync, fallback):
        assert f["line"] == call and f["file"].endswith("script.py"), f
        assert f["details"]["inside"]["file"].endswith(os.path.join("vendorlib", "__init__.py"))
    assert sync["details"]["inside"]["line"] in (4, 5, 6)
    assert "inside " in proc.stdout and "(an installed package)" in proc.stdout


SATURATES = """\
import torch
x = torch.full((64,), 300.0, device="npu", dtype=torch.float16)
for step in range(6):
    y = x * x
    z = (y.clamp(max=100) + 1) * 0.5
"""


def test_float16_saturation_is_a_finding_on_a_chip_without_inf(tmp_path):
    proc, report = doctor(SATURATES, "--no-profile", "--target", "ascend310p3", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    f, = findings(report, "float16_overflow")
    assert f["line"] == line_of(SATURATES, "x * x") and f["count"] == 6 and not f["minor"]
    assert "saturates" in f["title"] and report["target"]["float16_overflows"][0]["calls"] == 6
    # The default target gives inf as the cpu does: nothing to report.
    proc, report = doctor(SATURATES, "--no-profile", tmp_path=tmp_path)
    assert not findings(report, "float16_overflow") and report["target"]["float16_overflows"] == []


def test_the_other_chips_are_answered_from_the_same_run(tmp_path):
    proc, report = doctor(SATURATES, "--no-profile", "--also-target", "ascend310p3,ascend910a", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["target"]["target"] == "ascend910b2" and report["target"]["exact"]
    also = {v["target"]: v for v in report["also_targets"]}
    assert set(also) == {"ascend310p3", "ascend910a"}
    for v in also.values():
        assert not v["exact"] and any("ran as 'ascend910b2'" in why for why in v["not_exact"])
        assert v["float16_overflows"] == [{"file": str(tmp_path / "script.py"), "line": 4, "calls": 6}]
    assert "On Ascend310P3 (target 'ascend310p3'; answered from a run on another profile" in proc.stdout


def test_bfloat16_on_a_chip_without_it_stops_the_script_at_its_line(tmp_path):
    script = """\
    import torch
    x = torch.randn(8, 16, device="npu")
    for step in range(3):
        y = (x @ x.T).to(torch.bfloat16)
    """
    proc, report = doctor(script, "--no-profile", "--target", "ascend310p3", tmp_path=tmp_path)
    assert proc.returncode == 1 and "bfloat16 is not supported by Ascend310P3" in report["error"]
    f, = findings(report, "unsupported_dtype")
    assert f["line"] == line_of(script, "bfloat16)") and "float16" in f["remedy"] and not f["minor"]


def test_the_report_has_no_third_party_noise_and_the_same_findings_run_after_run(tmp_path):
    script = """\
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 32).cuda()
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 1).cuda()
    for step in range(10):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(loss.item())
        with torch.no_grad():
            enc.eval()(x[None])
        torch.cuda.synchronize()
    """
    runs = [doctor(script, tmp_path=tmp_path) for _ in range(2)]
    for proc, report in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = proc.stdout + proc.stderr
        assert "USDT" not in out and "PythonDispatchMode" not in out and "Warning" not in out, out[-3000:]
        assert report["target"]["steps"] == 3 and report["target"]["bound"] in ("host", "device")
    split = [sorted((f["kind"], f["line"], f["minor"]) for f in report["findings"]) for _, report in runs]
    assert split[0] == split[1]
    kinds = {k for k, *_ in split[0]}
    assert {"hidden_sync", "cpu_fallback"} <= kinds   # the reads, and the encoder's fast path on the chip
