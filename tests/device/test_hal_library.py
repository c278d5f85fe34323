"""A HAL shipped as a shared library (csrc/runtime/hal_plugin.h), loaded by NPU_HAL.

The test suite's minimal HAL is built as libnpu_hal_minimal_plugin.so (with the
runtime library, by `make build`): a device whose memory the host cannot address
and that has no kernels. Each case runs in a fresh interpreter, since NPU_HAL is
read when the npu first starts.
"""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "build" / "runtime-ext" / "libnpu_hal_minimal_plugin.so"


def run(code, **env):
    assert LIBRARY.exists(), f"{LIBRARY} is built with the extension (make build)"
    environment = {**os.environ, "NPU_HAL": str(LIBRARY), **env}
    for name in ("NPU_EMU_PROFILE", "NPU_EMU_PROTECT", "NPU_EMU_ALWAYS_ENQUEUE", "NPU_EMU_DEFER"):
        environment.pop(name, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment, capture_output=True,
                          text=True, timeout=300)


def test_the_library_is_the_device_and_ops_it_lacks_take_the_cpu_fallback():
    # The HAL answers Device::supportsOp "unsupported" for every op: each takes
    # the CPU fallback, over the HAL's own copies, and matches the cpu.
    result = run("""
        import torch, torch_npu
        assert torch_npu._C._hal_name() == "minimal", torch_npu._C._hal_name()
        assert torch.npu.device_count() == 2
        torch.manual_seed(0)
        a, b = torch.randn(4, 5), torch.randn(5, 3)
        x, y = a.npu(), b.npu()
        checks = {
            "add": ((x + 1) * 2, (a + 1) * 2),
            "mm": (torch.mm(x, y), torch.mm(a, b)),
            "softmax": (torch.softmax(x, dim=1), torch.softmax(a, dim=1)),
            "sum": (x.sum(0), a.sum(0)),
        }
        for name, (got, want) in checks.items():
            assert got.device.type == "npu", name
            torch.testing.assert_close(got.cpu(), want, msg=name)
        linear = torch.nn.Linear(5, 3)
        reference = torch.nn.Linear(5, 3)
        reference.load_state_dict(linear.state_dict())
        linear.npu()
        linear(x).sum().backward()
        reference(a).sum().backward()
        torch.testing.assert_close(linear.weight.grad.cpu(), reference.weight.grad)
        # The registry reports the HAL's answer: no npu kernel serves mm here.
        info = torch_npu._ops_registry.get("aten::mm")
        assert info.backend != "npu" and "npu" not in info.backends, info
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def test_the_librarys_copies_reach_the_profiler():
    # The profiling duty crosses the library boundary: the HAL's copies are
    # activities of the runtime's trace.
    result = run("""
        import torch, torch_npu
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            x = torch.ones(1024).npu()
            y = x.cpu()
            torch.npu.synchronize()
        names = {e.name for e in prof.events()}
        assert any("Memcpy HtoD" in n for n in names), sorted(names)
        assert any("Memcpy DtoH" in n for n in names), sorted(names)
        print("ok")
    """)
    assert result.returncode == 0, result.stderr


def test_without_op_queries_every_op_path_refuses_naming_the_op_and_the_hal():
    # NPU_MINIMAL_HAL_BASIC=1: the HAL answers no op query, so the host kernel
    # backend would compute on memory it cannot reach: each op refuses instead.
    result = run("""
        import torch, torch_npu
        x = torch.arange(6.).npu()
        assert x.cpu().tolist() == [0., 1., 2., 3., 4., 5.]   # copies need no kernel
        assert x.view(2, 3).shape == (2, 3)                      # nor do views
        cases = {
            "aten::add": lambda: x + 1,
            "aten::exp": lambda: torch.exp(x),
            "aten::mm": lambda: torch.mm(x.view(2, 3), x.view(3, 2)),
            "npu_rms_norm": lambda: torch_npu.npu_rms_norm(x.view(2, 3), torch.ones(3).npu()),
            "aten::cat": lambda: torch.cat([x, x]),
        }
        for op, call in cases.items():
            try:
                call()
            except NotImplementedError as e:
                message = str(e)
                assert op in message and "HAL 'minimal'" in message and "Remedy" in message, (op, message)
            else:
                raise AssertionError(f"{op} ran on memory the host cannot reach")
        print("ok")
    """, NPU_MINIMAL_HAL_BASIC="1")
    assert result.returncode == 0, result.stderr + result.stdout


def test_a_bad_library_path_is_reported_at_import():
    result = run("import torch_npu", NPU_HAL="/no/such/libnpu_hal_vendor.so")
    assert result.returncode != 0
    assert "NPU_HAL='/no/such/libnpu_hal_vendor.so'" in result.stderr
    assert "cannot load the HAL library" in result.stderr
