"""torch_npu.contrib.transfer_to_npu: a script written for CUDA runs on the npu
unchanged and computes what the cpu computes."""


CUDA_STYLE_SCRIPT = """
import torch
import torch_npu.contrib.transfer_to_npu
from torch.profiler import ProfilerActivity, profile

assert torch.cuda.is_available() and torch.cuda.device_count() >= 1
torch.manual_seed(0)
reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
model.load_state_dict(reference.state_dict())
model = model.cuda()
device = torch.device("cuda:0")
data = torch.randn(4, 8)
x = data.cuda()
y = torch.ones(4, 8, device="cuda") + torch.zeros(4, 8).to(device) + x.new_zeros(4, 8)
out = model(x + y)
out.sum().backward()
torch.cuda.synchronize()
assert out.device.type == "npu" and model[0].weight.grad.device.type == "npu", out.device
expected = reference(data + 1)
expected.sum().backward()
torch.testing.assert_close(out.cpu(), expected)
torch.testing.assert_close(model[0].weight.grad.cpu(), reference[0].weight.grad)
assert torch.cuda.memory_allocated() > 0 and torch.cuda.current_device() == 0
torch.cuda.manual_seed(1)
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    z = x * 2
torch.cuda.current_stream().wait_stream(stream)
torch.testing.assert_close(z.cpu(), data * 2)
gen = torch.Generator(device="cuda").manual_seed(3)
assert gen.device.type == "npu" and isinstance(gen, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
picks = torch.randint(0, 100, (5,), device="cuda", generator=gen)
assert torch.equal(picks, torch.randint(0, 100, (5,), device="npu", generator=torch.Generator("npu").manual_seed(3)))

@torch.jit.script
def scripted(t: torch.Tensor) -> torch.Tensor:
    return t + torch.ones(t.shape, device=t.device)
torch.testing.assert_close(scripted(x).cpu(), data + 1)

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    model(x)
    torch.cuda.synchronize()
addmm = [e for e in prof.key_averages() if e.key == "aten::addmm"][0]
assert addmm.device_time_total > 0

scaler = torch.cuda.amp.GradScaler()
with torch.autocast("cuda", dtype=torch.float16):
    half = model(x)
with torch.cuda.amp.autocast():
    assert model(x).dtype == torch.float16
assert half.dtype == torch.float16 and torch.is_autocast_enabled("npu") is False
scaler.scale(half.float().sum()).backward()
assert torch.amp.GradScaler("cuda").get_scale() == 65536.0 and scaler.get_scale() == 65536.0
assert torch.amp.GradScaler()._device == "npu"      # its default device, "cuda", means the npu
print("CUDA script OK")
"""


def test_a_cuda_style_script_runs_unchanged_on_the_npu(run_python, tmp_path):
    script = tmp_path / "cuda_script.py"  # a file: torch.jit.script reads its source
    script.write_text(CUDA_STYLE_SCRIPT)
    proc = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert "CUDA script OK" in proc.stdout


def test_save_on_cuda_load_with_map_location_cuda(run_python, tmp_path):
    proc = run_python(f"""
        import torch
        import torch_npu.contrib.transfer_to_npu
        path = {str(tmp_path / "t.pt")!r}
        torch.save(torch.arange(6.0).cuda(), path)
        loaded = torch.load(path, map_location="cuda")
        assert loaded.device.type == "npu"
        torch.testing.assert_close(loaded.cpu(), torch.arange(6.0))
        print("OK")
    """)
    assert "OK" in proc.stdout
