"""Quantized npu tensors: torch.quantize_per_tensor / per_channel on the npu.

Each result is compared bit for bit with the same op on the cpu: the integer
representation, the scale and zero point (per channel: the scales and zero points,
which live on the npu, as CUDA's do).
"""
import warnings

import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*:UserWarning")


def same(npu_q, cpu_q):
    assert npu_q.device.type == "npu" and npu_q.is_quantized
    assert npu_q.qscheme() == cpu_q.qscheme() and npu_q.dtype == cpu_q.dtype
    if cpu_q.qscheme() == torch.per_tensor_affine:
        assert (npu_q.q_scale(), npu_q.q_zero_point()) == (cpu_q.q_scale(), cpu_q.q_zero_point())
    else:
        assert npu_q.q_per_channel_scales().device.type == "npu"
        assert torch.equal(npu_q.q_per_channel_scales().cpu(), cpu_q.q_per_channel_scales())
        assert torch.equal(npu_q.q_per_channel_zero_points().cpu(), cpu_q.q_per_channel_zero_points())
        assert npu_q.q_per_channel_axis() == cpu_q.q_per_channel_axis()
    assert torch.equal(npu_q.int_repr().cpu(), cpu_q.int_repr())
    return True


@pytest.fixture
def x():
    return torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dtype", [torch.qint8, torch.quint8, torch.qint32])
def test_quantize_per_tensor_matches_the_cpu(x, dtype):
    q = torch.quantize_per_tensor(x.npu(), 0.03, 5, dtype)
    expected = torch.quantize_per_tensor(x, 0.03, 5, dtype)
    assert same(q, expected)
    assert torch.equal(q.dequantize().cpu(), expected.dequantize())
    assert q.dequantize().device.type == "npu"


def test_quantize_per_channel_keeps_its_parameters_on_the_npu(x):
    scales = torch.tensor([0.02, 0.05, 0.1], dtype=torch.float64)
    zero_points = torch.tensor([0, 3, -2])
    q = torch.quantize_per_channel(x.npu(), scales.npu(), zero_points.npu(), 1, torch.qint8)
    expected = torch.quantize_per_channel(x, scales, zero_points, 1, torch.qint8)
    assert same(q, expected)
    assert torch.equal(q.dequantize().cpu(), expected.dequantize())
    assert same(torch.empty_like(q).copy_(q), expected)


def test_copies_between_devices_keep_the_quantizer(x):
    expected = torch.quantize_per_tensor(x, 0.05, 2, torch.quint8)
    on_npu = expected.npu()
    assert same(on_npu, expected)
    back = on_npu.cpu()
    assert back.device.type == "cpu" and torch.equal(back.int_repr(), expected.int_repr())
    assert back.q_scale() == expected.q_scale()
    assert same(on_npu.to("npu:1"), expected)


def test_views_and_kernels_of_quantized_npu_tensors(x):
    y = torch.randn_like(x) * 2
    qa = torch.quantize_per_tensor(x, 0.05, 0, torch.quint8)
    qb = torch.quantize_per_tensor(y, 0.05, 0, torch.quint8)
    na, nb = qa.npu(), qb.npu()
    assert same(na.permute(0, 2, 3, 1).contiguous(), qa.permute(0, 2, 3, 1).contiguous())
    assert same(na[1:3, :, 2:], qa[1:3, :, 2:])
    assert same(na.flatten(1), qa.flatten(1))
    assert same(torch.ops.quantized.add(na, nb, 0.1, 2), torch.ops.quantized.add(qa, qb, 0.1, 2))
    assert same(torch.relu(na), torch.relu(qa))
    assert same(torch.cat([na, nb], 1), torch.cat([qa, qb], 1))
    assert same(torch.nn.functional.max_pool2d(na, 2), torch.nn.functional.max_pool2d(qa, 2))
    assert same(torch.nn.functional.adaptive_avg_pool2d(na, 2), torch.nn.functional.adaptive_avg_pool2d(qa, 2))
    assert same(na.clone(), qa)
    assert torch.equal(na, na.clone()) and not torch.equal(na, nb)


def test_empty_quantized_factories_and_copy_from_float(x):
    q = torch._empty_affine_quantized([4, 3, 6, 6], scale=0.1, zero_point=10, dtype=torch.quint8, device="npu")
    q.copy_(x.npu())  # quantizes with q's own parameters
    assert same(q, torch.quantize_per_tensor(x, 0.1, 10, torch.quint8))
    assert torch.empty(3, dtype=torch.qint8, device="npu").device.type == "npu"
    assert "quantization_scheme=torch.per_tensor_affine" in repr(q)


def test_quantized_work_runs_in_stream_order(x):
    # The input is written by queued work on a side stream; the quantization waits for it.
    side = torch.npu.Stream()
    base = x.npu()
    with torch.npu.stream(side):
        torch.npu._sleep(50)
        base.mul_(2)
        q = torch.quantize_per_tensor(base, 0.05, 0, torch.qint8)
        deq = q.dequantize()
    side.synchronize()
    assert torch.equal(deq.cpu(), torch.quantize_per_tensor(x * 2, 0.05, 0, torch.qint8).dequantize())


def test_errors_name_the_op_the_device_and_the_remedy(x):
    q = torch.quantize_per_tensor(x.npu(), 0.05, 0, torch.qint8)
    with pytest.raises(RuntimeError, match=r"copy_.*quantized.*dequantize\(\)"):
        torch.empty(x.shape, device="npu").copy_(q)
    per_channel = torch.quantize_per_channel(x, torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.long),
                                             1, torch.qint8)
    with pytest.raises(RuntimeError, match=r"copy_ on npu:0.*different schemes"):
        q.copy_(per_channel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        packed = torch.quantize_per_tensor(torch.rand(4, 4), 0.1, 0, torch.quint4x2)
    with pytest.raises(RuntimeError, match=r"sub-byte quantized tensors.*qint8"):
        packed.npu()
