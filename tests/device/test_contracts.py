"""PyTorch's device-generic contracts, as the npu keeps them.

torch.accelerator's memory API and capabilities, validation of every way a device or a stream reaches the npu, the op registry's
arguments, npu_fusion_attention as an operator, native_dropout's computation,
and npu tensors sent to another process. Each test was written against a
defect seen on an earlier main.
"""
import json

import pytest
import torch
import torch.nn.functional as F

import torch_npu
from helpers import last_line


# ---- torch.accelerator: memory, host memory, capability -----------------------------

def test_accelerator_memory_api_is_torch_npus(clean_npu):
    x = torch.ones(1000, device="npu")
    y = torch.ones(300_000, device="npu")
    assert torch.accelerator.memory_stats() == torch.npu.memory_stats()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == 4096 + 1_200_128
    assert torch.accelerator.memory_allocated() == torch.npu.memory_allocated() == 4096 + 1_200_128
    assert torch.accelerator.memory_reserved() == torch.npu.memory_reserved() > 0
    del y
    assert torch.accelerator.max_memory_allocated() == torch.npu.max_memory_allocated() == 4096 + 1_200_128
    torch.accelerator.reset_peak_memory_stats()
    assert torch.npu.max_memory_allocated() == torch.accelerator.memory_allocated() == 4096
    assert torch.accelerator.memory_stats()["allocation.all.allocated"] >= 2
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.npu.memory_stats()["allocation.all.allocated"] == 0
    reserved = torch.accelerator.memory_reserved()
    torch.accelerator.empty_cache()   # gives back the large segment y used
    assert torch.npu.memory_reserved() < reserved
    assert torch.accelerator.get_memory_info() == torch.npu.mem_get_info()
    assert torch.accelerator.memory_allocated(torch.device("npu", 0)) == 4096
    del x


@pytest.mark.parametrize("index", [1, 2])
def test_accelerator_memory_of_another_device_is_that_devices(index, clean_npu):
    from conftest import NUM_DEVICES
    if index >= NUM_DEVICES:
        with pytest.raises(RuntimeError, match=f"invalid device: npu:{index} "):
            torch.accelerator.memory_allocated(index)
        return
    x = torch.ones(256, device=f"npu:{index}")
    assert torch.accelerator.memory_allocated(index) == 1024 == torch.npu.memory_allocated(index)
    assert torch.accelerator.memory_allocated(0) == torch.npu.memory_allocated(0)
    del x


@pytest.mark.child_process
def test_empty_host_cache_after_pinned_copies(run_python):
    code = r"""
import torch
torch.accelerator.empty_host_cache()
host = torch.ones(1 << 16).pin_memory()
dev = host.to("npu", non_blocking=True)
torch.accelerator.empty_host_cache()
del host
torch.npu.synchronize()
torch.accelerator.empty_host_cache()
print(dev.sum().item())
"""
    assert last_line(run_python(code)) == str(float(1 << 16))


def test_device_capability_lists_the_dtypes_the_npu_computes_in():
    supported = torch.accelerator.get_device_capability()["supported_dtypes"]
    assert {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64} <= supported
    assert torch.float64 not in supported and torch.complex128 not in supported  # they take the cpu fallback
    assert torch.accelerator.get_device_capability(torch.device("npu", 0)) == {"supported_dtypes": supported}


# ---- devices and streams are validated wherever they come in ---------------------------

@pytest.mark.parametrize("device", ["npu:1000", "npu:128", "npu:64", torch.device("npu", 200)])
def test_factories_refuse_devices_that_do_not_exist(device):
    with pytest.raises(RuntimeError, match=r"invalid device: npu:-?\d+ is not an npu device: there are \d+ npu"):
        torch.ones(2, device=device)
    with pytest.raises(RuntimeError, match="invalid device"):
        torch.ones(2).to(device)
    assert torch.ones(1, device="npu").device == torch.device("npu", 0)


def test_wrapped_indices_are_explained():
    with pytest.raises(RuntimeError, match="wraps around to a negative one in torch.device"):
        torch.zeros(1, device="npu:1000")


@pytest.mark.parametrize("index", [256, 999, -2])
def test_streams_refuse_devices_that_do_not_exist(index):
    with pytest.raises(RuntimeError, match=f"invalid device: npu:{index} "):
        torch.npu.Stream(device=index)
    device_type = torch.npu.current_stream().device_type
    with pytest.raises(RuntimeError, match=f"invalid device: npu:{index} "):
        torch.npu.Stream(stream_id=torch.npu.current_stream().stream_id, device_index=index, device_type=device_type)


def test_wrapping_a_stream_checks_that_it_exists():
    current = torch.npu.current_stream()
    same = torch.npu.Stream(stream_id=current.stream_id, device_index=0, device_type=current.device_type)
    assert same == current
    with pytest.raises(RuntimeError, match="has no stream 987654"):
        torch.npu.Stream(stream_id=987654, device_index=0, device_type=current.device_type)
    with pytest.raises(ValueError, match="is not the npu's"):
        torch.npu.Stream(stream_id=current.stream_id, device_index=0, device_type=0)  # a cpu stream id


# ---- the op registry --------------------------------------------------------------------

@pytest.mark.parametrize("bad", [None, 3, ["add"], torch.add])
def test_registry_refuses_names_that_are_no_strings(bad):
    registry = torch_npu.ops.registry
    for ask in (registry.get, registry.contains, registry.backends_for_op):
        with pytest.raises(TypeError, match="name=") as raised:
            ask(bad)
        assert "torch_npu/ops/registry" not in str(raised.value)


@pytest.mark.child_process
def test_the_documented_private_paths_are_the_new_modules(run_python):
    """torch_npu._ops_registry (the README's name, and csrc/dispatch/fallback.cpp's message) is
    torch_npu.ops.registry, and torch_npu._patches is the ledger, torch_npu._core.patches: the
    same module objects, importable first thing in a fresh interpreter."""
    proc = run_python("""
        import importlib
        import torch_npu._ops_registry
        from torch_npu import _patches
        import torch_npu
        assert torch_npu._ops_registry is importlib.import_module("torch_npu.ops.registry")
        assert torch_npu._ops_registry.get("add").backend == "npu"
        assert _patches is importlib.import_module("torch_npu._patches") is torch_npu._core.patches
        print("OK")
    """)
    assert last_line(proc) == "OK"


def test_registry_takes_operator_objects():
    registry = torch_npu.ops.registry
    assert registry.get(torch.ops.aten.add.Tensor) == registry.get("aten::add.Tensor")
    assert registry.get(torch.ops.aten.exp).name == "aten::exp"


# ---- npu_fusion_attention is an operator ---------------------------------------------

def test_npu_fusion_attention_is_an_operator_with_backward_and_fake_tracing():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, requires_grad=True) for _ in range(3))
    qn, kn, vn = (t.detach().npu().requires_grad_() for t in (q, k, v))
    out = torch.ops.npu.npu_fusion_attention(qn, kn, vn, 4, "BNSD", scale=0.25, sparse_mode=2)
    assert len(out) == 7 and isinstance(out[4], int)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)
    torch.testing.assert_close(out[0].detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch_npu.npu_fusion_attention(qn, kn, vn, 4, "BNSD", scale=0.25,
                                                              sparse_mode=2)[0].detach().cpu(), out[0].detach().cpu())
    out[0].sum().backward()
    expected.sum().backward()
    for got, want in ((qn, q), (kn, k), (vn, v)):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-5)
    # fake tensors trace it (torch.compile, export)
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    fq = mode.from_tensor(qn.detach())
    with mode:
        fake = torch.ops.npu.npu_fusion_attention(fq, fq, fq, 4, "BNSD", scale=0.25)
    assert fake[0].shape == (2, 4, 6, 8) and fake[1].shape == (2, 4, 6, 8)
    compiled = torch.compile(lambda a: torch.ops.npu.npu_fusion_attention(a, a, a, 4, "BNSD", scale=0.25)[0],
                             backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(qn.detach()).cpu(),
                               torch_npu.npu_fusion_attention(qn.detach(), qn.detach(), qn.detach(), 4, "BNSD",
                                                              scale=0.25)[0].cpu())
    with pytest.raises(ValueError, match="input_layout must be one of"):
        torch.ops.npu.npu_fusion_attention(qn, kn, vn, 4, "NSD")


# ---- dropout on the npu computes what the cpu's computes ---------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_native_dropout_masks_and_scales_as_the_cpu(dtype):
    x = torch.randn(64, 64).to(dtype)
    torch.npu.manual_seed(5)
    out, mask = torch.ops.aten.native_dropout(x.npu(), 0.25, True)
    out, mask = out.cpu(), mask.cpu()
    assert mask.dtype == torch.bool and 0.6 < mask.float().mean().item() < 0.9
    torch.testing.assert_close(out, x.mul(mask).mul_(1 / 0.75))   # ATen's composition, on the cpu
    plain, ones = torch.ops.aten.native_dropout(x.npu(), 0.25, False)
    assert torch.equal(plain.cpu(), x) and bool(ones.cpu().all())
    o0, o1 = torch.empty(0, dtype=dtype, device="npu"), torch.empty(0, dtype=torch.bool, device="npu")
    torch.npu.manual_seed(5)
    torch.ops.aten.native_dropout.out(x.npu(), 0.25, True, out0=o0, out1=o1)
    assert torch.equal(o0.cpu(), out) and torch.equal(o1.cpu(), mask)


def test_random_ops_without_a_generator_argument_are_given_the_npus_draw():
    """Every random aten op (tagged nondeterministic_seeded) whose schema has no Generator
    argument and that the npu runs (natively or through the fallback) gets the npu's draw,
    or draws nothing on the cpu: a new one in a future torch fails here."""
    given = set(torch_npu._C._random_ops_given_the_npu_draw())
    draws_nothing = {
        "aten::_fused_sdp_choice": "picks an attention kernel",
        "aten::_scaled_dot_product_flash_attention_for_cpu": "refuses dropout > 0",
    }
    unhandled = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        base, _, overload = name[6:].partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        if torch.Tag.nondeterministic_seeded not in op.tags:
            continue
        if any(isinstance(a.type, torch._C.OptionalType) and "Generator" in str(a.type) or
               "Generator" == str(a.type) for a in op._schema.arguments):
            continue
        resolved = torch_npu.ops.registry.get(name)
        if resolved.backend not in ("npu", "cpu") or name in given:
            continue
        if name not in draws_nothing:
            unhandled.append(name)
    assert unhandled == []
    assert {"aten::native_dropout", "aten::native_dropout.out", "aten::randperm", "aten::randperm.out"} <= given


# ---- npu tensors and other processes ------------------------------------------------------

SHARE = r"""
import json, time, torch, torch.multiprocessing as mp

def consume(q, answers):
    try:
        answers.put(("item", str(q.get(timeout=60))))
    except Exception as e:
        answers.put((type(e).__name__, str(e)))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q, answers = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consume, args=(q, answers))
    p.start()
    q.put(torch.ones(3, device="npu"))
    consumer = answers.get(timeout=60)
    p.join(timeout=60)
    out = {"consumer": consumer}
    try:
        ctx.SimpleQueue().put(torch.nn.Parameter(torch.ones(2, device="npu")))
        out["producer"] = None
    except RuntimeError as e:
        out["producer"] = str(e)
    q.put(torch.ones(2))      # cpu tensors are shared as before
    out["cpu"] = q.get(timeout=60).tolist()
    print(json.dumps(out))
"""


@pytest.mark.child_process
def test_npu_tensors_sent_by_a_hal_that_cannot_share_raise_and_nothing_hangs(run_python, tmp_path):
    """A HAL without interprocess memory (the emulator under NPU_EMU_PROTECT=1): a clear
    error in the sender, or from the receiver's get() for a Queue (tests/device/test_ipc.py: sharing)."""
    script = tmp_path / "share.py"
    script.write_text(SHARE)
    proc = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", timeout=180,
                      env={"NPU_EMU_PROTECT": "1"})
    out = json.loads(last_line(proc))
    kind, message = out["consumer"]
    assert kind == "NpuSharingError" and ".cpu()" in message and "not supported by HAL" in message, message
    assert "sending an npu tensor to another process" in message and "npu:0" in message
    assert out["producer"] is not None and ".cpu()" in out["producer"]
    assert out["cpu"] == [1.0, 1.0]


def test_native_dropout_mask_keeps_the_inputs_layout():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    out, mask = torch.ops.aten.native_dropout(x.npu(), 0.5, True)
    cpu_out, cpu_mask = torch.ops.aten.native_dropout(x, 0.5, True)
    assert mask.stride() == cpu_mask.stride() and out.stride() == cpu_out.stride()
    torch.testing.assert_close(out.cpu(), x * mask.cpu() * 2)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_native_dropout_of_a_nested_tensor_drops_its_buffer_with_the_npus_draw():
    nested = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)]).npu()

    def drop(cpu_seed):
        torch.npu.manual_seed(1)
        torch.random.default_generator.manual_seed(cpu_seed)
        out, mask = torch.ops.aten.native_dropout(nested, 0.5, True)
        return [t.cpu() for t in out.unbind()], [t.cpu() for t in mask.unbind()]

    (out1, mask1), (out2, _) = drop(1), drop(2)
    assert all(torch.equal(a, b) for a, b in zip(out1, out2))
    assert [t.shape for t in out1] == [(2, 3), (4, 3)]
    assert all(torch.equal(o, m.float() * 2) for o, m in zip(out1, mask1))


# ---- autograd on the npu's own thread, as on CUDA --------------------------------------

def test_backward_runs_on_the_npus_autograd_thread():
    import threading
    seen = []
    x = torch.ones(4, device="npu", requires_grad=True)
    y = x * 2
    y.register_hook(lambda grad: seen.append(threading.get_ident()))
    y.sum().backward()
    assert seen and seen[0] != threading.get_ident()   # PyTorch's device thread, not the caller
    assert x.grad.cpu().tolist() == [2.0] * 4


EXIT_AFTER_BACKWARD = r"""
import torch
m = torch.nn.Linear(64, 64).npu()
x = torch.randn(32, 64, device="npu")
for _ in range(3):
    m(x).sum().backward()
"""


@pytest.mark.child_process
def test_the_process_exits_cleanly_right_after_a_backward(run_python):
    # Without draining the npu's autograd thread at exit, about one exit in three aborted.
    for _ in range(8):   # one device: the race shows most often there
        proc = run_python(EXIT_AFTER_BACKWARD, env={"NPU_EMU_DEVICES": "1"}, check=False)
        assert proc.returncode == 0 and "terminate called" not in proc.stderr, proc.stderr[-500:]
