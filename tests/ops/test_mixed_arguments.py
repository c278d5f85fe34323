"""Arguments that mix devices, dtypes and memory: what CUDA raises, the npu
raises; what the cpu computes, the npu computes; nothing is silently dropped.

Each test is a regression test of a silent wrong result found by running
real model code (tied weights, scalar writes, fallback device checks, dtype
promotion on the fast path, overlapping arguments through the fallback).
"""
import pytest
import torch
import torch_npu

from conftest import requires_two_devices

SAME_DEVICE = "Expected all tensors to be on the same device"


@pytest.fixture
def error_mode():
    torch_npu.set_fallback_mode("error")
    yield
    torch_npu.set_fallback_mode("auto")


# ---- tied parameters ----------------------------------------------------------


def test_shallow_copy_type_is_compatible_between_cpu_and_npu():
    cpu, npu = torch.zeros(2), torch.zeros(2, device="npu")
    assert torch._has_compatible_shallow_copy_type(cpu, npu)
    assert torch._has_compatible_shallow_copy_type(npu, cpu)
    assert torch._has_compatible_shallow_copy_type(npu, npu)
    assert not torch._has_compatible_shallow_copy_type(npu, cpu.to_sparse())


def test_module_to_npu_keeps_tied_parameters():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    param = emb.weight
    model.to("npu")
    assert model["head"].weight is model["emb"].weight
    assert model["emb"].weight is param  # the same Parameter object, as on CUDA
    assert param.device.type == "npu"
    model.to("cpu")
    assert model["head"].weight is model["emb"].weight and param.device.type == "cpu"


def test_tied_weights_train_like_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Embedding(12, 6), torch.nn.Linear(6, 12, bias=False))
    cpu[1].weight = cpu[0].weight
    npu = torch.nn.Sequential(torch.nn.Embedding(12, 6), torch.nn.Linear(6, 12, bias=False))
    npu[1].weight = npu[0].weight
    npu.load_state_dict(cpu.state_dict())
    npu.to("npu")
    ids = torch.randint(0, 12, (3, 5))
    for model, dev in ((cpu, "cpu"), (npu, "npu")):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            logits = model(ids.to(dev))
            torch.nn.functional.cross_entropy(logits.reshape(-1, 12), ids.reshape(-1).to(dev)).backward()
            opt.step()
    assert npu[1].weight is npu[0].weight
    torch.testing.assert_close(npu[0].weight.grad.cpu(), cpu[0].weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(npu[0].weight.detach().cpu(), cpu[0].weight.detach(), rtol=1e-5, atol=1e-6)


def test_param_data_assignment_across_devices():
    p = torch.nn.Parameter(torch.ones(3))
    p.data = torch.full((3,), 2.0, device="npu")
    assert isinstance(p, torch.nn.Parameter) and p.device.type == "npu"
    assert p.cpu().tolist() == [2.0, 2.0, 2.0]


# ---- a cpu tensor never silently receives (or loses) an npu result --------------


@pytest.mark.parametrize(
    "write",
    [
        lambda s, v: s.add_(v),
        lambda s, v: s.mul_(v),
        lambda s, v: s.clamp_(max=v),
        lambda s, v: s.sub_(v),
        lambda s, v: torch.add(v, v, out=s),
    ],
    ids=["add_", "mul_", "clamp_", "sub_", "add_out"],
)
def test_cpu_scalar_written_by_npu_op_raises(write):
    s = torch.tensor(5.0)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        write(s, torch.tensor(2.0, device="npu"))
    assert s.item() == 5.0


def test_cpu_scalar_still_read_by_npu_ops():
    x = torch.arange(3.0, device="npu")
    torch.testing.assert_close((x * torch.tensor(2.0)).cpu(), torch.arange(3.0) * 2)
    torch.testing.assert_close(x.add_(torch.tensor(1.0)).cpu(), torch.arange(3.0) + 1)


def test_copy_into_cpu_scalar_from_npu_still_works():
    s = torch.tensor(5.0)
    s.copy_(torch.tensor(2.0, device="npu"))
    assert s.item() == 2.0


# ---- the CPU fallback checks devices like the native path ------------------------


def test_fallback_rejects_cpu_tensor():
    a = torch.ones(3, dtype=torch.float64, device="npu")
    with pytest.raises(RuntimeError, match=SAME_DEVICE + ".*aten::atan2.*'other'"):
        torch.atan2(a, torch.ones(3, dtype=torch.float64))


def test_fallback_device_error_comes_before_the_mode(error_mode):
    a = torch.ones(3, dtype=torch.float64, device="npu")
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.atan2(a, torch.ones(3, dtype=torch.float64))


@requires_two_devices
def test_fallback_rejects_two_npu_devices():
    a = torch.ones(3, dtype=torch.float64, device="npu:0")
    b = torch.ones(3, dtype=torch.float64, device="npu:1")
    with pytest.raises(RuntimeError, match=SAME_DEVICE + ".*npu:0 and npu:1"):
        torch.atan2(a, b)
    with pytest.raises(RuntimeError, match=SAME_DEVICE + ".*npu:0 and npu:1"):
        torch.atan2(a.float(), b.float())


def test_conv2d_rejects_cpu_weight():
    x = torch.ones(1, 1, 4, 4, device="npu")
    with pytest.raises(RuntimeError, match=SAME_DEVICE + ".*'weight'"):
        torch.nn.functional.conv2d(x, torch.ones(1, 1, 2, 2))
    with pytest.raises(RuntimeError, match=SAME_DEVICE + ".*'weight'"):
        torch.nn.functional.conv2d(x.double(), torch.ones(1, 1, 2, 2, dtype=torch.float64))


def test_cpu_indices_still_index_npu_tensors():
    x = torch.arange(6.0, device="npu")
    idx = torch.tensor([0, 4])
    assert x[idx].cpu().tolist() == [0.0, 4.0]
    x.double()[idx]  # through the fallback too
    x.index_put_((idx,), torch.tensor(9.0))
    assert x.cpu().tolist() == [9.0, 1.0, 2.0, 3.0, 9.0, 5.0]


# ---- the fast path checks every operand's dtype and the result's ----------------


def test_complex_scalar_promotes_like_cpu():
    x = torch.arange(3.0)
    for scalar in (torch.tensor(1j), 1j):
        out = x.npu() * scalar
        assert out.dtype == torch.complex64
        torch.testing.assert_close(out.cpu(), x * scalar)


def test_promoting_cpu_scalar_falls_back(error_mode):
    x = torch.ones(3, device="npu")
    with pytest.raises(NotImplementedError, match="aten::mul.Tensor.*ComplexFloat"):
        x * torch.tensor(1j)
    with pytest.raises(NotImplementedError, match="aten::add.Tensor.*Double"):
        torch.ones(3, dtype=torch.int32, device="npu") + torch.tensor(1.5, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="ComplexDouble"):
        x * 1j
    # A wrapped Python float keeps a float32 op native.
    assert (x * 2.5).cpu().tolist() == [2.5, 2.5, 2.5]


def test_fallback_counts_promoted_ops():
    torch_npu.NPUFallbackMode.reset_fallback_stats()
    out = torch.ones(3, dtype=torch.int32, device="npu") + torch.tensor(1.5, dtype=torch.float64)
    assert out.dtype == torch.float64 and out.cpu().tolist() == [2.5] * 3
    assert "aten::add.Tensor" in torch_npu.NPUFallbackMode.get_fallback_stats()


# ---- aliasing between arguments survives the fallback ---------------------------


def test_internal_overlap_raises_through_fallback():
    a = torch.ones(3, dtype=torch.float64, device="npu")
    with pytest.raises(RuntimeError, match="single memory location"):
        a.add_(a[0])
    assert a.cpu().tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("op", ["add_", "sub_", "mul_", "div_"])
def test_internal_overlap_raises_on_the_native_fast_path(op):
    # float32: the npu's own in-place kernel, whose aliases of one storage share one
    # CPU storage, so ATen's overlap check sees what it sees on the cpu.
    a = torch.arange(1.0, 17.0).reshape(4, 4).npu()
    with pytest.raises(RuntimeError, match="single memory location"):
        getattr(a, op)(a[0])
    assert a.cpu().tolist() == torch.arange(1.0, 17.0).reshape(4, 4).tolist()
    b, expected = a.clone(), a.cpu()
    getattr(b, op)(b[0].clone())                      # no overlap: computes as on the cpu
    torch.testing.assert_close(b.cpu(), getattr(expected, op)(expected[0].clone()))


def test_overlapping_arguments_compute_like_cpu():
    base = torch.arange(8.0, dtype=torch.float64)
    npu = base.npu()
    # Views of one storage, the output one of the inputs: the result must match the cpu's.
    torch.atan2(base[0:4], base[4:8], out=base[0:4])
    torch.atan2(npu[0:4], npu[4:8], out=npu[0:4])
    torch.testing.assert_close(npu.cpu(), base)


def test_conjugate_view_sharing_memory_through_fallback():
    z = torch.fft.fft(torch.randn(6))
    zn = z.npu()
    # complex mul takes the fallback; both arguments share one storage, one lazily conjugated
    torch.testing.assert_close((zn * zn.conj()).cpu(), z * z.conj())


def test_mixed_dtype_ops_read_their_inputs_in_stream_order(run_python):
    # Every kernel queued (NPU_EMU_ALWAYS_ENQUEUE=1): an op whose inputs are converted
    # to the promoted dtype reads them after the queued work wrote them, as on a device.
    run_python("""
        import torch, torch_npu
        for case in ("half_times_float", "int_true_divide", "scalar_promotes", "in_place_half_into_float"):
            x = torch.zeros(1000, device="npu", dtype=torch.int64 if case == "int_true_divide" else torch.float16)
            torch.npu._sleep(20)
            x.fill_(3)                                  # queued behind the sleep
            if case == "half_times_float":
                y = x * torch.ones(1000, device="npu")
            elif case == "int_true_divide":
                y = x / torch.ones(1000, device="npu", dtype=torch.int64)
            elif case == "scalar_promotes":
                y = x[0] + torch.tensor(0.0)            # 0-dim float16 npu + 0-dim float32 cpu: float32
            else:
                y = torch.ones(1000, device="npu")
                y.mul_(x)
            assert y.dtype == torch.float32, (case, y.dtype)
            assert (y.cpu() == 3).all(), case
    """, env={"NPU_EMU_ALWAYS_ENQUEUE": "1"})
