"""DeepSpeed on the npu: its own detection picks the NPU accelerator (import torch_npu, no
DS_ACCELERATOR), every torch.npu name the accelerator calls answers, and ZeRO stages 1, 2 and 3
train on 2 ranks over "hccl" (torchrun, NPU_EMU_DEVICES=2) to the parameters of one process
training on the whole batch: float32 within 1e-5, bfloat16 within one bfloat16 step of a
bfloat16-model/float32-master-weights reference (tests/distributed/deepspeed_zero.py)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_npu  # noqa: F401

try:
    import deepspeed  # noqa: F401
except Exception as e:  # ImportError, or a DeepSpeed that fails while importing
    pytest.skip(f"deepspeed is not importable ({type(e).__name__}: {e}); `make .venv/.clients` installs it",
                allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))


def _env(tmp_path):
    env = dict(os.environ, NPU_EMU_DEVICES="2", OMP_NUM_THREADS="1")
    env.pop("DS_ACCELERATOR", None)          # DeepSpeed's auto-detection, as on an Ascend machine
    # DeepSpeed's NPU op builders read ASCEND_HOME_PATH (CANN's set_env.sh sets it) and raise
    # KeyError without it; the emulator has no CANN, so it names an empty directory.
    env.setdefault("ASCEND_HOME_PATH", str(tmp_path))
    return env


def _run(code, tmp_path):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    return proc.stdout


def test_deepspeed_detects_the_npu_and_its_calls_answer(tmp_path):
    out = _run("""
        import torch
        import torch_npu
        from deepspeed.accelerator import get_accelerator
        a = get_accelerator()
        assert type(a).__name__ == "NPU_Accelerator", type(a)
        assert a.device_name() == "npu" and a.device_name(1) == "npu:1"
        assert a.communication_backend_name() == "hccl"
        assert a.is_available() and a.device_count() == 2
        a.set_device(1)
        assert a.current_device() == 1 and a.current_device_name() == "npu:1"
        assert a.device(0) == torch.device("npu", 0)
        a.manual_seed_all(5)
        state = a.get_rng_state()
        first = torch.randn(4, device="npu:1")
        a.set_rng_state(state)
        assert torch.equal(first, torch.randn(4, device="npu:1"))
        seen = []
        a.lazy_call(lambda: seen.append(a.default_generator(1).initial_seed()))
        assert seen == [5], seen
        s = a.Stream()
        with a.stream(s):
            t = a.FloatTensor(3).fill_(2.0)
        e = a.Event(); e.record(s); e.synchronize(); a.synchronize()
        assert t.device == torch.device("npu", 1) and t.dtype == torch.float32 and t.sum().item() == 6.0
        for name, dtype in [("BFloat16Tensor", torch.bfloat16), ("HalfTensor", torch.float16),
                            ("LongTensor", torch.int64), ("IntTensor", torch.int32),
                            ("ByteTensor", torch.uint8), ("DoubleTensor", torch.float64)]:
            assert getattr(a, name)(2).dtype == dtype, name
        assert a.on_accelerator(t) and not a.on_accelerator(torch.ones(1))
        assert a.memory_allocated() > 0 and a.max_memory_allocated() >= a.memory_allocated()
        assert a.total_memory() > a.available_memory() > 0
        assert a.memory_stats()["allocated_bytes.all.current"] == a.memory_allocated()
        assert a.is_bf16_supported() is True
        g = a.create_graph()
        x = torch.ones(4, device="npu:1")
        with a.capture_to_graph(g):
            y = x * 3
        x.fill_(2.0); a.replay_graph(g)
        assert y.tolist() == [6.0] * 4
        # Host-memory registration (DeepSpeed's native pinned memory): ACL's codes, once per range.
        buf = torch.empty(8192, dtype=torch.uint8)
        addr = (buf.data_ptr() + 4095) // 4096 * 4096
        assert a.register_host_memory(addr, 4096) is True
        assert torch.npu.npurt().registered() == {addr: 4096}
        assert torch.npu.npurt().npuHostRegister(addr, 16, 0x2) == 107030   # already registered
        a.unregister_host_memory(addr)
        try:
            a.unregister_host_memory(addr)
            raise AssertionError("a second unregister passed")
        except RuntimeError as e:
            assert "rc=107000" in str(e), e
        print("OK")
    """, tmp_path)
    assert out.strip().endswith("OK"), out


def test_npurt_checks_what_it_registers():
    rt = torch.npu.npurt()
    assert rt is torch.npu.npurt()              # one runtime per process
    assert rt.npuHostRegister(0, 64, 0x1) == 100000              # a null address
    assert rt.npuHostRegister(4096, 0, 0x1) == 100000            # an empty range
    assert rt.npuHostRegister(4096, 64, 0x8) == 100000           # an unknown flag
    assert rt.npuHostRegister(4097, 64, 0x2) == 100000           # MAPPED needs 4K alignment
    assert rt.npuHostRegister(4097, 64, 0x1) == 0                # PINNED does not
    assert rt.npuHostRegister(4096, 2, 0x1) == 107030            # overlaps [4097, 4161)
    assert rt.npuHostUnregister(4096) == 107000                  # no registration starts there
    assert rt.npuHostUnregister(4097) == 0 and rt.registered() == {}


@pytest.mark.parametrize("stage,dtype", [(1, "fp32"), (2, "fp32"), (2, "bf16"), (3, "fp32")])
def test_zero_on_two_npus_matches_one_process(stage, dtype, tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               os.path.join(HERE, "deepspeed_zero.py"), str(stage), dtype]
    proc = subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=180)
    out = proc.stdout
    assert proc.returncode == 0, f"--- stdout ---\n{out}\n--- stderr ---\n{proc.stderr[-6000:]}"
    assert out.count(f"zero{stage} {dtype} ") == 2 and out.count(" OK") == 2, out
