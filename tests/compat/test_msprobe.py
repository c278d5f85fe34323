"""mindstudio-probe (msprobe), Ascend's accuracy tool, on the npu.

Its PrecisionDebugger dumps one training step at API level (L1) on the npu and the same
step on the cpu; `msprobe compare` between the two finds them equal for every API; and
with one op planted wrong on the npu (aten::gelu overridden for the npu through
torch.library) the comparison flags that API and none before it.

Each dump runs in its own process (this file, run as a script): msprobe patches torch's
API table process-wide while it dumps, and names a dump's folder after the process.

The Ascend adapter's names msprobe calls besides torch.npu's usual ones are tested here too,
with or without msprobe: torch_npu.utils.storage._rebuild_npu_tensor (it allows it in
torch.load(weights_only=True)) and the overflow-status names of its overflow check.
"""
import collections
import csv
import glob
import json
import os
import subprocess
import sys

import pytest
import torch

import torch_npu

HERE = os.path.abspath(__file__)


# --- the step, run as a script: python tests/compat/test_msprobe.py DEVICE DUMP_DIR [--plant] -------------------------

def _model(torch):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(16)
            self.up = torch.nn.Linear(16, 32)
            self.down = torch.nn.Linear(32, 16)
            self.head = torch.nn.Linear(16, 5)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.up(self.norm(x)))
            x = x + self.down(h)          # a residual: Tensor.__add__
            return self.head(x.relu())

    return Block()


def _dump_one_step(device, dump_dir, plant):
    import torch
    import torch_npu  # noqa: F401
    from msprobe.pytorch import PrecisionDebugger

    # The same model and data on both devices: made by the cpu's generator alone, then moved;
    # the npu's generator is seeded by itself (nothing in this step draws from it).
    torch.random.default_generator.manual_seed(0)
    model = _model(torch)
    x, target = torch.randn(8, 16), torch.randint(0, 5, (8,))
    if device.startswith("npu"):
        torch.npu.manual_seed(0)
    model, x, target = model.to(device), x.to(device), target.to(device)
    # foreach=False: the same optimizer ops on both devices (the npu, like CUDA, would take
    # torch._foreach_*, which msprobe does not hook, where the cpu loops over Tensor.add_)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)

    config = {"task": "tensor", "dump_path": dump_dir, "rank": [], "step": [], "level": "L1",
              "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
    os.makedirs(dump_dir, exist_ok=True)
    config_path = os.path.join(dump_dir, "config.json")
    with open(config_path, "w") as f:
        json.dump(config, f)

    planted = None
    if plant:
        # A wrong npu gelu kernel (ours stays registered underneath; destroying the library restores it).
        planted = torch.library.Library("aten", "IMPL")

        def wrong_gelu(t, approximate="none"):
            right = torch.ops.aten.gelu.default(t.cpu(), approximate=approximate)
            return (right + 0.5 * torch.cos(7 * t.cpu())).to(t.device)

        planted.impl("gelu", wrong_gelu, "PrivateUse1")

    debugger = PrecisionDebugger(config_path=config_path)
    debugger.start()
    loss = torch.nn.functional.cross_entropy(model(x), target)
    loss.backward()
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()
    if planted is not None:
        planted._destroy()
    print(f"loss {loss.item():.6f}")


# --- the tests -------------------------------------------------------------------------------------------------

def _dump(device, dump_dir, plant=False):
    cmd = [sys.executable, HERE, device, str(dump_dir)] + (["--plant"] if plant else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the {device} dump failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    [dump_json] = glob.glob(os.path.join(dump_dir, "step0", "*", "dump.json"))
    with open(dump_json) as f:
        dump = json.load(f)
    assert dump["level"] == "L1" and dump["task"] == "tensor"
    return dump_json, dump


def _compare(target_json, golden_json, out_dir):
    """`msprobe compare`, the command line Ascend documents; returns the result's rows."""
    msprobe_cli = os.path.join(os.path.dirname(sys.executable), "msprobe")
    cmd = ([msprobe_cli] if os.path.exists(msprobe_cli) else [sys.executable, "-m", "msprobe.msprobe"])
    cmd += ["compare", "-tp", target_json, "-gp", golden_json, "-o", str(out_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"msprobe compare failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    [result] = glob.glob(os.path.join(out_dir, "compare_result_*.csv"))
    with open(result, newline="") as f:
        return list(csv.DictReader(f))


def _num(value):
    """A number of the result, or None where msprobe has none ("N/A", "unsupported": a scalar, a 0-dim tensor's
    cosine, a None gradient)."""
    try:
        return float(value)
    except ValueError:
        return None


def _api(row):
    return row["NPU Name"].split(".forward")[0].split(".backward")[0]


@pytest.fixture(scope="module")
def msprobe_imports():
    """msprobe importable in a fresh process (importing it here could change this process's torch)."""
    probe = subprocess.run([sys.executable, "-c", "import torch_npu; from msprobe.pytorch import PrecisionDebugger"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip("mindstudio-probe (msprobe) cannot be imported (`pip install mindstudio-probe`; make test "
                    f"installs it): {probe.stderr.strip().splitlines()[-1:]}")


@pytest.fixture(scope="module")
def dumps(msprobe_imports, tmp_path_factory):
    root = tmp_path_factory.mktemp("msprobe")
    return {name: _dump(device, root / name, plant)
            for name, device, plant in (("npu", "npu", False), ("cpu", "cpu", False), ("planted", "npu", True))}, root


def test_npu_dump_at_api_level(dumps):
    (npu_json, npu), (_, cpu) = dumps[0]["npu"], dumps[0]["cpu"]
    names = list(npu["data"])
    for api in ("Functional.layer_norm.0", "Functional.linear.0", "Functional.gelu.0", "Tensor.__add__.0",
                "Tensor.relu.0", "Functional.cross_entropy.0", "Tensor.add_.0"):
        assert f"{api}.forward" in names, (api, names)
    assert "Functional.gelu.0.backward" in names and "Functional.linear.0.backward" in names
    assert names == list(cpu["data"]), "the npu and the cpu ran different APIs"
    gelu_out = npu["data"]["Functional.gelu.0.forward"]["output"][0]
    assert gelu_out["shape"] == [8, 32] and gelu_out["dtype"] == "torch.float32"
    tensors = os.path.join(os.path.dirname(npu_json), "dump_tensor_data")
    assert os.path.isfile(os.path.join(tensors, "Functional.gelu.0.forward.output.0.pt"))


def test_compare_npu_with_cpu_agrees_for_every_api(dumps):
    (npu_json, _), (cpu_json, cpu) = dumps[0]["npu"], dumps[0]["cpu"]
    rows = _compare(npu_json, cpu_json, dumps[1] / "same")
    compared = {_api(r) for r in rows}
    assert compared >= {name.rsplit(".", 1)[0] for name in cpu["data"]}, compared
    tensors = [r for r in rows if r["NPU Dtype"].startswith("torch.")]
    assert len(tensors) >= 60, len(tensors)
    for row in rows:
        assert row["Result"] == "pass", row
    for row in tensors:
        cosine, max_abs = _num(row["Cosine"]), _num(row["MaxAbsErr"])
        assert max_abs is not None and max_abs < 1e-5, row
        assert cosine is not None and cosine > 0.99999 or row["NPU Tensor Shape"] == "[]", row


def test_compare_finds_the_planted_wrong_op(dumps):
    (planted_json, _), (cpu_json, _) = dumps[0]["planted"], dumps[0]["cpu"]
    rows = _compare(planted_json, cpu_json, dumps[1] / "planted")
    bad = [r for r in rows if r["Result"] not in ("pass", "")]
    assert bad, "the compare flagged nothing"
    first = bad[0]
    assert first["NPU Name"] == "Functional.gelu.0.forward.output.0", first
    assert _num(first["Cosine"]) < 0.99 and _num(first["MaxAbsErr"]) > 0.1, first
    # msprobe blames the op whose inputs agree and output does not: gelu, not the ops downstream of it
    assert [r["NPU Name"] for r in rows if r["Result"] == "error"] == ["Functional.gelu.0.forward.output.0"]
    linear_after = next(r for r in rows if r["NPU Name"] == "Functional.linear.1.forward.input.0")
    assert _num(linear_after["Cosine"]) < 0.99 and linear_after["Result"] == "pass", linear_after
    # everything the step ran before gelu, and gelu's own input, still agrees
    gelu_input = next(r for r in rows if r["NPU Name"] == "Functional.gelu.0.forward.input.0")
    assert gelu_input["Result"] == "pass" and _num(gelu_input["Cosine"]) > 0.99999, gelu_input
    assert all(r["Result"] == "pass" for r in rows[:rows.index(first)])


def test_acc_check_reruns_each_dumped_api_on_the_npu_against_the_cpu(dumps):
    """`msprobe acc_check` runs every API of the npu's dump again, from its saved tensors, on the npu and
    on the cpu in float64, and judges each forward and backward."""
    npu_json, npu = dumps[0]["npu"]
    out = dumps[1] / "acc_check"
    msprobe_cli = os.path.join(os.path.dirname(sys.executable), "msprobe")
    cmd = ([msprobe_cli] if os.path.exists(msprobe_cli) else [sys.executable, "-m", "msprobe.msprobe"])
    done = subprocess.run(cmd + ["acc_check", "-api_info", npu_json, "-o", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    [result] = glob.glob(os.path.join(out, "accuracy_checking_result_*.csv"))
    with open(result, newline="", encoding="utf-8-sig") as f:
        rows = {r["API name"]: r for r in csv.DictReader(f)}
    forwards = {name.rsplit(".", 1)[0] for name in npu["data"] if name.endswith(".forward")}
    assert set(rows) == forwards, set(rows) ^ forwards
    for name, row in rows.items():
        assert row["Forward Test Success"] == "pass", row
        assert row["Backward Test Success"].strip() in ("pass", ""), row   # the optimizer's add_ has none
    assert rows["Functional.gelu.0"]["Backward Test Success"] == "pass"


def test_torch_npu_fused_ops_are_dumped_as_npu_apis(msprobe_imports, tmp_path):
    """msprobe hooks the torch_npu.npu_* ops it knows (its "NPU" API type) on our package too."""
    script = f"""
import json, os, torch, torch_npu
from msprobe.pytorch import PrecisionDebugger
out = {str(tmp_path)!r}
config = os.path.join(out, "config.json")
json.dump({{"task": "statistics", "dump_path": out, "level": "L1",
           "statistics": {{"scope": [], "list": [], "data_mode": ["all"]}}}}, open(config, "w"))
x, gamma = torch.randn(2, 8, device="npu", requires_grad=True), torch.ones(8, device="npu")
debugger = PrecisionDebugger(config_path=config)
debugger.start()
y, rstd = torch_npu.npu_rms_norm(x, gamma)
y.sum().backward()
debugger.stop()
debugger.step()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    [dump_json] = glob.glob(os.path.join(tmp_path, "step0", "*", "dump.json"))
    with open(dump_json) as f:
        data = json.load(f)["data"]
    assert "NPU.npu_rms_norm.0.forward" in data and "NPU.npu_rms_norm.0.backward" in data, list(data)
    assert data["NPU.npu_rms_norm.0.forward"]["output"][0]["shape"] == [2, 8]


# --- the Ascend adapter's names that msprobe calls -------------------------------------------------------------

class _LegacyNpuTensor:
    """Pickles as the Ascend adapter did for torch before 2.1: through _rebuild_npu_tensor."""

    def __init__(self, values, npu_storage_info):
        self.values, self.info = values, npu_storage_info

    def __reduce_ex__(self, protocol):
        from torch_npu.utils.storage import _rebuild_npu_tensor
        v = self.values
        return (_rebuild_npu_tensor, (v.storage(), v.storage_offset(), v.size(), v.stride(),
                                      True, collections.OrderedDict(), self.info))


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("info", [True, int(torch_npu.Format.FRACTAL_NZ)])
def test_legacy_npu_tensor_files_load_with_weights_only(tmp_path, info):
    from torch_npu.utils.storage import _rebuild_npu_tensor
    values = torch.arange(12.0).reshape(3, 4).t()     # a strided view: offset and strides travel
    path = tmp_path / "legacy.pt"
    torch.save({"w": _LegacyNpuTensor(values, info)}, path)
    with pytest.raises(Exception, match="_rebuild_npu_tensor"):
        torch.load(path, weights_only=True)           # not allowed until added, as msprobe does
    with torch.serialization.safe_globals([_rebuild_npu_tensor]):
        w = torch.load(path, weights_only=True)["w"]
    assert w.device.type == "npu" and w.requires_grad and w.stride() == values.stride()
    torch.testing.assert_close(w.detach().cpu(), values, rtol=0, atol=0)
    expected = torch_npu.Format.FRACTAL_NZ if info is not True else torch_npu.Format.ND
    assert torch_npu.get_npu_format(w) == expected


def test_overflow_names_on_a_chip_with_inf_nan():
    if not torch_npu.npu.utils.is_support_inf_nan():
        pytest.skip(f"profile {torch.npu.get_profile()!r} saturates: test_overflow_flag_on_a_saturating_chip's case")
    assert torch.npu.is_support_inf_nan()
    check = torch_npu.npu.utils.npu_check_overflow
    assert check(torch.tensor([1.0, float("inf")], device="npu"))
    assert check(torch.tensor([float("nan")], device="npu", dtype=torch.float16))
    assert not check(torch.ones(3, device="npu")) and not check(2.5) and check(float("-inf"))
    with pytest.raises(TypeError, match="tensor or a float"):
        check("inf")
    torch.npu.clear_npu_overflow_flag()               # nothing to clear: no error
    with pytest.raises(RuntimeError, match="npu_check_overflow"):
        torch.npu.get_npu_overflow_flag()


def test_overflow_flag_on_a_saturating_chip():
    script = """
import torch, torch_npu
from torch_npu.npu import utils
assert not utils.is_support_inf_nan()
assert not utils.get_npu_overflow_flag()
x = torch.full((4,), 60000.0, dtype=torch.float16, device="npu")
y = x * 2                                          # saturates to 65504 and raises the flag
assert y.max().item() == 65504.0
assert utils.get_npu_overflow_flag() and utils.get_npu_overflow_flag()   # reading does not lower it
found = torch.zeros(1, device="npu")                 # nor hide it from GradScaler's unscale
torch._amp_foreach_non_finite_check_and_unscale_([torch.ones(2, device="npu")], found, torch.ones(1, device="npu"))
assert found.item() == 1.0 and not utils.get_npu_overflow_flag()
y = x * 2
torch.npu.clear_npu_overflow_flag()
assert not utils.get_npu_overflow_flag()
assert not utils.npu_check_overflow(x + 1)
z = x + x
assert utils.npu_check_overflow(z) and not utils.npu_check_overflow(z)   # read and lowered
print("ok")
"""
    env = dict(os.environ, NPU_EMU_PROFILE="ascend910a")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


if __name__ == "__main__":
    _dump_one_step(sys.argv[1], sys.argv[2], plant="--plant" in sys.argv[3:])
