"""Device profiles: the emulated npu as a real Ascend chip (identity, support set,
dtypes, numerics of the matrix unit). A profile is fixed when the npu starts, so
each chip's checks run in a fresh interpreter (helpers.run_python)."""
import json

import pytest
import torch

import torch_npu
from torch_npu._emu import profiles as _profiles

from helpers import last_line, run_python

CHIPS = ["ascend910b1", "ascend910b2", "ascend910b3", "ascend910b4", "ascend910_9391", "ascend910a", "ascend310p3"]


def run_under(profile, code, env=None, timeout=180):
    """Runs ``code`` under ``profile``; returns the JSON its last line prints."""
    proc = run_python(code, env={"NPU_EMU_PROFILE": profile, "NPU_EMU_MEMORY": None, **(env or {})},
                      timeout=timeout)
    return json.loads(last_line(proc))


# vllm-ascend's chip check (vllm_ascend/utils.py, the mapping of get_soc_version())
# and MindSpeed's, as those libraries write them.
LIBRARY_CHECKS = r"""
import json, torch, torch_npu

def vllm_ascend_soc_type():
    soc_version = torch.npu.get_soc_version()
    if 220 <= soc_version <= 225:
        return "A2"
    if 250 <= soc_version <= 255:
        return "A3"
    if 200 <= soc_version <= 205:
        return "310P"
    raise RuntimeError(f"Unsupported soc_version: {soc_version}")

try:
    vllm = vllm_ascend_soc_type()
except RuntimeError as e:
    vllm = "raises: " + str(e)
props = torch.npu.get_device_properties(0)
print(json.dumps({
    "name": torch.npu.get_device_name(), "soc": torch.npu.get_soc_version(), "vllm": vllm,
    "mindspeed_910b": "910B" in torch.npu.get_device_name(), "bf16": torch.npu.is_bf16_supported(),
    "amp": [str(d) for d in torch.npu.get_amp_supported_dtype()], "profile": torch.npu.get_profile(),
    "props": {k: getattr(props, k) for k in ("name", "total_memory", "cube_core_num", "vector_core_num",
                                             "L2_cache_size", "multi_processor_count", "clock_rate")},
}))
"""

EXPECTED_FAMILY = {"ascend910b1": "A2", "ascend910b2": "A2", "ascend910b3": "A2", "ascend910b4": "A2",
                   "ascend910_9391": "A3", "ascend310p3": "310P"}


def test_list_profiles_names_every_chip_with_one_line():
    profiles = torch.npu.list_profiles()
    assert set(CHIPS) | {"generic"} <= set(profiles)
    assert list(profiles)[0] == "generic"
    for name, line in profiles.items():
        assert line and "\n" not in line, name
    assert profiles["generic"].endswith("(active)")
    assert "Ascend910B2" in profiles["ascend910b2"]


def test_generic_is_no_chip_and_says_so():
    assert torch.npu.get_profile() == "generic"
    assert torch.npu.get_device_name() == "Emulated NPU"
    with pytest.raises(RuntimeError, match="not an Ascend chip.*NPU_EMU_PROFILE=<name>.*ascend910b2"):
        torch.npu.get_soc_version()
    props = torch.npu.get_device_properties()
    assert props.cube_core_num >= 1 and props.vector_core_num >= 1
    assert torch.npu.is_bf16_supported()
    assert torch.npu.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("chip", CHIPS)
def test_identity_is_the_chips_and_library_checks_accept_it(chip):
    got = run_under(chip, LIBRARY_CHECKS)
    data = _profiles.load(chip)
    assert got["profile"] == chip
    assert got["name"] == data.device_name == got["props"]["name"]
    assert got["soc"] == data.soc_version
    props = got["props"]
    assert props["cube_core_num"] == data.properties["cube_core_num"]
    assert props["vector_core_num"] == data.properties["vector_core_num"]
    assert props["L2_cache_size"] == data.properties["L2_cache_size"]
    assert props["total_memory"] == data.properties["total_memory"]  # NPU_EMU_MEMORY unset: the chip's
    assert got["bf16"] == data.bfloat16
    assert got["amp"] == (["torch.float16", "torch.bfloat16"] if data.bfloat16 else ["torch.float16"])
    if chip in EXPECTED_FAMILY:
        assert got["vllm"] == EXPECTED_FAMILY[chip]
    else:  # the first-generation 910 is no chip vllm-ascend supports, on real hardware too
        assert got["vllm"].startswith("raises: Unsupported soc_version: 102")
    assert got["mindspeed_910b"] == chip.startswith("ascend910b")


def test_identity_values_of_a_910b2_as_the_adapter_reports_them():
    got = run_under("ascend910b2", LIBRARY_CHECKS, env={"NPU_EMU_MEMORY": "1GiB"})
    assert got["name"] == "Ascend910B2" and got["soc"] == 221
    assert got["props"]["cube_core_num"] == 24 and got["props"]["vector_core_num"] == 48
    assert got["props"]["L2_cache_size"] == 192 * 2**20
    assert got["props"]["clock_rate"] == 1800 * 1000  # kHz, as CUDA's
    assert got["props"]["total_memory"] == 2**30  # NPU_EMU_MEMORY caps the chip's 64 GiB


def test_set_profile_before_the_first_use_and_not_after():
    got = json.loads(last_line(run_python(r"""
        import json, torch, torch_npu
        torch_npu.npu.set_profile("ascend910b3")
        name = torch.npu.get_device_name()
        torch.ones(1, device="npu")
        try:
            torch_npu.npu.set_profile("ascend910b2")
            error = None
        except RuntimeError as e:
            error = str(e)
        torch_npu.npu.set_profile("ascend910b3")  # the active one: no change, no error
        print(json.dumps({"name": name, "error": error, "active": torch.npu.list_profiles()["ascend910b3"]}))
    """, env={"NPU_EMU_PROFILE": None})))
    assert got["name"] == "Ascend910B3"
    assert "chosen before the npu starts" in got["error"] and "ascend910b3" in got["error"]
    assert got["active"].endswith("(active)")


def test_unknown_profile_is_a_clear_error():
    proc = run_python("import torch_npu", env={"NPU_EMU_PROFILE": "ascend999"}, check=False)
    assert proc.returncode != 0
    assert "NPU_EMU_PROFILE='ascend999'" in proc.stderr and "ascend910b2" in proc.stderr
    with pytest.raises(ValueError, match="no device profile named 'nope'"):
        torch_npu.npu.set_profile("nope")


# ---- the support set ----------------------------------------------------------

def test_registry_answers_for_any_profile_without_switching():
    registry = torch_npu.ops.registry
    assert registry.get("_transformer_encoder_layer_fwd").backend == "npu"  # generic: the op library has it
    chip = registry.get("_transformer_encoder_layer_fwd", profile="ascend910b2")
    assert chip.backend == "cpu" and "npu" not in chip.backends
    assert registry.get("isin.Tensor_Tensor", profile="ascend910b2").backend == "npu"
    assert registry.contains("add.Tensor", profile="ascend910b2")
    assert torch.npu.get_profile() == "generic"
    # the chip serves a subset of what generic does natively
    generic, chip = registry.summary(), registry.summary(profile="ascend910b2")
    assert chip["npu"] < generic["npu"] and chip["cpu"] > generic["cpu"]
    native = _profiles.load("ascend910b2").native_ops
    unlisted = {info.name for info in registry.list_ops("npu", profile="ascend910b2")
                if info.name.startswith("aten::") and info.name[len("aten::"):] not in native}
    # Only the adapter's core kernels, outside the op library, are native without being listed.
    assert unlisted == {"aten::_copy_from", "aten::_has_compatible_shallow_copy_type",
                        "aten::_thnn_fused_gru_cell_backward"}
    # 910A and 310P lack the aclnn-only kernels: fewer native ops than a 910B
    assert registry.summary(profile="ascend310p3")["npu"] < chip["npu"]


SUPPORT_SET = r"""
import json, torch, torch_npu
from torch_npu import NPUFallbackMode
registry = torch_npu.ops.registry
NPUFallbackMode.reset_fallback_stats()
layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).npu().eval()
with torch.no_grad():
    layer(torch.randn(2, 3, 8, device="npu"))
torch.isin(torch.arange(6, device="npu"), torch.tensor([1, 4], device="npu"))
torch.npu.synchronize()
stats = NPUFallbackMode.get_fallback_stats().ops
torch_npu.set_fallback_mode("error")
try:
    with torch.no_grad():
        layer(torch.randn(2, 3, 8, device="npu"))
    error = None
except NotImplementedError as e:
    error = str(e)
torch_npu.set_fallback_mode("auto")
print(json.dumps({"fallbacks": sorted(stats), "error": error,
                  "registry": registry.get("_transformer_encoder_layer_fwd").backend}))
"""


def test_an_op_outside_the_chips_native_set_takes_the_cpu_fallback():
    got = run_under("ascend910b2", SUPPORT_SET)
    # Ascend/pytorch issue 51: the encoder layer's fast path falls back on a real 910B
    assert got["fallbacks"] == ["aten::_transformer_encoder_layer_fwd"]
    assert got["registry"] == "cpu"
    assert "'aten::_transformer_encoder_layer_fwd' is not yet supported on npu" in got["error"]
    assert "Ascend910B2" in got["error"]


ZOO_FALLBACKS = r"""
import json, sys, torch, torch_npu
sys.path.insert(0, "examples")
import zoo
from torch.utils._python_dispatch import TorchDispatchMode
from torch_npu import NPUFallbackMode

class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = set()
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func.name())
        return func(*args, **(kwargs or {}))

def step(model, make_batch, loss_fn):
    inputs, target = make_batch(1)
    loss_fn(model(inputs), target).backward()
    torch.npu.synchronize()

result = {}
torch.manual_seed(0)
for kind in ("gpt", "resnet", "vit"):
    model, make_batch, loss_fn = zoo.build(kind, device="npu", batch=2)
    step(model, make_batch, loss_fn)  # warm up: lazy state (optimiser-free, but caches)
    NPUFallbackMode.reset_fallback_stats()
    with Ops() as ops:
        step(model, make_batch, loss_fn)
    fell_back = sorted(NPUFallbackMode.get_fallback_stats().ops)
    predicted = sorted(name for name in ops.seen if torch_npu.ops.registry.get(name).backend == "cpu")
    result[kind] = {"fell_back": fell_back, "predicted": predicted}
print(json.dumps(result))
"""


@pytest.mark.parametrize("chip", ["ascend910b2", "ascend310p3"])
def test_the_zoos_fallbacks_under_a_chip_are_the_ops_its_list_lacks(chip):
    got = run_under(chip, ZOO_FALLBACKS, timeout=300)
    for kind, seen in got.items():
        normalise = {n if "." in n else n + ".default" for n in seen["predicted"]}
        fell_back = {n if "." in n else n + ".default" for n in seen["fell_back"]}
        assert fell_back == normalise, kind
        assert not fell_back, kind  # attention decomposes where the chip lacks its kernel, as on the chip


# ---- dtypes -------------------------------------------------------------------

DTYPES = r"""
import json, warnings, torch, torch_npu
from torch_npu import NPUFallbackMode
out = {}
try:
    torch.ones(2, device="npu").to(torch.bfloat16)
    out["bf16"] = "ok"
except TypeError as e:
    out["bf16"] = str(e)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.autocast("npu", dtype=torch.bfloat16):
        pass
out["autocast"] = [str(w.message) for w in caught]
NPUFallbackMode.reset_fallback_stats()
x = torch.ones(3, dtype=torch.float64, device="npu")
(x * 2).sum().item()
out["f64_fallbacks"] = sorted(NPUFallbackMode.get_fallback_stats().ops)
big = torch.tensor([40000.0, -40000.0, float("nan"), 1.0], dtype=torch.float16, device="npu")
out["mul"] = (big * 2).cpu().tolist()
y = big.clone(); y.add_(big)
out["add_"] = y.cpu().tolist()
a = torch.full((4, 4), 300.0, dtype=torch.float16, device="npu")
out["mm"] = (a @ a).cpu()[0, 0].item()
out["exp"] = torch.tensor([20.0], dtype=torch.float16, device="npu").exp().cpu().item()
print(json.dumps(out))
"""


def test_chips_without_bf16_refuse_it_and_saturate_float16_overflow():
    got = run_under("ascend910a", DTYPES)
    assert "bfloat16 is not supported by Ascend910A (device profile 'ascend910a')" in got["bf16"]
    assert "is_bf16_supported() is False" in got["bf16"]
    assert any("target dtype is not supported" in m and "torch.float16" in m for m in got["autocast"])
    assert got["f64_fallbacks"]  # float64 has no AI-core kernels on any chip
    assert got["mul"][:2] == [65504.0, -65504.0] and got["mul"][2] != got["mul"][2] and got["mul"][3] == 2.0
    assert got["add_"][:2] == [65504.0, -65504.0]
    assert got["mm"] == 65504.0 and got["exp"] == 65504.0


def test_chips_with_inf_nan_give_inf_as_the_cpu_does():
    got = run_under("ascend910b2", DTYPES)
    assert got["bf16"] == "ok" and not got["autocast"]
    assert got["f64_fallbacks"]
    inf = float("inf")
    assert got["mul"][:2] == [inf, -inf] and got["add_"][:2] == [inf, -inf]
    assert got["mm"] == inf and got["exp"] == inf


# ---- the matrix unit: float32 accumulation, one rounding ------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_matrix_products_accumulate_in_float32_and_round_once(dtype):
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(33, 70, generator=gen).to(dtype), torch.randn(70, 21, generator=gen).to(dtype)
    bias = torch.randn(21, generator=gen).to(dtype)
    a3, b3 = torch.randn(3, 9, 40, generator=gen).to(dtype), torch.randn(3, 40, 5, generator=gen).to(dtype)
    c3 = torch.randn(3, 9, 5, generator=gen).to(dtype)

    def cube(fn, *args):  # the chip's result: float32 operands, float32 result rounded once
        return fn(*(t.float() for t in args)).to(dtype)

    cases = [
        (torch.mm, (a, b)),
        (torch.bmm, (a3, b3)),
        (lambda x, y, z: torch.addmm(z, x, y), (a, b, bias)),
        (lambda x, y, z: torch.baddbmm(z, x, y), (a3, b3, c3)),
        (torch.matmul, (a3, b3)),
        (lambda x, w, z: torch.nn.functional.linear(x, w.t(), z), (a, b, bias)),
    ]
    for fn, args in cases:
        got = fn(*(t.npu() for t in args)).cpu()
        assert got.dtype == dtype
        torch.testing.assert_close(got, cube(fn, *args), rtol=0, atol=0)
        # and within the dtype's tolerance of ATen's own cpu kernel
        torch.testing.assert_close(got, fn(*args))
    out = torch.empty(33, 21, dtype=dtype, device="npu")
    torch.mm(a.npu(), b.npu(), out=out)
    torch.testing.assert_close(out.cpu(), cube(torch.mm, a, b), rtol=0, atol=0)
    acc = bias.expand(33, 21).contiguous().npu()
    acc.addmm_(a.npu(), b.npu())
    torch.testing.assert_close(acc.cpu(), cube(lambda x, y, z: torch.addmm(z, x, y), a, b, bias), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_convolution_and_its_gradients_compute_in_float32(dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 9, 9, generator=gen).to(dtype)
    w = torch.randn(4, 3, 3, 3, generator=gen).to(dtype)
    xn, wn = x.npu().requires_grad_(), w.npu().requires_grad_()
    y = torch.nn.functional.conv2d(xn, wn, padding=1)
    ref = torch.nn.functional.conv2d(x.float(), w.float(), padding=1)
    torch.testing.assert_close(y.detach().cpu(), ref.to(dtype), rtol=0, atol=0)
    y.sum().backward()
    xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
    torch.nn.functional.conv2d(xf, wf, padding=1).backward(torch.ones_like(ref))
    torch.testing.assert_close(xn.grad.cpu(), xf.grad.to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(wn.grad.cpu(), wf.grad.to(dtype), rtol=0, atol=0)


DOCTOR = r"""
import json, torch, torch_npu
from torch_npu.doctor import Doctor
layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).npu().eval()
with Doctor(profile=False) as d:
    for _ in range(3):
        with torch.no_grad():
            layer(torch.randn(2, 3, 8, device="npu"))
        d.step()
print(json.dumps({"report": str(d.report()), "remedies": [f.remedy for f in d.findings if f.kind == "cpu_fallback"]}))
"""


def test_the_doctor_reports_the_chips_fallbacks_and_where_the_op_is_native():
    got = run_under("ascend910b2", DOCTOR)
    assert "(Ascend910B2)" in got["report"]
    [remedy] = got["remedies"]
    assert remedy.startswith("Ascend910B2 (device profile 'ascend910b2') has no native kernel for "
                             "aten::_transformer_encoder_layer_fwd")
    assert "No Ascend chip profile runs it natively" in remedy


SATURATION_DETAILS = r"""
import json, torch, torch_npu
out = {}
x = torch.tensor([float("inf"), 1.0, float("-inf"), 2.0], dtype=torch.float16).npu()  # stored infs stay
y = x.clone(); y.index_fill_(0, torch.tensor([1], device="npu"), 5.0)
out["index_fill_"] = y.cpu().tolist()
z = x.clone(); z[torch.tensor([False, True, False, False], device="npu")] = 3.0
out["index_put_"] = z.cpu().tolist()
out["half"] = torch.tensor([1e6, -1e6, 1.0], device="npu").half().cpu().tolist()
h = torch.zeros(2, dtype=torch.float16, device="npu"); h.copy_(torch.tensor([1e6, 2.0], device="npu"))
out["copy_"] = h.cpu().tolist()
out["to_host_data"] = torch.tensor([1e6]).to("npu", torch.float16).cpu().tolist()
# GradScaler: a saturated overflow is an overflow (the chip's flag), so the step is skipped
model = torch.nn.Linear(4, 4).npu()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("npu", init_scale=2.0 ** 10)
before = model.weight.detach().cpu().clone()
with torch.autocast("npu", dtype=torch.float16):
    loss = model(torch.full((1000, 4), 100.0, device="npu")).float().sum()
scaler.scale(loss).backward()
scaler.step(opt)
scaler.update()
out["scale"] = scaler.get_scale()
out["stepped"] = not torch.equal(before, model.weight.detach().cpu())
print(json.dumps(out))
"""


@pytest.mark.parametrize("chip", ["ascend910a", "ascend910b2"])
def test_saturation_covers_conversions_spares_stored_infs_and_trips_the_grad_scaler(chip):
    got = run_under(chip, SATURATION_DETAILS)
    inf, big = float("inf"), 65504.0
    assert got["index_fill_"] == [inf, 5.0, -inf, 2.0]   # infs the kernel did not write stay
    assert got["index_put_"] == [inf, 3.0, -inf, 2.0]
    saturates = chip == "ascend910a"
    edge = big if saturates else inf
    assert got["half"] == [edge, -edge, 1.0]
    assert got["copy_"] == [edge, 2.0] and got["to_host_data"] == [edge]
    assert got["scale"] == 512.0 and not got["stepped"]  # the overflow skips the step on both


CHIP_BEHAVIOUR = r"""
import json, warnings, torch, torch_npu
from torch_npu import NPUFallbackMode
out = {}
torch_npu.set_fallback_mode("error")
q = torch.randn(1, 2, 4, 8, device="npu", requires_grad=True)
torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
c = torch.view_as_complex(torch.randn(4, 2, device="npu"))  # a view: metadata, native on every chip
out["view_as_real"] = list(torch.view_as_real(c).shape)
cell = torch.nn.LSTMCell(4, 4).npu()
h, _ = cell(torch.randn(2, 4, device="npu"))
h.sum().backward()
torch_npu.set_fallback_mode("auto")
reg = torch_npu.ops.registry
out["registry"] = {op: reg.get(op).backend for op in
                   ("_thnn_fused_lstm_cell", "_copy_from", "view_as_real", "heaviside", "gelu",
                    "_scaled_dot_product_flash_attention_for_cpu")}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.autocast("npu", dtype=torch.bfloat16):
        pass
out["autocast"] = [str(w.message) for w in caught]
try:
    torch_npu.npu.set_profile(torch.npu.get_profile())  # the active one: no error
    out["same"] = "ok"
except RuntimeError as e:
    out["same"] = str(e)
print(json.dumps(out))
"""


def test_a_chip_without_the_attention_kernel_decomposes_attention_and_keeps_core_kernels():
    got = run_under("ascend310p3", CHIP_BEHAVIOUR)
    assert got["view_as_real"] == [4, 2]
    assert got["registry"] == {"_thnn_fused_lstm_cell": "npu", "_copy_from": "npu", "view_as_real": "npu",
                               "heaviside": "cpu", "gelu": "composite",
                               "_scaled_dot_product_flash_attention_for_cpu": "cpu"}
    assert any("Ascend310P3 (device profile 'ascend310p3') has no bfloat16 units" in m for m in got["autocast"])
    assert got["same"] == "ok"


def test_set_profile_generic_after_the_first_use_is_no_change():
    out = last_line(run_python("""
        import torch, torch_npu
        torch.ones(1, device="npu")
        torch_npu.npu.set_profile("generic")
        print("ok")
    """, env={"NPU_EMU_PROFILE": None}))
    assert out == "ok"


def test_set_profile_reaches_child_processes():
    out = last_line(run_python("""
        import subprocess, sys, torch_npu
        torch_npu.npu.set_profile("ascend910b4")
        print(subprocess.run([sys.executable, "-c", "import torch; import torch_npu; print(torch.npu.get_device_name())"],
                             capture_output=True, text=True).stdout.strip())
    """, env={"NPU_EMU_PROFILE": None}))
    assert out == "Ascend910B4"


@pytest.mark.parametrize("bad, message", [
    ('[dtypes]\nbfloat16 = "yes"\n', "must be true or false"),
    ('[ops]\nnative = "ascend_native_ops_v2.13.tsv"\nkernel_families = ["aclnx"]\n', "unknown kernel_families aclnx"),
    ('[identiy]\ndevice_name = "X"\n', "unknown key(s) identiy"),
])
def test_a_bad_profile_file_is_a_clear_error(tmp_path, monkeypatch, bad, message):
    (tmp_path / "mychip.toml").write_text(f'name = "mychip"\ndescription = "test"\n{bad}')
    monkeypatch.setattr(_profiles, "PROFILE_DIR", str(tmp_path))
    _profiles.load.cache_clear()
    try:
        with pytest.raises(ValueError, match=re_escape(message)):
            _profiles.load("mychip")
    finally:
        _profiles.load.cache_clear()


def re_escape(text):
    import re
    return re.escape(text)


TARGET_SCRIPT = """\
import torch
x = torch.randn(64, device="npu")
edges = torch.linspace(-1, 1, 5, device="npu")
for _ in range(8):
    y = torch.bucketize(x, edges)
    x = x * 0.5 + 0.1
print(int(y.sum()))
"""


def test_the_doctor_ends_with_the_target_chips_verdict(tmp_path):
    script = tmp_path / "bucket.py"
    script.write_text(TARGET_SCRIPT)
    out = tmp_path / "report.json"
    proc = run_python(f"""
        import sys
        from torch_npu.doctor.__main__ import main
        sys.exit(main(["--no-progress", "--target", "ascend310p3", "--json", {str(out)!r}, {str(script)!r}]))
    """, env={"NPU_EMU_PROFILE": None}, timeout=300)
    # The script ran as the target: its fallbacks are the chip's, found in the run.
    assert "On Ascend310P3 (target 'ascend310p3'; the run emulated it" in proc.stdout
    assert "falls back to the CPU there" in proc.stdout and "aten::bucketize.Tensor: 8 calls" in proc.stdout
    assert "bucket.py:5 (8)" in proc.stdout
    report = json.loads(out.read_text())
    verdict = report["target"]
    assert verdict["target"] == "ascend310p3" and verdict["device_name"] == "Ascend310P3" and verdict["exact"]
    [fallback] = [f for f in verdict["fallbacks"] if f["op"] == "aten::bucketize.Tensor"]
    assert fallback["here"] == "cpu" and fallback["sites"][0]["line"] == 5
    [finding] = [f for f in report["findings"] if f["kind"] == "cpu_fallback"]
    assert finding["line"] == 5 and finding["details"]["op"] == "aten::bucketize.Tensor"
    if verdict["steps"]:   # the profiled window projected onto the target
        assert verdict["bound"] in ("host", "device") and verdict["kernels_per_step"] > 0
    none = run_python(f"""
        import sys
        from torch_npu.doctor.__main__ import main
        sys.exit(main(["--no-progress", "--target", "none", {str(script)!r}]))
    """, env={"NPU_EMU_PROFILE": None}, timeout=300)
    assert "(target '" not in none.stdout
    bad = run_python(f"""
        import sys
        from torch_npu.doctor.__main__ import main
        sys.exit(main(["--target", "ascend999", {str(script)!r}]))
    """, env={"NPU_EMU_PROFILE": None}, check=False)
    assert bad.returncode == 2 and "--target: torch_npu: no device profile named 'ascend999'" in bad.stderr


def test_the_cost_model_is_validated_on_other_measurements_than_its_calibration():
    import pathlib
    import re as _re
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "cost_model.md").read_text()
    table = doc.split("<!-- validation table: benchmarks/validate_cost_model.py -->")[1].split(
        "<!-- end of the validation table -->")[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    sources = torch_npu._emu.profiles.sources()
    calibrated, validated = {}, []
    for role, measurement, published, projected, error, source in rows:
        key = _re.search(r"\[([a-z0-9-]+)\]\(", source).group(1)
        assert key in sources, key
        figure = _re.search(r"calibrates `(\w+)`", role)
        if figure:
            calibrated[figure.group(1)] = (key, measurement)
        else:
            assert role.strip("| ") == "validation"
            validated.append((key, measurement))
    # Never validated on the measurement a figure was calibrated on.
    assert not set(calibrated.values()) & set(validated)
    assert len(validated) >= 20
    # Each figure a profile calls calibrated has its calibration row, from the source it names.
    for name in torch_npu._emu.profiles.names():
        for figure, f in (torch_npu._emu.profiles.load(name).cost_figures or {}).items():
            if f.basis == "calibrated":
                assert figure in calibrated and calibrated[figure][0] == f.source, (name, figure)
            assert f.source in sources and f.figure
