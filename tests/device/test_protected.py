"""The protected mode: NPU_EMU_PROTECT=1 closes the device's memory to the host.

The emulated npu's memory is host memory, so code above the HAL could read it
from the host and work by accident where a discrete device's memory could not be
read. In this mode the emulator opens its memory only while the device works on
it (kernels, copies, stream holds: host-executed ops, synchronous copies,
compiled kernels) and reports host_addressable = False, so such code faults.
`make test` runs models, streams, copies, compile, distributed and the doctor in
this mode (pytest-protected); these tests check the mode itself.
"""
import pytest

from helpers import last_line

PROTECTED = {"NPU_EMU_PROTECT": "1"}


@pytest.mark.child_process
def test_the_device_reports_what_the_mode_makes_it(run_python):
    code = "import torch, torch_npu; print(torch_npu._C._device_capabilities(0)['host_addressable'])"
    assert last_line(run_python(code, env=PROTECTED)) == "False"
    assert last_line(run_python(code, env={"NPU_EMU_PROTECT": "0"})) == "True"


HOST_READ = r"""
import ctypes, torch
x = torch.arange(4., device="npu")
print("through a copy", x.cpu().tolist(), flush=True)     # a copy: device work
ctypes.string_at(x.data_ptr(), 4)                          # the host itself: faults
print("read in place", flush=True)
"""


@pytest.mark.child_process
def test_a_host_read_of_device_memory_faults_with_a_message(run_python):
    proc = run_python(HOST_READ, env=PROTECTED, check=False)
    assert proc.returncode != 0 and "read in place" not in proc.stdout
    assert "through a copy [0.0, 1.0, 2.0, 3.0]" in proc.stdout
    assert "the host touched npu memory at 0x" in proc.stderr and "NPU_EMU_PROTECT=1" in proc.stderr
    unprotected = run_python(HOST_READ, env={"NPU_EMU_PROTECT": "0"}, check=False)
    assert "read in place" in unprotected.stdout   # the accident the mode exists to catch


PATHS = r"""
import torch
torch.manual_seed(0)
x = torch.randn(64, 32)
n = x.npu()
out = {}
out["kernel"] = torch.equal((n * 2 + 1).cpu(), x * 2 + 1)
out["strided copies"] = torch.equal(n.t().cpu(), x.t()) and torch.equal(n[:, ::3].double().cpu(), x[:, ::3].double())
strided = torch.zeros(32, 64, device="npu").t()
strided.copy_(torch.arange(64.).unsqueeze(1))            # a broadcast host source into a strided npu view
out["copy into a view"] = torch.equal(strided.cpu(), torch.arange(64.).unsqueeze(1).expand(64, 32))
out["dtype on the way"] = torch.equal(torch.ones(3, dtype=torch.int64).to("npu", torch.float16).cpu(), torch.ones(3).half())
out["host-executed"] = torch.equal(n[n > 0].cpu(), x[x > 0]) and torch.equal(torch.cat([n, n]).cpu(), torch.cat([x, x]))
out["item"] = (n.sum() - x.sum()).abs().item() < 1e-3
out["pinned"] = torch.equal(x.pin_memory().to("npu", non_blocking=True).cpu(), x)
out["fallback"] = torch.allclose(n.double().exp().cpu(), x.double().exp())
out["fused"] = torch.allclose(torch.ops.npu.npu_swiglu(n).cpu(), torch.ops.npu.npu_swiglu(x))
compiled = torch.compile(lambda a: (a.sin() * 2).relu().sum(1))
out["compiled"] = torch.allclose(compiled(n).cpu(), (x.sin() * 2).relu().sum(1), atol=1e-5)
print(sorted(k for k, ok in out.items() if not ok))
"""


@pytest.mark.child_process
def test_every_path_to_device_memory_works_as_device_work(run_python):
    assert last_line(run_python(PATHS, env=PROTECTED, timeout=300)) == "[]"
